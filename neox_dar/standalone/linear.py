"""Causal linear attention with Based's 2nd-order Taylor feature map (MSWA paper Eq. 6-7) at inference: layer type
``linear``. The cache (:class:`LinearState`) is the running sums ``S``, ``z`` in float32,
``H_kv (1 + d_f + d_f^2)(d_h + 1)`` numbers whatever the context. Plain PyTorch (the package's rule,
:mod:`neox_dar.standalone`)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .attention import AttentionLayer
from .cache import Layout
from .rotary import apply_rotary


def taylor_features(x: torch.Tensor) -> torch.Tensor:
    """Based's 2nd-order Taylor map ``phi(x)`` over the last dim: (..., d_f) -> (..., 1 + d_f + d_f^2), so that
    ``phi(q) . phi(k) = 1 + s + s^2 / 2`` with ``s = q . k / sqrt(d_f)``."""
    d_f = x.shape[-1]
    outer = (x[..., :, None] * x[..., None, :]).flatten(-2)
    return torch.cat([torch.ones_like(x[..., :1]), x / d_f ** 0.25, outer / math.sqrt(2 * d_f)], dim=-1)


def feature_rotary(cos: torch.Tensor, sin: torch.Tensor, d_f: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's rotary tables (T, r) cut to the features: the ``min(r, d_f)`` (even) dims that hold the highest
    frequencies, so rotate-half on ``d_f`` features pairs each dim with the one of the same frequency."""
    r = cos.shape[-1]
    half = min(r, d_f - d_f % 2) // 2
    if 2 * half == r:
        return cos, sin
    idx = torch.cat([torch.arange(half), r // 2 + torch.arange(half)]).to(cos.device)
    return cos[..., idx], sin[..., idx]


def linear_attention_step(pq: torch.Tensor, pk: torch.Tensor, v: torch.Tensor,
                          state: tuple[torch.Tensor, torch.Tensor] | None = None,
                          valid: torch.Tensor | None = None):
    """Causal linear attention of ``T`` new tokens after the tokens summed in ``state``:
    ``o_t = phi(q_t) (S + sum_{s<=t} phi(k_s)^T v_s) / phi(q_t) . (z + sum_{s<=t} phi(k_s))``.

    ``pq`` (B, H, T, D), ``pk`` (B, H_kv, T, D) the features, ``v`` (B, H_kv, T, d_v), all float32; ``state`` ``(S
    (B, H_kv, D, d_v), z (B, H_kv, D))`` or None (no earlier token); ``valid`` (B, T): the tokens that count
    (padding: False; their outputs are 0). -> ``(out (B, H, T, d_v), (S, z))`` with the new tokens added."""
    if valid is not None:
        pk = pk * valid[:, None, :, None]
    B, H, T, D = pq.shape
    Hk = pk.shape[1]
    S, z = state if state is not None else (pk.new_zeros(B, Hk, D, v.shape[-1]), pk.new_zeros(B, Hk, D))
    qg = pq.reshape(B, Hk, (H // Hk) * T, D)
    inside = (qg @ pk.transpose(-1, -2)).view(B, Hk, H // Hk, T, T).tril().view(B, Hk, -1, T)  # s <= t
    num = qg @ S + inside @ v
    den = (qg @ z[..., None]) + inside.sum(-1, keepdim=True)
    out = (num / den).view(B, H, T, -1)
    if valid is not None:
        out = torch.where(valid[:, None, :, None], out, 0.0)
    return out, (S + pk.transpose(-1, -2) @ v, z + pk.sum(2))


class LinearState:
    """Linear attention's cache: ``state = (S (B, H_kv, D, d_h), z (B, H_kv, D))``, float32, ``D = 1 + d_f +
    d_f^2``, the same size whatever the context."""

    def __init__(self, layout: Layout, num_kv_heads: int, features: int, value_dim: int, device: torch.device | str):
        B = layout.batch
        self.layout = layout
        self.state = (torch.zeros(B, num_kv_heads, features, value_dim, device=device),
                      torch.zeros(B, num_kv_heads, features, device=device))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state)

    def write(self, pk: torch.Tensor, v: torch.Tensor, rows: torch.Tensor) -> None:
        """Add a prompt's features ``pk`` (n, H_kv, T, D) and values ``v`` (n, H_kv, T, d_h) to ``rows``' sums."""
        S, z = self.state
        S[rows] += pk.transpose(-1, -2) @ v.float()
        z[rows] += pk.sum(2)


class LinearLayer(AttentionLayer):
    """Linear attention's parameters beyond the projections: ``feature_q``, ``feature_k`` (bias-free ``d_h -> d_f``
    linears shared by the heads of a layer, applied to the un-rotated query and key); rotary goes on the features.
    :meth:`step` is the recurrent form, whose state (``S``, ``z``) does not grow with the context."""

    layer_type = "linear"

    def build_variant(self, feature_dim: int) -> None:
        """``feature_dim``: ``d_f``, the features of each query and key."""
        self.feature_dim = feature_dim
        self.feature_q = nn.Linear(self.head_dim, feature_dim, bias=False)
        self.feature_k = nn.Linear(self.head_dim, feature_dim, bias=False)

    def export_spec(self) -> dict:
        return {"type": self.layer_type, "feature_dim": self.feature_dim}

    def feature_count(self) -> int:
        """``D = 1 + d_f + d_f^2``, the length of ``phi(x)``."""
        return 1 + self.feature_dim + self.feature_dim ** 2

    def features(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Un-rotated ``q`` (B, H, T, d_h) and ``k`` (B, H_kv, T, d_h) -> rotated features of the same heads, d_f
        dims each."""
        cos_f, sin_f = feature_rotary(cos, sin, self.feature_dim)
        return apply_rotary(self.feature_q(q), cos_f, sin_f), apply_rotary(self.feature_k(k), cos_f, sin_f)

    def step(self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             state: tuple[torch.Tensor, torch.Tensor] | None = None, valid: torch.Tensor | None = None):
        """The next tokens ``a`` (B, T, d) (usually T = 1) at the positions whose rotary rows ``cos``, ``sin`` are
        given ((T, r), or (B, 1, T, r) per row), and the running sums of the tokens before them (None at the start)
        -> the layer's output (B, T, d) and the new state ``(S (B, H_kv, D, d_h), z (B, H_kv, D))``, float32,
        ``D = 1 + d_f + d_f^2`` (one state per key/value head: its query heads read the same sums). ``valid`` (B, T):
        tokens that count (padding: False). The math: :func:`linear_attention_step`."""
        q, k, v = self.split_heads(a, cos[..., :0], sin[..., :0])
        fq, fk = self.features(q, k, cos, sin)
        out, state = linear_attention_step(taylor_features(fq.float()), taylor_features(fk.float()), v.float(),
                                           state, valid)
        return self.merge_heads(out.to(a.dtype)), state

    def new_cache(self, layout: Layout, device: torch.device, dtype: torch.dtype) -> LinearState:
        return LinearState(layout, self.num_kv_heads, self.feature_count(), self.head_dim, device)

    def decode(self, a: torch.Tensor, cache: LinearState, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        layout = cache.layout
        out, cache.state = self.step(a, cos, sin, cache.state, layout.valid(layout.length, a.shape[1]))
        return out
