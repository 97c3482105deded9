"""A plug-in variant written as docs/adding_a_variant.md says, for the conformance suite (tests/test_conformance.py):
causal attention with a learned per-head query scale, its own decode through the base class's key/value cache, and
a per-head statistic it logs per token. It has no Hugging Face export (it subclasses no layer type of
``neox_dar.standalone``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neox_dar.attention import Attention
from neox_dar.config import Key
from neox_dar.variants import VariantSpec


class ConformanceToySpec(VariantSpec):
    name = "conftoy"
    keys = {"conftoy_scale": Key(float, 1.0, "Conformance toy: initial per-head query scale.", label="s",
                                 rule=lambda v, m: None if v > 0 else "must be > 0")}
    stats = {"conftoy_scale_now": "the conformance toy's learned per-head query scale"}


class ConformanceToy(Attention):
    spec = ConformanceToySpec

    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.scale = nn.Parameter(torch.full((cfg.num_attention_heads,), cfg.attention.conftoy_scale))

    def _record(self, B: int, T: int) -> None:
        self.stats = {"conftoy_scale_now": self.scale.detach().float()}
        self.token_stats = {"conftoy_scale_now": self.scale.detach().float().expand(B, T, -1)}

    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        B, H, T, _ = q.shape
        self._record(B, T)
        k, v = self.expand_kv(k, v)
        return F.scaled_dot_product_attention(q * self.scale[None, :, None, None], k, v, is_causal=True)

    def decode(self, a, cache, cos, sin) -> torch.Tensor:
        q, k, v = self.split_heads(a, cos, sin)
        self._record(q.shape[0], q.shape[2])
        return self.merge_heads(cache.attend(q * self.scale[None, :, None, None], k, v, self.head_dim ** -0.5))
