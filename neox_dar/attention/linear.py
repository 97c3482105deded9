"""Causal linear attention with the 2nd-order Taylor feature map of Based (MSWA paper Sec. 3.3, 4.4 and 5.1.2;
Arora et al. 2024, "Simple linear attention language models balance the recall-throughput tradeoff").

Per head, queries and keys are projected to ``d_f`` features (``feature_q``, ``feature_k``: bias-free
``d_h -> d_f`` linears shared by the heads of a layer, applied to the un-rotated query and key), rotary is applied to
the features, and the feature map

    phi(x) = [1, x / d_f^(1/4), vec(x x^T) / (sqrt(2) sqrt(d_f))]          (1 + d_f + d_f^2 numbers)

gives ``phi(q) . phi(k) = 1 + s + s^2 / 2`` with ``s = q . k / sqrt(d_f)``. Then (paper Eq. 6-7)

    o_i = phi(q_i) S_i / (phi(q_i) . z_i),   S_i = sum_{j <= i} phi(k_j)^T v_j,   z_i = sum_{j <= i} phi(k_j).

The weight ``1 + s + s^2/2 = ((1 + s)^2 + 1) / 2`` is at least 1/2, so the denominator is at least ``(i + 1) / 2``:
no epsilon is needed. Paths: ``reference`` and ``sdpa`` (linear attention has no SDPA form) both run
:func:`taylor_linear_attention`, exact chunked cumulative sums in float32; ``triton`` runs flash-linear-attention's
``fused_chunk_based`` kernel (CUDA, ``d_f <= 16``), which computes the same quantity. :meth:`LinearAttention.step`
is the recurrent form, one token at a time, whose state (``S``, ``z``) does not grow with the context.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..standalone.linear import LinearLayer, LinearState, taylor_features
from ..variants.linear import FLA_MAX_FEATURES, LinearSpec
from .base import Attention
from .triton_bridge import AttentionImplError

if TYPE_CHECKING:
    from ..config import ModelConfig

CHUNK = 64  # query/key block of the PyTorch path: exact for any size; sets its memory and speed


def taylor_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``phi(q_i) . phi(k_j) = 1 + s + s^2 / 2``, ``s = q_i . k_j / sqrt(d_f)``: (..., Tq, d_f), (..., Tk, d_f) ->
    (..., Tq, Tk), from the dot products (without forming the features)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return 1 + s + s * s / 2


def _before_each(x: torch.Tensor) -> torch.Tensor:
    """Sums over the chunks before each chunk (dim 2; zeros for the first): the running state at its start."""
    return torch.cat([torch.zeros_like(x[:, :, :1]), x[:, :, :-1].cumsum(2)], dim=2)


def taylor_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """Causal linear attention with :func:`taylor_features`, exact, in O(T) memory for a fixed chunk.

    q, k: (B, H, T, d_f), v: (B, H, T, d_v) -> (B, H, T, d_v) in v's dtype, computed in float32. The sequence is cut
    into chunks of ``chunk`` positions: inside a chunk the causal weights come from the dot products
    (:func:`taylor_weights`, a ``chunk x chunk`` block); the earlier chunks enter through the running sums ``S`` and
    ``z`` at the chunk's start (cumulative sums of each chunk's ``phi(k)^T v`` and ``phi(k)``)."""
    out_dtype = v.dtype
    q, k, v = q.float(), k.float(), v.float()
    B, H, T, _ = q.shape
    C = min(chunk, T)
    n = -(-T // C)
    pad = n * C - T  # zero rows at the end: later than every real query, so never seen by one

    def chunks(x: torch.Tensor) -> torch.Tensor:  # (B, H, T, m) -> (B, H, n, C, m)
        return F.pad(x, (0, 0, 0, pad)).view(B, H, n, C, x.shape[-1])

    qc, kc, vc = chunks(q), chunks(k), chunks(v)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    inside = taylor_weights(qc, kc).masked_fill(~causal, 0.0)           # (B, H, n, C, C)
    fq, fk = taylor_features(qc), taylor_features(kc)                      # (B, H, n, C, D)
    S = _before_each(fk.transpose(-1, -2) @ vc)                         # (B, H, n, D, d_v)
    z = _before_each(fk.sum(-2))                                        # (B, H, n, D)
    num = inside @ vc + fq @ S
    den = inside.sum(-1) + (fq @ z[..., None]).squeeze(-1)
    out = (num / den[..., None]).view(B, H, n * C, -1)[:, :, :T]
    return out.to(out_dtype)


def fla_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The same attention by flash-linear-attention's ``fused_chunk_based`` (CUDA, d_f <= 16; it adds 1e-6 to the
    denominator, which is at least 1/2). q, k: (B, H, T, d_f), v: (B, H, T, d_v) -> (B, H, T, d_v)."""
    d_f = q.shape[-1]
    if q.device.type != "cuda":
        raise AttentionImplError(f"attention_impl 'triton' for linear attention needs a CUDA device; tensors are "
                                 f"on '{q.device}'. Use attention_impl: sdpa or reference here")
    if d_f > FLA_MAX_FEATURES:
        raise AttentionImplError(f"attention_impl 'triton' for linear attention (fla's fused_chunk_based) "
                                 f"supports linear_feature_dim <= {FLA_MAX_FEATURES}, got {d_f}; use "
                                 "attention_impl: sdpa")
    try:
        from fla.ops.based import fused_chunk_based
    except ImportError as e:
        raise AttentionImplError(f"attention_impl 'triton' for linear attention needs flash-linear-attention's "
                                 f"kernels (pip install fla-core, see requirements.txt): {e}") from e
    o = fused_chunk_based(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=d_f ** -0.5)
    return o.transpose(1, 2)


class LinearAttention(LinearLayer, Attention):
    """Causal linear attention, Based's Taylor feature map on ``linear_feature_dim`` features (module docstring).

    ``forward`` takes the un-rotated ``q, k`` from :meth:`split_heads` and rotates the features instead (RoPE in
    both the linear and the local layers, as the MSWA paper's Sec. 5.1.2 setup); :meth:`attend` therefore receives
    un-rotated ``q, k``. The parameters, the recurrent decoding form (``step``) and the cache are
    :class:`~neox_dar.standalone.linear.LinearLayer`'s.
    """

    spec = LinearSpec

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.build_variant(cfg.attention.linear_feature_dim)

    def forward(self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split_heads(a, cos[..., :0], sin[..., :0])  # rotary goes on the features (attend)
        return self.merge_heads(self.attend(q, k, v, a, cos, sin))

    def resolved_impl(self, device: torch.device) -> str:
        """``auto``: fla's kernel (``triton``) on CUDA where it takes the features (``d_f <= 16``), else the
        PyTorch chunked path (``sdpa``)."""
        if self.impl == "auto" and self.feature_dim > FLA_MAX_FEATURES:
            return "sdpa"
        return super().resolved_impl(device)

    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        fq, fk = self.features(q, k, cos, sin)
        fk, v = self.expand_kv(fk, v)
        if self.resolved_impl(q.device) == "triton":
            return fla_linear_attention(fq, fk, v)
        return taylor_linear_attention(fq, fk, v)

    # ---- inference: LinearLayer's fixed state (S, z) -----------------------------------------------------------
    def prefill(self, a, cos, sin, cache: LinearState, rows: torch.Tensor) -> torch.Tensor:
        """The training forward on prompts, whose sums ``S``, ``z`` start ``rows``' states."""
        q, k, v = self.split_heads(a, cos[..., :0], sin[..., :0])
        out = self.merge_heads(self.attend(q, k, v, a, cos, sin))
        cache.write(taylor_features(self.features(q, k, cos, sin)[1].float()), v, rows)
        return out

    # ---- costs ----------------------------------------------------------------------------------------------
    def state_numbers(self) -> int:
        """Numbers the layer keeps while decoding: ``S`` and ``z`` of every key/value head, whatever the context."""
        return self.num_kv_heads * self.feature_count() * (self.head_dim + 1)

    def attended_keys(self, seq_len: int) -> float:
        return 0.0  # no softmax over keys: the cost is the state's (extra_flops_per_token)

    def extra_flops_per_token(self) -> float:
        """Training FLOPs (3x forward) of the recurrent form: per key/value head the state update ``phi(k)^T v``
        and ``z`` (``2 D d_h + D``), per query head the read-out ``phi(q) S`` and ``phi(q) . z`` (``2 D d_h + 2 D``),
        plus the feature projections beyond the one use ``6 N`` counts (every head applies them)."""
        D, d_h, d_f, H, G = self.feature_count(), self.head_dim, self.feature_dim, self.num_heads, self.num_kv_heads
        recurrent = G * (2 * D * d_h + D) + H * (2 * D * d_h + 2 * D)
        return 3.0 * recurrent + 6.0 * d_h * d_f * (H + G - 2)

    def kv_cache_per_token(self, context: int) -> float:
        return self.state_numbers() / context

    def kv_cache_bytes_per_token(self, context: int, dtype_bytes: int) -> float:
        """The state is float32 whatever the model's dtype (:class:`~neox_dar.standalone.linear.LinearState`)."""
        return self.kv_cache_per_token(context) * 4

    def flop_notes(self, context: int) -> list[str]:
        return ["linear: counted in the recurrent (state) form; the chunked paths also weigh each query against "
                f"the earlier keys of its chunk ({CHUNK} positions on the PyTorch path)"]

    def cache_notes(self, context: int) -> list[str]:
        return [f"linear: a fixed state of {self.state_numbers():,} numbers per layer (H_kv x (1 + d_f + d_f^2) x "
                f"(d_h + 1)), whatever the context; shown per token of a {context}-token context"]
