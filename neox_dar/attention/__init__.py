"""Attention variants behind one interface, selected per model (``attention_type``) or per layer
(``attention_config``, ``hybrid``; :mod:`.layers`).

A variant is one module (an :class:`Attention` subclass that declares its keys, rules, costs, descriptions and
statistics) plus one :func:`register` call, here for the built-in ones. See ``docs/attention.md`` for the math of
each variant and ``docs/adding_a_variant.md`` for writing one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import registry
from .aha import AHAAttention
from .base import Attention, RotaryEmbedding, apply_rotary
from .dar import DARAttention, UniformAttention
from .dimpo import DimPOAttention
from .layers import layer_types, mixed_variant
from .linear import LinearAttention
from .mswa import MSWAAttention, mswa_window_table
from .registry import register, unregister, variant_keys, variants
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
register(LinearAttention)
register(DimPOAttention)


def variant(name: str) -> type[Attention]:
    """The class of an ``attention_type`` value: a registered variant, or, for a model with per-layer types (whose
    resolved ``attention_type`` joins them: ``linear+mswa``), the class describing their mix
    (:func:`.layers.mixed_variant`). KeyError for an unregistered name."""
    return mixed_variant(name) if "+" in name else registry.variant(name)


def build_attention(cfg: ModelConfig, layer_idx: int) -> Attention:
    """The attention module of layer ``layer_idx``: the variant its layer type names (:func:`.layers.layer_types`)."""
    return registry.variant(layer_types(cfg)[layer_idx])(cfg, layer_idx)


__all__ = ["Attention", "RotaryEmbedding", "apply_rotary", "build_attention", "layer_types", "mswa_window_table",
           "register", "unregister", "variant", "variant_keys", "variants"]
