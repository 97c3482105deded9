"""Vanilla causal attention (Pythia)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Attention
from .masks import masked_attention, window_mask
from .specs.vanilla import VanillaSpec


class VanillaAttention(VanillaSpec, Attention):
    """Causal softmax attention over all ``j <= i``.

    ``reference`` materializes the causal mask; ``sdpa`` and ``triton`` both call
    ``scaled_dot_product_attention(is_causal=True)``, which is the FlashAttention kernel on CUDA
    (vanilla attention needs no custom kernel).
    """

    windowed_softmax = True  # decoded by the base class's windowed cache

    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        if self.resolved_impl(q.device) == "reference":
            return masked_attention(q, *self.expand_kv(k, v), window_mask(q.shape[-2], None, q.device))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_groups > 1)
