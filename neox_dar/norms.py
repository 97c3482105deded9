"""The model's normalisation layers as the config and the family's record choose them (the layers themselves:
:mod:`neox_dar.standalone.norms`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from .families import FAMILIES
from .standalone.norms import make_norm

if TYPE_CHECKING:
    from .config import ModelConfig


def build_norm(cfg: ModelConfig, width: int | None = None, rms: bool | None = None) -> nn.Module:
    """The family's normalisation over ``width`` features (default hidden_size); ``rms`` forces RMSNorm (the
    query/key norms are RMSNorms in every family that has them)."""
    rms = rms or (rms is None and cfg.norm == "rmsnorm")
    return make_norm(rms, width or cfg.hidden_size, cfg.rms_norm_epsilon if rms else cfg.layernorm_epsilon,
                     FAMILIES[cfg.model_family].rms_weight_in_float32)
