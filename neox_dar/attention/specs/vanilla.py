"""Vanilla causal attention (Pythia): the spec of :mod:`neox_dar.attention.vanilla`."""

from __future__ import annotations

from .base import Spec


class VanillaSpec(Spec):
    """``attention_type: vanilla``: causal softmax attention over all ``j <= i``."""

    name = "vanilla"
    what = "causal softmax attention (Pythia)"

    @classmethod
    def module(cls) -> type:
        from ..vanilla import VanillaAttention

        return VanillaAttention
