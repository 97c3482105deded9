"""Multi-scale window attention (MSWA): sliding-window attention with one window per head, this layer's row of
:func:`~neox_dar.variants.mswa.mswa_window_table` (the rule, after the paper, is documented there)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..standalone.windowed import WindowedLayer
from ..variants.layers import layer_position
from ..variants.mswa import MSWASpec, mswa_window_table
from .base import Attention
from .masks import masked_attention, window_mask
from .triton_bridge import triton_kernels
from .windowed import windowed_sdpa

if TYPE_CHECKING:
    from ..config import ModelConfig


class MSWAAttention(WindowedLayer, Attention):
    """Sliding-window attention with one window per head (this layer's row of :func:`mswa_window_table`; cache,
    decode step and export: :class:`~neox_dar.standalone.windowed.WindowedLayer`).

    ``reference``: explicit per-head (H, T, T) band mask. ``sdpa``: heads grouped by window, one blocked
    SDPA call per distinct window (:mod:`.windowed`). ``triton``: ``kernels.mswa_attention``.
    """

    spec = MSWASpec

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        position, _ = layer_position(cfg, layer_idx)
        self.build_variant(mswa_window_table(cfg, warn=position == 0)[position])

    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        impl = self.resolved_impl(q.device)
        T = q.shape[-2]
        if impl == "triton":  # reads the H_kv key/value heads directly
            return triton_kernels(q.device).mswa_attention(q, k, v, list(self.windows))
        k, v = self.expand_kv(k, v)
        if impl == "reference":
            allowed = torch.stack([window_mask(T, w, q.device) for w in self.windows])  # (H, T, T)
            return masked_attention(q, k, v, allowed)
        out = torch.empty_like(q)
        for w in sorted(set(self.windows)):
            heads = torch.tensor([h for h, hw in enumerate(self.windows) if hw == w], device=q.device)
            out[:, heads] = windowed_sdpa(q[:, heads], k[:, heads], v[:, heads], w)
        return out
