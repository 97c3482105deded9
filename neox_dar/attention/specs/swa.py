"""Sliding-window attention (SWA): the spec of :mod:`neox_dar.attention.swa`."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from .base import Spec

if TYPE_CHECKING:
    from ...config import ModelConfig


class SWASpec(Spec):
    """``attention_type: swa``: query ``i`` attends keys ``j <= i`` with ``i - j < w``, one ``w = window_size`` for
    every head and layer."""

    name = "swa"
    reads = ("window_size",)

    @classmethod
    def module(cls) -> type:
        from ..swa import SWAAttention

        return SWAAttention

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        cls.require_window(cfg)
        w, T = cfg.attention.window_size, cfg.seq_length
        if w >= T:
            warnings.warn(f"window_size={w} >= seq_length={T}: SWA's window holds every key, so this is vanilla "
                          "attention; a later config file or key may have replaced the model config's window",
                          stacklevel=6)

    @classmethod
    def summary(cls, cfg: ModelConfig) -> str:
        return f"{cls.name} w={cfg.attention.window_size}"

    @classmethod
    def describe(cls, cfg: ModelConfig) -> list[str]:
        return [f"window w={cfg.attention.window_size} (keys j with i - j < w, itself included)"]
