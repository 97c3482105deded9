"""``neox_dar_block``, the layer shape of an exported model's family in its ``config.json``, as one typed record:
:class:`BlockShape` (with :class:`ModuleNames`). ``convert to-hf`` writes it (:meth:`BlockShape.to_json`), the exported
model reads it (:meth:`BlockShape.from_json`); the JSON is the record's fields in their order. Standard library only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModuleNames:
    """The module names of the family's Hugging Face class: ``{decoder}.{embed}``, ``{decoder}.layers.{l}.{attention}``,
    ``{decoder}.{final_norm}``, ``{head}``."""

    decoder: str
    embed: str
    final_norm: str
    head: str
    attention: str


@dataclass(frozen=True)
class BlockShape:
    """What the exported model builds besides the sizes (``config.json``'s usual keys) and each layer's attention
    (``neox_dar_layers``): everything resolved by ``convert to-hf``, nothing re-derived here."""

    family: str                  # gpt_neox, llama, olmo2, qwen2, qwen3, ...
    names: ModuleNames
    norm: str                    # layernorm, rmsnorm
    norm_eps: float
    rms_weight_in_float32: bool  # OLMo-2's RMSNorm multiplies by its weight before casting back
    norm_position: str           # pre, post
    parallel_residual: bool
    qk_norm: str                 # none, projection, head
    activation: str              # gelu, swiglu
    fused_qkv: bool
    qkv_bias: bool
    attention_out_bias: bool
    mlp_bias: bool
    rotary_ndims: int
    rope_theta: float
    # Llama-3's frequency scaling (rope_type, factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings), or None
    rope_scaling: dict[str, Any] | None
    rotary_in_float32: bool = False  # OLMo-2 turns q, k by float32 tables (absent from older exports: False)

    def to_json(self) -> dict[str, Any]:
        """The record as ``config.json`` holds it: its fields in order, the names as a mapping."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> BlockShape:
        """The record of a ``config.json``'s ``neox_dar_block``; a TypeError names a missing or unknown key."""
        return cls(**{**value, "names": ModuleNames(**value["names"])})
