"""Vanilla causal attention (Pythia)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..standalone.windowed import WindowedLayer
from ..variants.vanilla import VanillaSpec
from .base import Attention
from .masks import masked_attention, window_mask

if TYPE_CHECKING:
    from ..config import ModelConfig


class VanillaAttention(WindowedLayer, Attention):
    """Causal softmax attention over all ``j <= i``: a ``windowed`` layer whose every head sees every earlier key
    (cache, decode step and export: :class:`~neox_dar.standalone.windowed.WindowedLayer`).

    ``reference`` materializes the causal mask; ``sdpa`` and ``triton`` both call
    ``scaled_dot_product_attention(is_causal=True)``, which is the FlashAttention kernel on CUDA
    (vanilla attention needs no custom kernel).
    """

    spec = VanillaSpec

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.build_variant([None] * self.num_heads)

    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        if self.resolved_impl(q.device) == "reference":
            return masked_attention(q, *self.expand_kv(k, v), window_mask(q.shape[-2], None, q.device))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_groups > 1)
