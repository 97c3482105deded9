"""DimPO-projected attention at inference: layer type ``dimpo``. Scores ``F(q) F(k)^T / sqrt(d')`` with
``F(x) = x W^T`` (``W`` (d', d_h), one per layer, applied after the family's q/k norm and rotary); the cache is a
:class:`~.cache.WindowedKV` of every column with keys at ``d'`` and values at ``d_h``:
``H_kv (d' + d_h) C`` numbers per row at a context of ``C`` columns. Plain PyTorch (the package's rule,
:mod:`neox_dar.standalone`)."""

from __future__ import annotations

import torch
from torch import nn

from .attention import AttentionLayer
from .cache import WindowedKV


class DimPOLayer(AttentionLayer):
    """DimPO's parameter beyond the projections: ``dimpo_proj`` (d', d_h), a raw parameter that starts at the first
    ``d'`` rows of the identity."""

    layer_type = "dimpo"

    def build_variant(self, d_proj: int) -> None:
        """``d_proj``: ``d'``, the width of the projected queries and keys."""
        self.d_proj = d_proj
        self.dimpo_proj = nn.Parameter(torch.eye(d_proj, self.head_dim))

    def export_spec(self) -> dict:
        return {"type": self.layer_type, "d_proj": self.d_proj}

    def project_qk(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``x W^T`` of each (B, heads, T, d_h) -> (B, heads, T, d')."""
        w = self.dimpo_proj.to(xs[0].dtype)
        return tuple(x @ w.T for x in xs)

    def new_cache(self, layout, device: torch.device, dtype: torch.dtype) -> WindowedKV:
        return WindowedKV(layout, [None] * self.num_heads, self.num_kv_heads, self.d_proj, self.head_dim, device,
                          dtype)

    def decode(self, a: torch.Tensor, cache: WindowedKV, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split_heads(a, cos, sin)
        fq, fk = self.project_qk(q, k)
        return self.merge_heads(cache.attend(fq, fk, v, self.d_proj ** -0.5))
