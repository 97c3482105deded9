"""DimPO-projected attention: the spec of :mod:`neox_dar.attention.dimpo`."""

from __future__ import annotations

from typing import Optional

from ..config_fields import Key
from .spec import ModelConfig, VariantSpec


class DimPOSpec(VariantSpec):
    """``attention_type: dimpo`` (usually per layer, on the last ``l`` layers): causal attention with scores
    ``F(q) F(k)^T / sqrt(d')``, ``F`` a (d', d_h) projection per layer."""

    name = "dimpo"
    what = "causal attention with queries and keys projected to `d'` dims per layer, fitted to a trained model"
    doc = "docs/dimpo.md"
    keys = {"dimpo_d_proj": Key(Optional[int], None, "DimPO: width d' of the projected queries and keys, "
                                                     "1..head_dim (default head_dim).", label="dp",
                                rule=lambda v, m: None if 1 <= v <= m.head_dim else
                                f"must be in 1..head_dim={m.head_dim}")}
    module_path = "neox_dar.attention.dimpo:DimPOAttention"

    @classmethod
    def resolve(cls, cfg: ModelConfig) -> dict:
        return {"dimpo_d_proj": cfg.head_dim} if cfg.attention.dimpo_d_proj is None else {}

    @classmethod
    def summary(cls, cfg: ModelConfig) -> str:
        return f"{cls.name} d'={cfg.attention.dimpo_d_proj}"

    @classmethod
    def describe(cls, cfg: ModelConfig) -> list[str]:
        return [f"scores F(q) F(k)^T / sqrt(d') with d'={cfg.attention.dimpo_d_proj} of head_dim={cfg.head_dim} "
                "(projected after rotary; values unchanged)"]
