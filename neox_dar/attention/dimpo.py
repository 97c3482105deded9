"""DimPO-projected attention (DimPO paper Sec. 3-4): vanilla causal attention whose scores use low-dimensional
query/key projections, ``softmax(F(q) F(k)^T / sqrt(d')) v`` with ``F(x) = x W^T`` and ``W`` (d', d_h) one matrix
per layer shared by its heads; values are unchanged.

``F`` applies to the queries and keys as the layer produces them: after the family's q/k norm and after rotary
(the paper does not say where; projecting the rotated vectors keeps the scores a function of the cached keys alone,
so the cache keeps keys of ``d'`` numbers). With ``W`` the identity at ``d' = d_h`` this is vanilla attention.

The projections are fitted by ``python -m neox_dar.dimpo fit`` and put into a model by
``python -m neox_dar.dimpo apply`` (:mod:`neox_dar.dimpo.apply`), which makes the last ``l`` layers ``dimpo``
through ``attention_config`` and copies each layer's ``W`` into ``dimpo_proj``. A ``dimpo`` layer built from a config
alone starts at ``W`` = the first ``d'`` rows of the identity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..standalone.cache import WindowedKV
from ..standalone.dimpo import DimPOLayer
from ..variants.dimpo import DimPOSpec
from .base import Attention
from .masks import masked_attention, window_mask

if TYPE_CHECKING:
    from ..config import ModelConfig


class DimPOAttention(DimPOLayer, Attention):
    """``attention_type: dimpo`` (usually per layer, on the last ``l`` layers): causal attention with scores
    ``F(q) F(k)^T / sqrt(d')``.

    Parameter beyond vanilla: ``dimpo_proj`` (d', d_h). Paths: ``reference`` (explicit mask, float32); ``sdpa`` and
    ``triton`` call ``scaled_dot_product_attention(is_causal=True)`` on the projected queries and keys, as vanilla's
    two do (causal attention needs no custom kernel; SDPA takes values wider than the keys). Inference cache (keys
    at ``d'``, values at ``d_h``) and decode step: :class:`~neox_dar.standalone.dimpo.DimPOLayer`'s."""

    spec = DimPOSpec

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.build_variant(cfg.attention.dimpo_d_proj)

    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        fq, fk = self.project_qk(q, k)
        if self.resolved_impl(q.device) == "reference":
            fk, v = self.expand_kv(fk, v)
            return masked_attention(fq, fk, v, window_mask(q.shape[-2], None, q.device))  # scale 1/sqrt(d')
        return F.scaled_dot_product_attention(fq, fk, v, is_causal=True, enable_gqa=self.kv_groups > 1)

    # ---- inference: DimPOLayer's keys cached at d' ----------------------------------------------------------
    def remember(self, cache: WindowedKV, rows, k, v, a) -> None:
        cache.write(*self.project_qk(k), v, cache.layout.starts[int(rows[0])], rows)

    def kv_cache_per_token(self, context: int) -> float:
        """Each key/value head keeps a key of ``d'`` and a value of ``d_h`` numbers for every earlier token."""
        return float(self.num_kv_heads * (self.d_proj + self.head_dim))

    def cache_notes(self, context: int) -> list[str]:
        return [f"per layer: keys at d'={self.d_proj} + values at d_h={self.head_dim} per key/value head"]
