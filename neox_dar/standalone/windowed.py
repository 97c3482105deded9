"""Softmax attention over each query head's window (vanilla: every earlier key; SWA: one window; MSWA: one per
head) at inference: layer type ``windowed``. Its cache is :class:`~.cache.WindowedKV`, the layer's default. Plain
PyTorch (the package's rule, :mod:`neox_dar.standalone`)."""

from __future__ import annotations

from typing import Sequence

import torch

from .attention import AttentionLayer


class WindowedLayer(AttentionLayer):
    """Query head ``h`` reads the keys of its window ``windows[h]`` (None: every earlier key); no parameters beyond
    the projections."""

    layer_type = "windowed"

    def build_variant(self, windows: Sequence[int | None]) -> None:
        """``windows``: one per query head."""
        self.windows = list(windows)

    def export_spec(self) -> dict:
        return {"type": self.layer_type, "windows": self.head_windows()}

    def head_windows(self) -> list[int | None]:
        return list(self.windows)

    def decode(self, a: torch.Tensor, cache, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split_heads(a, cos, sin)
        return self.merge_heads(cache.attend(q, k, v, self.head_dim ** -0.5))
