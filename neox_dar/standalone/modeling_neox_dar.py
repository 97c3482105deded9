"""neox-dar models in transformers (``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)``): the
GPT-NeoX, Llama, OLMo-2, Qwen2 and Qwen3 blocks with neox-dar's attention variants (DAR, uniform, SWA, MSWA, AHA,
linear attention, DimPO; one type per layer), for inference.

``python -m neox_dar.convert to-hf`` copies this file beside ``config.json`` (whose ``auto_map`` names the classes
here) with the rest of :mod:`neox_dar.standalone`; it needs torch and transformers only. Each layer's attention is
the class of its type (:data:`~.layer_types.LAYER_TYPES`, one module per type: its parameters, cache and decode
step), the classes neox-dar's own attention modules subclass. Parameter names are neox-dar's: each family's Hugging Face names plus the
variants' ``dar_down``, ``dar_up``, ``router``, ``feature_q``, ``feature_k``, ``dimpo_proj``.

Every forward runs through the layer types' inference caches (the code ``neox_dar.generate`` decodes with): a prompt
is written into empty caches and attended in one chunk (explicit masks: O(T^2) scores for T prompt tokens), and
``generate()`` then feeds one token per step, each layer reading only what its cache keeps (DAR: the window's keys
and values and ``dar_down(h)`` of every token; SWA and MSWA: each key/value head's window; AHA: the window, and the
whole cache for the heads the router sends to full attention; linear attention: its fixed state). Batches must be
left-padded (``attention_mask`` zeros on the left, transformers' padding for decoder-only generation). Beam search
is not supported (the caches do not reorder rows). Training belongs to neox-dar.
"""

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .attention import AttentionLayer
from .block import BlockShape
from .cache import Layout, ModelCache
from .configuration_neox_dar import NeoxDarConfig
from .decoder import DecoderLayer, DecoderStack, build_mlp
from .layer_types import LAYER_TYPES
from .norms import make_norm
from .rotary import rotary_table


def _norm(block: BlockShape, width: int, rms: bool = False) -> nn.Module:
    """The family's norm over ``width`` features (``rms``: the query/key norms, RMSNorms in every family)."""
    return make_norm(rms or block.norm == "rmsnorm", width, block.norm_eps, block.rms_weight_in_float32)


def attention_layer(config: NeoxDarConfig, spec: dict) -> AttentionLayer:
    """One layer's attention: the class of its type (``spec``, an entry of ``config.neox_dar_layers``) with the
    family's projections and the type's parameters."""
    block = config.block
    args = dict(spec)
    kind = args.pop("type")
    if kind not in LAYER_TYPES:
        raise ValueError(f"neox_dar_layers: unknown attention type {kind!r}")
    layer = LAYER_TYPES[kind]()
    layer.build_projections(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                            config.head_dim, block.fused_qkv, block.qkv_bias, block.attention_out_bias,
                            block.qk_norm, lambda width: _norm(block, width, rms=True))
    layer.rotary_ndims = block.rotary_ndims
    layer.build_variant(**args)
    return layer


class NeoxDarBlock(DecoderLayer):
    """One decoder layer: the family's norms and MLP, the attention of the layer's entry ``spec`` of
    ``neox_dar_layers``."""

    def __init__(self, config: NeoxDarConfig, spec: dict):
        super().__init__()
        block = config.block
        self.build_layer(lambda: _norm(block, config.hidden_size), block.names.attention,
                         attention_layer(config, spec),
                         build_mlp(block.activation, config.hidden_size, config.intermediate_size, block.mlp_bias),
                         post_norm=block.norm_position == "post", parallel=block.parallel_residual)


class NeoxDarModel(DecoderStack):
    """Embedding, layers and final norm, named as ``neox_dar_block``'s ``names`` say; :meth:`decode` runs tokens through
    the caches."""

    def __init__(self, config: NeoxDarConfig):
        super().__init__()
        block = config.block
        self.build_decoder(block.names.embed, nn.Embedding(config.vocab_size, config.hidden_size),
                           (NeoxDarBlock(config, spec) for spec in config.neox_dar_layers),
                           block.names.final_norm, _norm(block, config.hidden_size))


CACHE_NAME = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
"""The installed transformers' name for the caches a forward takes and returns: ``cache`` (recent transformers 5
releases, whose ``generate()`` hands them back under it only) or ``past_key_values``. :class:`NeoxDarForCausalLM`
takes either and returns them under this one."""


class NeoxDarForCausalLM(PreTrainedModel, GenerationMixin):
    """``forward(input_ids, attention_mask=None, cache=None)`` -> logits of the new tokens, and the caches (a
    :class:`ModelCache` that ``generate()`` hands back at every step), under :data:`CACHE_NAME`; the caches may
    also be given as ``past_key_values`` (older transformers' name)."""

    config_class = NeoxDarConfig
    base_model_prefix = "neox_dar"
    _no_split_modules = ["NeoxDarBlock"]

    def __init__(self, config: NeoxDarConfig):
        super().__init__(config)
        names = config.block.names
        self.decoder_name, self.head_name = names.decoder, names.head
        self.add_module(self.decoder_name, NeoxDarModel(config))
        self.add_module(self.head_name, nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        if config.tie_word_embeddings:
            decoder = getattr(self, self.decoder_name)
            self._tied_weights_keys = {f"{self.head_name}.weight": f"{self.decoder_name}.{decoder.embed_name}.weight"}
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the layer types' own caches, made by forward

    def get_input_embeddings(self) -> nn.Embedding:
        return getattr(self, self.decoder_name).embed

    def get_output_embeddings(self) -> nn.Linear:
        return getattr(self, self.head_name)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=getattr(self.config, "initializer_range", 0.02))
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def new_cache(self, attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> ModelCache:
        """Empty caches for the rows of ``input_ids`` (B, T), left-padded as ``attention_mask`` says."""
        B, T = input_ids.shape
        device, dtype = input_ids.device, self.get_output_embeddings().weight.dtype
        starts = [0] * B
        if attention_mask is not None:
            mask = attention_mask[:, -T:].bool()
            starts = (T - mask.sum(1)).tolist()
            left_padded = torch.arange(T, device=device)[None] >= torch.tensor(starts, device=device)[:, None]
            if not torch.equal(mask, left_padded):
                raise ValueError("neox_dar models take left-padded batches: attention_mask zeros on the left only "
                                 "(tokenizer.padding_side = 'left')")
        block = self.config.block
        scaling = None if block.rope_scaling is None else SimpleNamespace(**block.rope_scaling)
        table = torch.float32 if block.rotary_in_float32 else dtype
        layout = Layout(starts, None, lambda n: rotary_table(block.rotary_ndims, block.rope_theta, scaling, n, table,
                                                             device), device)
        decoder = getattr(self, self.decoder_name)
        return ModelCache(layout, [layer.attn.new_cache(layout, device, dtype) for layer in decoder.layers])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache: ModelCache | None = None, use_cache: bool | None = None, labels: torch.Tensor | None = None,
                return_dict: bool | None = None, past_key_values: ModelCache | None = None,
                **kwargs) -> CausalLMOutputWithPast:
        """Logits (B, T, V) of ``input_ids`` (B, T), the tokens after those in ``cache`` (or ``past_key_values``;
        none: a new batch, left-padded per ``attention_mask``); ``labels``: the mean next-token cross-entropy (-100
        ignored)."""
        cache = cache if cache is not None else past_key_values
        if cache is None:
            cache = self.new_cache(attention_mask, input_ids)
        logits = self.get_output_embeddings()(getattr(self, self.decoder_name).decode(input_ids, cache))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        use_cache = getattr(self.config, "use_cache", True) if use_cache is None else use_cache
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_NAME: cache if use_cache else None})

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, cache: ModelCache | None = None,
                                      attention_mask: torch.Tensor | None = None,
                                      past_key_values: ModelCache | None = None, **kwargs) -> dict:
        """The tokens the caches do not hold yet (all of them at the first step), with the caches ``generate()``
        handed back (under either name)."""
        cache = cache if cache is not None else past_key_values
        if cache is not None:
            input_ids = input_ids[:, cache.layout.length:]
        return {"input_ids": input_ids, "attention_mask": attention_mask, CACHE_NAME: cache, "use_cache": True}
