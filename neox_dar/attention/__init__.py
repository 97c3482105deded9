"""Attention variants behind one interface, selected per model (``attention_type``) or per layer
(``attention_config``, ``hybrid``; :mod:`.layers`).

A variant is one module (an :class:`Attention` subclass that computes it and declares its keys, rules, costs,
descriptions and statistics) plus one :func:`register` call, here for the built-in ones. The built-in variants keep
their declarations in a torch-free spec (:mod:`.specs`) that their module subclasses, and register the spec: this
package imports no torch until a model is built, so the config loads without it. See ``docs/attention.md`` for the
math of each variant and ``docs/adding_a_variant.md`` for writing one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import registry
from .layers import layer_types, mixed_variant
from .registry import register, unregister, variant_keys, variants
from .specs.aha import AHASpec
from .specs.base import Spec
from .specs.dar import DARSpec, UniformSpec
from .specs.dimpo import DimPOSpec
from .specs.linear import LinearSpec
from .specs.mswa import MSWASpec, mswa_window_table
from .specs.swa import SWASpec
from .specs.vanilla import VanillaSpec

if TYPE_CHECKING:
    from ..config import ModelConfig
    from .base import Attention

register(VanillaSpec)
register(DARSpec)
register(UniformSpec)
register(SWASpec)
register(MSWASpec)
register(AHASpec)
register(LinearSpec)
register(DimPOSpec)


def variant(name: str) -> type[Spec]:
    """The spec of an ``attention_type`` value: a registered variant, or, for a model with per-layer types (whose
    resolved ``attention_type`` joins them: ``linear+mswa``), the spec describing their mix
    (:func:`.layers.mixed_variant`). KeyError for an unregistered name."""
    return mixed_variant(name) if "+" in name else registry.variant(name)


def build_attention(cfg: ModelConfig, layer_idx: int) -> Attention:
    """The attention module of layer ``layer_idx``: the variant its layer type names (:func:`.layers.layer_types`)."""
    return registry.variant(layer_types(cfg)[layer_idx]).module()(cfg, layer_idx)


def __getattr__(name: str):
    """The torch classes (``Attention``, ``RotaryEmbedding``, ``apply_rotary``), imported on first use."""
    if name in ("Attention", "RotaryEmbedding", "apply_rotary"):
        from . import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Attention", "RotaryEmbedding", "Spec", "apply_rotary", "build_attention", "layer_types",
           "mswa_window_table", "register", "unregister", "variant", "variant_keys", "variants"]
