"""Sliding-window attention (SWA): query ``i`` attends keys ``j <= i`` with ``i - j < w``."""

from __future__ import annotations

import torch

from ..config import Config
from .base import Attention
from .masks import masked_attention, window_mask
from .triton_bridge import triton_kernel
from .windowed import mean_attended_keys, windowed_sdpa


class SWAAttention(Attention):
    """One window ``w = window_size`` for every head and layer.

    ``reference``: explicit (T, T) band mask. ``sdpa``: blocked SDPA in O(T w) (:mod:`.windowed`).
    ``triton``: ``kernels.mswa_attention`` with the same window for every head.
    """

    def __init__(self, cfg: Config, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.window = cfg.window_size

    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        impl = self.resolved_impl(q.device)
        if impl == "reference":
            return masked_attention(q, k, v, window_mask(q.shape[-2], self.window, q.device))
        if impl == "triton":
            windows = torch.full((self.num_heads,), self.window)  # on the CPU: read without a device sync
            return triton_kernel("mswa_attention", q.device)(q, k, v, windows)
        return windowed_sdpa(q, k, v, self.window)

    def attended_keys(self, seq_len: int) -> float:
        return mean_attended_keys(seq_len, self.window)
