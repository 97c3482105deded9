"""Causal linear attention with Based's Taylor feature map: the spec of :mod:`neox_dar.attention.linear`."""

from __future__ import annotations


from ..config_fields import Key, check
from .spec import ModelConfig, VariantSpec


FLA_MAX_FEATURES = 16  # fla's fused_chunk_based holds the d_f^2 state of a head in registers


class LinearSpec(VariantSpec):
    """``attention_type: linear``: Based's Taylor feature map on ``linear_feature_dim`` features."""

    name = "linear"
    what = "causal linear attention with Based's Taylor feature map (the MSWA paper's hybrid layers)"
    keys = {"linear_feature_dim": Key(int, 16, "Linear attention: query/key feature dim d_f before the Taylor map "
                                      "(phi has 1 + d_f + d_f^2 dims; the MSWA paper and Based use 16).", label="f",
                                      rule=lambda v, m: None if v >= 1 else "must be >= 1")}
    module_path = "neox_dar.attention.linear:LinearAttention"

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """``attention_impl: triton`` runs fla's kernel, which takes ``d_f <= 16`` (``auto`` runs the PyTorch path
        above that)."""
        d_f = cfg.attention.linear_feature_dim
        check(cfg.attention.attention_impl != "triton" or d_f <= FLA_MAX_FEATURES, "linear_feature_dim",
              f"must be <= {FLA_MAX_FEATURES} with attention_impl: triton (fla's fused_chunk_based); use "
              "attention_impl: auto or sdpa for wider features", d_f)

    @classmethod
    def summary(cls, cfg: ModelConfig) -> str:
        return f"{cls.name} d_f={cfg.attention.linear_feature_dim}"

    @classmethod
    def describe(cls, cfg: ModelConfig) -> list[str]:
        d_f = cfg.attention.linear_feature_dim
        return [f"Taylor feature map on d_f={d_f} features: phi(q).phi(k) = 1 + s + s^2/2, s = q.k/sqrt({d_f}); "
                f"{1 + d_f + d_f * d_f} feature dims; state per key/value head "
                f"{(1 + d_f + d_f * d_f) * (cfg.head_dim + 1):,} "
                "numbers (S and z), whatever the context"]
