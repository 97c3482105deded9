"""The torch modules of the attention variants behind one interface (:class:`Attention`), selected per model
(``attention_type``) or per layer (``attention_config``, ``hybrid``).

What each variant declares to the rest of the project (name, keys, rules, descriptions, statistics), the registry
and the per-layer layouts live in the torch-free :mod:`neox_dar.variants`; a variant's spec names the module here
that computes it, and the module holds its spec (``spec``). This package imports no torch until a model is built.
See ``docs/attention.md`` for the math of each variant and ``docs/adding_a_variant.md`` for writing one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..variants import layer_types, registry

if TYPE_CHECKING:
    from ..config import ModelConfig
    from .base import Attention


def build_attention(cfg: ModelConfig, layer_idx: int) -> Attention:
    """The attention module of layer ``layer_idx``: the variant its layer type names
    (:func:`neox_dar.variants.layers.layer_types`)."""
    return registry.module(layer_types(cfg)[layer_idx])(cfg, layer_idx)


def __getattr__(name: str):
    """The torch classes (``Attention``, ``RotaryEmbedding``, ``apply_rotary``), imported on first use."""
    if name in ("Attention", "RotaryEmbedding", "apply_rotary"):
        from . import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Attention", "RotaryEmbedding", "apply_rotary", "build_attention"]
