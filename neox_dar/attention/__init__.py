"""Attention variants behind one interface, selected by ``attention_type``.

A variant is one module (an :class:`Attention` subclass that declares its keys, rules, costs, descriptions and
statistics) plus one :func:`register` call, here for the built-in ones. See ``docs/attention.md`` for the math of
each variant and ``docs/adding_a_variant.md`` for writing one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .aha import AHAAttention
from .base import Attention, RotaryEmbedding, apply_rotary
from .dar import DARAttention, UniformAttention
from .mswa import MSWAAttention, mswa_window_table
from .registry import register, unregister, variant, variant_keys, variants
from .swa import SWAAttention
from .vanilla import VanillaAttention

if TYPE_CHECKING:
    from ..config import ModelConfig

register(VanillaAttention)
register(DARAttention)
register(UniformAttention)
register(SWAAttention)
register(MSWAAttention)
register(AHAAttention)


def build_attention(cfg: ModelConfig, layer_idx: int) -> Attention:
    """The attention module of layer ``layer_idx`` for ``cfg.attention.attention_type``."""
    return variant(cfg.attention.attention_type)(cfg, layer_idx)


__all__ = ["Attention", "RotaryEmbedding", "apply_rotary", "build_attention", "mswa_window_table", "register",
           "unregister", "variant", "variant_keys", "variants"]
