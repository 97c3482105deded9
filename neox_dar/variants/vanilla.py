"""Vanilla causal attention (Pythia): the spec of :mod:`neox_dar.attention.vanilla`."""

from __future__ import annotations

from .spec import VariantSpec


class VanillaSpec(VariantSpec):
    """``attention_type: vanilla``: causal softmax attention over all ``j <= i``."""

    name = "vanilla"
    what = "causal softmax attention (Pythia)"
    module_path = "neox_dar.attention.vanilla:VanillaAttention"
