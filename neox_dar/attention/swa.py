"""Sliding-window attention (SWA): query ``i`` attends keys ``j <= i`` with ``i - j < w``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..standalone.windowed import WindowedLayer
from ..variants.swa import SWASpec
from .base import Attention
from .masks import masked_attention, window_mask
from .triton_bridge import triton_kernels
from .windowed import windowed_sdpa

if TYPE_CHECKING:
    from ..config import ModelConfig


class SWAAttention(WindowedLayer, Attention):
    """One window ``w = window_size`` for every head and layer (cache, decode step and export:
    :class:`~neox_dar.standalone.windowed.WindowedLayer`).

    ``reference``: explicit (T, T) band mask. ``sdpa``: blocked SDPA in O(T w) (:mod:`.windowed`).
    ``triton``: ``kernels.mswa_attention`` with the same window for every head.
    """

    spec = SWASpec

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.window = cfg.attention.window_size
        self.build_variant([self.window] * self.num_heads)

    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        impl = self.resolved_impl(q.device)
        if impl == "triton":  # reads the H_kv key/value heads directly
            return triton_kernels(q.device).mswa_attention(q, k, v, self.window)
        k, v = self.expand_kv(k, v)
        if impl == "reference":
            return masked_attention(q, k, v, window_mask(q.shape[-2], self.window, q.device))
        return windowed_sdpa(q, k, v, self.window)
