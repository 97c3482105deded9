"""The normalisation layers of the model families: LayerNorm (GPT-NeoX) and RMSNorm (Llama, OLMo-2, Qwen). Plain
PyTorch (the package's rule, :mod:`neox_dar.standalone`)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight``, normalised in float32. ``scale_in_float32`` multiplies by the weight
    before casting back (OLMo-2's ``Olmo2RMSNorm``), otherwise after (Llama's and Qwen's); equal in float32."""

    def __init__(self, width: int, eps: float, scale_in_float32: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps
        self.scale_in_float32 = scale_in_float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x).to(dtype) if self.scale_in_float32 else self.weight * x.to(dtype)


def make_norm(rms: bool, width: int, eps: float, scale_in_float32: bool) -> nn.Module:
    """:class:`RMSNorm` (``rms``) or ``nn.LayerNorm`` over ``width`` features."""
    return RMSNorm(width, eps, scale_in_float32) if rms else nn.LayerNorm(width, eps=eps)
