"""Sliding-window attention (SWA): the spec of :mod:`neox_dar.attention.swa`."""

from __future__ import annotations


from .spec import ModelConfig, VariantSpec


class SWASpec(VariantSpec):
    """``attention_type: swa``: query ``i`` attends keys ``j <= i`` with ``i - j < w``, one ``w = window_size`` for
    every head and layer."""

    kernels = True
    name = "swa"
    what = "sliding window of `w` keys"
    reads = ("window_size",)
    module_path = "neox_dar.attention.swa:SWAAttention"

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        cls.require_window(cfg)
        cls.warn_if_window_holds_every_key(cfg, "SWA's window holds every key, so this is vanilla attention")

    @classmethod
    def summary(cls, cfg: ModelConfig) -> str:
        return f"{cls.name} w={cfg.attention.window_size}"

    @classmethod
    def describe(cls, cfg: ModelConfig) -> list[str]:
        return [f"window w={cfg.attention.window_size} (keys j with i - j < w, itself included)"]
