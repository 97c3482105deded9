"""Attention variants behind one interface, selected by ``attention_type``.

See ``docs/attention.md`` for the math of each variant and the choices this project makes.
"""

from __future__ import annotations

from ..config import Config
from .aha import AHAAttention
from .base import Attention, RotaryEmbedding, apply_rotary
from .dar import DARAttention
from .mswa import MSWAAttention, mswa_window_table
from .swa import SWAAttention
from .vanilla import VanillaAttention

VARIANTS: dict[str, type[Attention]] = {
    "vanilla": VanillaAttention,
    "dar": DARAttention,
    "uniform": DARAttention,
    "swa": SWAAttention,
    "mswa": MSWAAttention,
    "aha": AHAAttention,
}


def build_attention(cfg: Config, layer_idx: int) -> Attention:
    """The attention module of layer ``layer_idx`` for ``cfg.attention_type``."""
    try:
        cls = VARIANTS[cfg.attention_type]
    except KeyError:
        raise ValueError(f"attention_type '{cfg.attention_type}' has no implementation") from None
    return cls(cfg, layer_idx)


__all__ = ["Attention", "RotaryEmbedding", "apply_rotary", "build_attention", "mswa_window_table", "VARIANTS"]
