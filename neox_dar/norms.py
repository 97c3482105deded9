"""The normalisation layers of the model families: LayerNorm (GPT-NeoX) and RMSNorm (Llama, OLMo-2, Qwen)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .families import FAMILIES

if TYPE_CHECKING:
    from .config import ModelConfig


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


def build_norm(cfg: ModelConfig, width: int | None = None, rms: bool | None = None) -> nn.Module:
    """The family's normalisation over ``width`` features (default hidden_size); ``rms`` forces RMSNorm (the
    query/key norms are RMSNorms in every family that has them)."""
    width = width or cfg.hidden_size
    if rms or (rms is None and cfg.norm == "rmsnorm"):
        return RMSNorm(width, cfg.rms_norm_epsilon, FAMILIES[cfg.model_family].rms_weight_in_float32)
    return nn.LayerNorm(width, eps=cfg.layernorm_epsilon)
