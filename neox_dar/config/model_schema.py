"""The model section of the config: the architecture (:class:`ModelConfig`) and its attention, whose common keys are
:class:`AttentionBase`'s and to which every registered variant adds its own (:func:`attention_config_class`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Optional

from ..config_fields import at_least, setting, when
from ..families import FAMILIES
from ..variants import registry, variant_keys


@dataclass
class AttentionBase:
    """The attention keys every variant shares; variants add theirs (see :func:`attention_config_class`). The type
    of ``cfg.model.attention`` for type checkers: these keys typed, a variant's key through ``__getattr__``."""

    attention_type: str = setting("vanilla", "Attention variant of every layer: one of the registered names (vanilla, "
                                             "dar, uniform, swa, mswa, aha, linear, ...). With per-layer types it "
                                             "resolves to their names joined by '+' (linear+mswa).", label="")
    attention_config: Optional[list[tuple[list[str], int]]] = setting(
        None, "Per-layer attention types in GPT-NeoX's form [[[types...], repeat], ...]: each entry's types repeated "
        "`repeat` times, in order, one per layer (global = vanilla, local = swa). attention_type may then be unset or "
        "name one of the types.", label="layers")
    hybrid: Optional[Literal["mswa_linear", "swa_linear"]] = setting(
        None, "The MSWA paper's hybrid (Sec. 4.4): four groups of L/12 linear then L/6 mswa (or swa) layers; sets "
        "attention_config (num_layers divisible by 12).", label="")
    window_size: int = setting(128, "Window w: key j is inside when i - j < w (the variants that use a window).",
                               label="w", rule=at_least(0))
    attention_impl: Literal["auto", "reference", "triton", "sdpa"] = setting(
        "auto", "auto (triton on CUDA, else sdpa) | reference (materialized masks) | triton | sdpa.", arch=False)

    if TYPE_CHECKING:  # the loaded section is attention_config_class(): these keys plus each registered variant's
        def __getattr__(self, key: str) -> Any:
            """A variant's key (``cfg.model.attention.dar_d_down``): Any to a type checker, its ``Key``'s type when
            loaded."""


@functools.lru_cache(maxsize=None)
def _attention_class(generation: int) -> type:
    fields = [(name, key.type, key.field()) for name, (key, _) in variant_keys().items()]
    return dataclasses.make_dataclass("AttentionConfig", fields, bases=(AttentionBase,))


def attention_config_class() -> type:
    """``AttentionConfig``: :class:`AttentionBase` plus the keys of every registered variant (rebuilt when a
    variant is registered)."""
    return _attention_class(registry.generation())


@dataclass
class RopeScaling:
    """Llama-3's rotary scaling of the low frequencies (Hugging Face ``rope_type: llama3``)."""

    rope_type: Literal["llama3"] = setting("llama3", "Only Llama-3's scaling is implemented.")
    factor: float = setting(8.0, "Wavelengths beyond original_max_position_embeddings / low_freq_factor are divided "
                                 "by this.")
    low_freq_factor: float = setting(1.0, "Llama-3's low_freq_factor.")
    high_freq_factor: float = setting(4.0, "Llama-3's high_freq_factor.")
    original_max_position_embeddings: int = setting(8192, "The context the base frequencies were trained for.")


@dataclass
class ModelConfig:
    """The architecture and its attention: everything a model is built from (a checkpoint stores this alone).

    The block's components are keys; ``configs/`` holds presets for the published shapes of each family."""

    model_family: str = setting(
        "gpt_neox", "Parameter names and the Hugging Face class of imports and exports: a family registered in "
        "neox_dar/families.py (" + ", ".join(FAMILIES) + "; python -m neox_dar.families prints them).",
        rule=lambda v, _: None if v in FAMILIES else f"choose one of {', '.join(FAMILIES)}")
    num_layers: int = setting(6, "Transformer layers.", rule=at_least(1))
    hidden_size: int = setting(512, "Model width d.", rule=at_least(1))
    num_attention_heads: int = setting(8, "Attention (query) heads H.", rule=at_least(1))
    num_kv_heads: Optional[int] = setting(None, "Key/value heads for grouped-query attention, dividing "
                                                "num_attention_heads (unset: num_attention_heads).", rule=at_least(1))
    head_dim: Optional[int] = setting(None, "Dims per head (unset: hidden_size / num_attention_heads; Qwen3 sets "
                                            "it).", rule=at_least(1))
    intermediate_size: Optional[int] = setting(None, "MLP inner width (unset: 4 * hidden_size).", rule=at_least(1))
    seq_length: int = setting(2048, "Training sequence length (and the default evaluation window).", arch=False,
                              rule=at_least(1))
    max_position_embeddings: int = setting(2048, "Longest position the model supports (>= seq_length).",
                                           rule=at_least(1))
    rotary_pct: float = setting(0.25, "Fraction of each head's dims that get rotary embeddings (Pythia 0.25, the "
                                      "other families 1.0).", rule=when(lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]"))
    rotary_emb_base: int = setting(10000, "Rotary base (Hugging Face rope_theta).", rule=at_least(1))
    rope_scaling: Optional[RopeScaling] = setting(None, "Llama-3 rotary scaling (rope_type, factor, low_freq_factor, "
                                                        "high_freq_factor, original_max_position_embeddings).",
                                                  rule=when(lambda r: r.factor > 0 and r.low_freq_factor > 0
                                                            and r.high_freq_factor > r.low_freq_factor,
                                                            "factor and low_freq_factor must be > 0 and "
                                                            "high_freq_factor > low_freq_factor"))
    gpt_j_residual: bool = setting(True, "Parallel residual: x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX); false: "
                                         "sequential.")
    norm: Literal["layernorm", "rmsnorm"] = setting("layernorm", "Normalization layer.")
    layernorm_epsilon: float = setting(1e-5, "LayerNorm epsilon.", rule=when(lambda v: v > 0, "must be > 0"))
    rms_norm_epsilon: float = setting(1e-6, "RMSNorm epsilon.", rule=when(lambda v: v > 0, "must be > 0"))
    norm_position: Literal["pre", "post"] = setting(
        "pre", "pre: x + f(norm(x)) (GPT-NeoX, Llama, Qwen); post: x + norm(f(x)), a norm after each sub-layer "
        "(OLMo-2).")
    qk_norm: Literal["none", "projection", "head"] = setting(
        "none", "RMSNorm of queries and keys before rotary: over the whole projection (OLMo-2) or per head "
        "(Qwen3).")
    activation: Literal["gelu", "swiglu"] = setting(
        "gelu", "MLP: gelu (dense_h_to_4h, exact erf GeLU, dense_4h_to_h) or swiglu (gate_proj, up_proj, down_proj "
        "with SiLU).")
    fused_qkv: bool = setting(True, "One query_key_value projection in GPT-NeoX's per-head layout (and dense); "
                                    "false: q_proj, k_proj, v_proj (and o_proj).")
    qkv_bias: bool = setting(True, "Bias on the query/key/value projections (GPT-NeoX, Qwen2: true).")
    attention_out_bias: bool = setting(True, "Bias on the attention output projection (GPT-NeoX: true).")
    mlp_bias: bool = setting(True, "Biases in the MLP (GPT-NeoX: true).")
    no_weight_tying: bool = setting(True, "Untied input and output embeddings (Pythia: true; some Llama-3.2 and "
                                          "Qwen models tie them).")
    vocab_size: int = setting(50277, "Tokenizer vocabulary size before padding (Pythia tokenizer: 50277).",
                              rule=at_least(1))
    make_vocab_size_divisible_by: int = setting(128, "Pad the vocabulary to a multiple of this.", rule=at_least(1))
    init_method: Literal["small_init", "normal"] = setting(
        "small_init", "Init of input-side weights: small_init std sqrt(2/(5d)).", arch=False)
    output_layer_init_method: Literal["wang_init", "normal"] = setting(
        "wang_init", "Init of the layer-output projections: wang_init std 2/(L*sqrt(d)).", arch=False)
    init_method_std: float = setting(0.02, "Std for the 'normal' init methods.", arch=False,
                                     rule=when(lambda v: v > 0, "must be > 0"))
    attention_dropout: float = setting(0.0, "Dropout on attention probabilities: only 0 is supported (Pythia: 0).",
                                       arch=False,
                                       rule=when(lambda v: v == 0.0,
                                                 "only 0 is supported (no attention path applies dropout)"))
    hidden_dropout: float = setting(0.0, "Dropout on residual branches (Pythia: 0).", arch=False,
                                    rule=when(lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"))
    vocab_file: Optional[str] = setting(None, "Tokenizer file (HF tokenizer.json or SentencePiece model).", arch=False)
    tokenizer_type: Literal["HFTokenizer", "SPMTokenizer"] = setting("HFTokenizer", "Tokenizer kind.", arch=False)
    attention: AttentionBase = field(default=None, metadata={"section": True})  # an attention_config_class()

    @property
    def kv_groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_attention_heads // self.num_kv_heads

    @property
    def rotary_ndims(self) -> int:
        return int(self.head_dim * self.rotary_pct)

    @property
    def padded_vocab_size(self) -> int:
        m = self.make_vocab_size_divisible_by
        return int(math.ceil(self.vocab_size / m) * m)
