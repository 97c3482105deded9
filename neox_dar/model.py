"""The language model, readable top to bottom: one decoder for the GPT-NeoX (Pythia), Llama, OLMo-2 and Qwen blocks.

What differs between the families is a handful of config keys (:class:`~neox_dar.config.ModelConfig`): LayerNorm or
RMSNorm, parallel or sequential residual, a norm before or after each sub-layer, GeLU or SwiGLU MLP, fused or
separate query/key/value projections, grouped-query attention, query/key norms, biases, partial rotary, tied
embeddings. Module names are each Hugging Face class's own (the family's record, :mod:`neox_dar.families`), so
checkpoints convert by renaming nothing: ``gpt_neox.layers.{l}.attention.query_key_value`` in GPT-NeoX,
``model.layers.{l}.self_attn.q_proj`` in Llama.

    model = build_model(cfg.model)
    logits = model(input_ids)          # (B, T) -> (B, T, padded_vocab_size)
    lm_loss = model(input_ids, targets)  # targets (B, T), -100 where nothing counts -> mean cross-entropy, no logits
    loss = lm_loss + model.aux_loss()  # variants' extra loss terms (AHA's L1), 0 for the others
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import torch
from torch import nn

from .attention import Attention, RotaryEmbedding, build_attention
from .config import ModelConfig
from .families import FAMILIES
from .loss import IGNORE, chunk_rows, linear_cross_entropy_sum, linear_token_nll, module_cross_entropy
from .norms import build_norm
from .standalone.cache import Layout, ModelCache
from .standalone.decoder import DecoderLayer, DecoderStack, build_mlp
from .standalone.norms import RMSNorm


class Block(DecoderLayer):
    """One decoder layer (:class:`~neox_dar.standalone.decoder.DecoderLayer`: the names, the wiring and the decode
    step): the family's norms, the layer's attention variant, the MLP, ``hidden_dropout`` on each branch."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.build_layer(lambda: build_norm(cfg), FAMILIES[cfg.model_family].names.attention,
                         build_attention(cfg, layer_idx),
                         build_mlp(cfg.activation, cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias),
                         post_norm=cfg.norm_position == "post", parallel=cfg.gpt_j_residual,
                         dropout=nn.Dropout(cfg.hidden_dropout))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attention = self.attn
        return self.residual(x, lambda a: attention(a, cos, sin))

    def prefill(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, rows: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` on prompts, filling ``rows`` of the layer's ``cache`` (:meth:`Attention.prefill`)."""
        return self.residual(x, lambda a: self.attn.prefill(a, cos, sin, cache, rows))


class Decoder(DecoderStack):
    """Embedding, layers and final norm (:class:`~neox_dar.standalone.decoder.DecoderStack`: the names and the decode
    step through the caches); ``input_ids`` (B, T) -> hidden states (B, T, d)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        names = FAMILIES[cfg.model_family].names
        self.build_decoder(names.embed, nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size),
                           (Block(cfg, i) for i in range(cfg.num_layers)), names.final_norm, build_norm(cfg),
                           dropout=nn.Dropout(cfg.hidden_dropout))
        self.rotary_emb = RotaryEmbedding(cfg.rotary_ndims, cfg.rotary_emb_base, cfg.rope_scaling,
                                          FAMILIES[cfg.model_family].rotary_in_float32)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.embed(input_ids))
        cos, sin = self.rotary_emb(input_ids.shape[1], x.dtype, x.device)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.final_norm(x)

    def prefill(self, input_ids: torch.Tensor, cache: ModelCache, rows: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` on prompts of one length (n, T), filling ``rows`` of every layer's cache -> (n, T, d)."""
        x = self.dropout(self.embed(input_ids))
        cos, sin = self.rotary_emb(input_ids.shape[1], x.dtype, x.device)
        for layer, layer_cache in zip(self.layers, cache.layers):
            x = layer.prefill(x, cos, sin, layer_cache, rows)
        return self.final_norm(x)


class OutputLayer(nn.Linear):
    """The output layer, a bias-free ``nn.Linear`` (weight (V, d)): ``forward(hidden (..., d)) -> logits (..., V)``;
    given ``targets`` (...) (-100 where nothing counts) the cross-entropy instead, straight from the hidden states
    chunk by chunk, never every position's logits (:mod:`neox_dar.loss`): ``reduction="sum"`` a float32 scalar
    (differentiable, fused linear + cross-entropy), ``"none"`` per position (...) float32 (no gradient). It is called
    as a module either way, so ZeRO-3 gathers its weight as for the logits."""

    def __init__(self, hidden_size: int, vocab_size: int):
        super().__init__(hidden_size, vocab_size, bias=False)

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None, reduction: str = "sum"
                ) -> torch.Tensor:
        if targets is None:
            return super().forward(hidden)
        if reduction == "sum":
            return linear_cross_entropy_sum(hidden, self.weight, targets)
        if reduction == "none":
            return linear_token_nll(hidden, self.weight, targets)
        raise ValueError(f"reduction must be 'sum' or 'none', got {reduction!r}")


class CausalLM(nn.Module):
    """``*ForCausalLM``-shaped model: ``forward(input_ids[B,T]) -> logits[B,T,V]``. The decoder is ``gpt_neox``
    and the head ``embed_out`` in GPT-NeoX, ``model`` and ``lm_head`` in Llama; a tied head shares the input
    embedding's weight."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        names = FAMILIES[cfg.model_family].names
        self.decoder_name, self.head_name = names.decoder, names.head
        self.add_module(self.decoder_name, Decoder(cfg))
        self.add_module(self.head_name, OutputLayer(cfg.hidden_size, cfg.padded_vocab_size))
        self.tie_weights()

    @property
    def decoder(self) -> Decoder:
        return getattr(self, self.decoder_name)

    @property
    def head(self) -> OutputLayer:
        return getattr(self, self.head_name)

    @property
    def tied_keys(self) -> tuple[str, ...]:
        """State-dict keys that are the same tensor as another (the tied head): not saved, re-tied on load."""
        return () if self.cfg.no_weight_tying else (f"{self.head_name}.weight",)

    def tie_weights(self) -> None:
        """Make the head share the input embedding's weight when the config ties them (also after loading)."""
        if not self.cfg.no_weight_tying:
            self.head.weight = self.decoder.embed.weight

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor | None = None,
                reduction: str = "mean") -> torch.Tensor:
        """``input_ids`` (B, T) -> logits (B, T, V) in the model's dtype. Given next-token ``targets`` (B, T) (-100:
        not counted, e.g. an SFT prompt) the loss instead, computed without the logits (:class:`OutputLayer`):
        ``reduction="mean"`` the mean cross-entropy over the counted targets (float32 scalar, 0 when none counts;
        what training minimises), ``"sum"`` their sum, ``"none"`` per position (B, T) float32, 0 where not counted
        (evaluation; no gradient). Equal within float rounding to ``F.cross_entropy`` of the logits in float32."""
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        hidden = self.decoder(input_ids)
        if targets is None:
            return self.head(hidden)
        per = "none" if reduction == "none" else "sum"
        if isinstance(self.head, OutputLayer):
            loss = self.head(hidden, targets, per)
        else:  # a LoRA adapter wraps the output layer: chunks through the module itself
            loss = module_cross_entropy(self.head, hidden, targets, per, chunk_rows(self.cfg.padded_vocab_size))
        return loss / (targets != IGNORE).sum().clamp(min=1) if reduction == "mean" else loss

    # ---- inference with caches (docs/inference.md) -----------------------------------------------------------
    def new_cache(self, prompt_lengths: Sequence[int], max_new_tokens: int, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> ModelCache:
        """Empty caches for a batch of prompts of these lengths, each to be continued by up to ``max_new_tokens``
        tokens. Prompts sit right-aligned in ``max(prompt_lengths) + max_new_tokens`` cache columns (left padding,
        never read); each row's positions start at 0 at its first token."""
        device = device or self.head.weight.device
        dtype = dtype or self.head.weight.dtype
        longest = max(prompt_lengths)
        layout = Layout([longest - n for n in prompt_lengths], longest + max_new_tokens,
                        lambda n: self.decoder.rotary_emb(n, dtype, device), device)
        return ModelCache(layout, [m.new_cache(layout, device, dtype) for m in self.attention_modules()])

    def prefill(self, prompts: Sequence[torch.Tensor], cache: ModelCache,
                on_group: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Run the prompts (1-D token ids, in the order of :meth:`new_cache`'s lengths) through the training forward
        (``attention_impl``'s path), prompts of equal length together and without padding, filling the caches ->
        the logits of each prompt's last token (B, V). ``on_group(rows)`` is called after each group's forward
        (while the attention modules hold its statistics)."""
        layout = cache.layout
        longest = max(p.numel() for p in prompts)
        if layout.length or [longest - p.numel() for p in prompts] != layout.starts:
            raise ValueError("prefill needs the empty cache that new_cache made for these prompts' lengths")
        logits = self.head.weight.new_empty(len(prompts), self.head.out_features)
        by_length: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            by_length.setdefault(p.numel(), []).append(i)
        for rows in by_length.values():
            ids = torch.stack([prompts[i] for i in rows]).to(self.head.weight.device)
            index = torch.tensor(rows, device=layout.device)
            logits[index] = self.head(self.decoder.prefill(ids, cache, index)[:, -1])
            if on_group is not None:
                on_group(index)
        layout.advance(longest)
        return logits

    def decode(self, input_ids: torch.Tensor, cache: ModelCache) -> torch.Tensor:
        """The next tokens (B, T) of every row through the caches -> logits (B, T, V)."""
        return self.head(self.decoder.decode(input_ids, cache))

    def attention_modules(self) -> list[Attention]:
        """Each layer's attention module, in layer order (also when the engine wraps the blocks)."""
        return [m for m in self.modules() if isinstance(m, Attention)]

    def aux_loss(self, real: torch.Tensor | None = None) -> torch.Tensor:
        """Sum over layers of the variants' auxiliary loss terms from the last forward (already scaled by their
        coefficients), each the mean of the layer's per-position term over the positions ``real`` (B, T) bool marks
        (a conversation micro-batch's padding left out), or over every position."""
        terms = [m.aux_tokens for m in self.attention_modules() if m.aux_tokens is not None]
        if not terms:
            return torch.zeros((), device=self.head.weight.device)
        if real is None:
            return torch.stack([t.mean() for t in terms]).sum()
        weight = real.to(terms[0].dtype)
        return torch.stack([(t * weight).sum() for t in terms]).sum() / weight.sum().clamp(min=1)

    def attention_stats(self, real: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Per-layer statistics from the last forward, keyed ``layer{l}/{name}`` (a variant's per-head stats); with
        ``real`` (B, T) bool, each averaged over those positions only (from its ``token_stats``)."""
        return {f"layer{m.layer_idx}/{k}": v if real is None else m.token_stats[k][real].float().mean(0)
                for m in self.attention_modules() for k, v in m.stats.items()}

    def weights(self) -> dict[str, torch.Tensor]:
        """The state dict without the tied copies (what a checkpoint stores)."""
        return {k: v for k, v in self.state_dict().items() if k not in self.tied_keys}

    def load_weights(self, state: dict[str, torch.Tensor], strict: bool = True, assign: bool = False):
        """``load_state_dict`` of :meth:`weights`-style tensors (tied copies may be absent), then re-tie. Returns
        ``(missing, unexpected)`` keys, tied ones left out."""
        missing, unexpected = self.load_state_dict(state, strict=False, assign=assign)
        missing = [k for k in missing if k not in self.tied_keys]
        if strict and (missing or unexpected):
            raise RuntimeError(f"weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.tie_weights()
        return missing, unexpected


# ----------------------------------------------------------------------------------------------
# initialisation (GPT-NeoX / Pythia by default; the Llama-family presets use "normal" at 0.02)

OUTPUT_PROJECTIONS = ("attention.dense", "o_proj", "dense_4h_to_h", "down_proj")


def init_std(method: str, cfg: ModelConfig) -> float:
    """``small_init``: sqrt(2 / (5 d)); ``wang_init``: 2 / (L sqrt(d)); ``normal``: init_method_std."""
    d = cfg.hidden_size
    if method == "small_init":
        return math.sqrt(2.0 / (5.0 * d))
    if method == "wang_init":
        return 2.0 / (cfg.num_layers * math.sqrt(d))
    return cfg.init_method_std


def init_weights(model: CausalLM, cfg: ModelConfig, only: set[str] | None = None) -> None:
    """Output projections of each residual branch (``dense``/``o_proj``, ``dense_4h_to_h``/``down_proj``) use
    ``output_layer_init_method``; every other matrix and the embeddings use ``init_method``; biases 0; norms weight
    1 (and bias 0). A variant's raw ``nn.Parameter`` keeps the value its module gave it. ``only``: the names of the
    modules to initialise (a variant's new modules on an imported model), default all."""
    std_in = init_std(cfg.init_method, cfg)
    std_out = init_std(cfg.output_layer_init_method, cfg)
    for name, module in model.named_modules():
        if only is not None and name not in only:
            continue
        if isinstance(module, (nn.LayerNorm, RMSNorm)):
            nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            if module is model.head and not cfg.no_weight_tying:
                continue  # the tied head is the embedding
            is_out = name.endswith(OUTPUT_PROJECTIONS)
            nn.init.normal_(module.weight, mean=0.0, std=std_out if is_out else std_in)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


def build_model(cfg: ModelConfig) -> CausalLM:
    """Build and initialise the model for ``cfg`` (not initialised on the meta device: names, shapes and counts,
    :func:`build_meta_model`)."""
    model = CausalLM(cfg)
    if next(model.parameters()).device.type != "meta":
        init_weights(model, cfg)
    return model


_INITS = frozenset(getattr(torch.nn.init, n) for n in ("normal_", "uniform_", "trunc_normal_", "ones_", "zeros_",
                                                        "constant_", "xavier_uniform_", "xavier_normal_",
                                                        "kaiming_uniform_", "kaiming_normal_", "orthogonal_"))
_INITS |= frozenset(getattr(torch.Tensor, n) for n in ("normal_", "uniform_", "fill_", "zero_"))


class _NoInitOnMeta(torch.overrides.TorchFunctionMode):
    """Skips the initialisers on meta tensors (they hold no values): meta ``normal_`` and ``uniform_`` run through
    ``torch._refs``, whose first call imports ``torch._dynamo`` (~2 s per process)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _INITS:  # torch.nn.init passes its tensor by keyword
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def build_meta_model(cfg: ModelConfig) -> CausalLM:
    """``build_model(cfg)`` on the meta device, without running the modules' initialisers: names, shapes, parameter
    counts and FLOPs only (load real tensors with ``model.load_weights(state, assign=True)``)."""
    with torch.device("meta"), _NoInitOnMeta():
        return build_model(cfg)


def vanilla_weight_names(cfg: ModelConfig) -> set[str]:
    """The weight names of ``cfg``'s model with vanilla attention in every layer: what a pretrained model it starts
    from must hold (a variant's own weights are new)."""
    vanilla = dataclasses.replace(cfg, attention=dataclasses.replace(
        cfg.attention, attention_type="vanilla", attention_config=None, hybrid=None))
    return set(build_meta_model(vanilla).weights())


# ----------------------------------------------------------------------------------------------
# size and cost


def count_parameters(model: CausalLM) -> dict[str, int]:
    """Total parameters (a tied matrix once), and non-embedding parameters: total minus the input embedding, except
    that a tied embedding counts as the output head it also is."""
    total = sum(p.numel() for p in model.parameters())
    embed = 0 if model.tied_keys else model.decoder.embed.weight.numel()
    return {"total": total, "non_embedding": total - embed}


def flops_per_token(model: CausalLM, seq_len: int | None = None) -> dict[str, float]:
    """Training FLOPs per token: ``6 N`` (N = every parameter except the input-embedding lookup) plus the
    attention term ``6 * 2 * L * H * d_h * keys``, where ``keys`` is the mean number of keys a query scores for the
    layer's variant (causal: (T+1)/2; windows: fewer), plus products a variant does beyond its parameters
    (DAR's second key/value projection). Forward is one third of each term."""
    cfg = model.cfg
    T = seq_len or cfg.seq_length
    n = count_parameters(model)["non_embedding"]
    width = cfg.num_attention_heads * cfg.head_dim
    # per query and layer: q.k scores and probs.v, 2 FLOPs per multiply-add each, over H * d_h dims
    attn = sum(6 * 2 * width * m.attended_keys(T) + m.extra_flops_per_token() for m in model.attention_modules())
    return {"params": 6.0 * n, "attention": float(attn), "total": 6.0 * n + float(attn)}
