"""Attention of each query row over its own contiguous range of cached keys: the decode step of routed attention.

``range_attention(q, k, v, lo, hi)``: query row ``(b, h, t)`` attends to the cached keys ``lo[b, h, t] ..
hi[b, h, t]`` (inclusive) of key/value head ``h // (H / H_kv)``, softmax with scale ``1/sqrt(d_h)``. AHA's decode
gives a row whose gate is open the range from its row's first real column, a closed one its last ``w`` columns, so
a step reads the last ``w`` keys of every head and the whole cache only where a gate is open; the ranges are
tensors, so nothing is synchronised with the host and the launches have fixed shapes.

Two launches (flash-decoding's split over the keys): the cache is cut into chunks of :data:`CHUNK` keys and one
program per (row, chunk) computes the online-softmax partial of the row's keys inside its chunk (a chunk outside the
row's range exits at once); a second launch merges each row's partials. Products and sums in float32, one query row
against a block of keys by broadcast multiply and sum (a single row gains nothing from ``tl.dot``); each lane of a
block keeps its own running maximum, sum and output, merged once at the end of the chunk.

Inference only (no backward). A ``torch.library`` custom op (``range_attention`` in the :data:`~kernels.runtime.OPS`
namespace) with a shape-only fake, called under torch.compile and skipped in eager mode
(:func:`~kernels.runtime.eager_or_op`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .runtime import (INTERPRET, MAX_HEAD_DIM, OPS, block_d, check_device, check_dtype, check_spans, eager_or_op,
                      new_heads, qk_scales, unit_last_dim)

CHUNK = 32 if INTERPRET else 1024
"""Keys per program of the first launch (the interpreter: small chunks, so tests cover several chunks a row)."""
BLOCK_N = 16 if INTERPRET else 64
"""Keys per block of a program's loop. On the GPU with 8 warps: no spill, 128 registers under Triton 3.9 and 180
under 3.6 (ptxas for sm_90a, bf16, d_h = 64; with 4 warps the per-lane accumulators take 241); chosen from the
compile report, not timed against other blocks."""
PARTIAL_WARPS = 1 if INTERPRET else 8


@triton.jit
def _range_partial_kernel(Q, K, V, LO, HI, M, L, ACC,
                          sq_b, sq_h, sq_t, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
                          H, T, G, NC, qk_scale, D,
                          CHUNK_: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)  # (b * H + h) * T + t
    chunk = tl.program_id(1)
    t = row % T
    h = (row // T) % H
    b = row // (T * H)
    lo = tl.load(LO + row)
    hi = tl.load(HI + row)
    first = tl.maximum(lo, chunk * CHUNK_)
    end = tl.minimum(hi + 1, (chunk + 1) * CHUNK_)  # exclusive; first >= end: nothing of this row here
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(Q + b.to(tl.int64) * sq_b + h * sq_h + t * sq_t + d, mask=dm, other=0.0).to(tl.float32) * qk_scale
    k_base = K + b.to(tl.int64) * sk_b + (h // G) * sk_h
    v_base = V + b.to(tl.int64) * sv_b + (h // G) * sv_h
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)  # per lane: running maximum (base 2), sum and output
    s = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    for start in range(first, end, BLOCK):
        keys = start + lanes
        km = keys < end
        mask = km[:, None] & dm[None, :]
        k = tl.load(k_base + keys[:, None] * sk_s + d[None, :], mask=mask, other=0.0).to(tl.float32)
        v = tl.load(v_base + keys[:, None] * sv_s + d[None, :], mask=mask, other=0.0).to(tl.float32)
        x = tl.where(km, tl.sum(k * q[None, :], axis=1), float("-inf"))
        m_new = tl.maximum(m, x)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a lane that has seen only -inf keeps s = 0
        alpha = tl.exp2(m - shift)
        p = tl.exp2(x - shift)
        s = s * alpha + p
        acc = acc * alpha[:, None] + p[:, None] * v
        m = m_new
    top = tl.max(m, axis=0)
    weight = tl.exp2(m - tl.where(top == float("-inf"), 0.0, top))
    out = row * NC + chunk
    tl.store(M + out, top)
    tl.store(L + out, tl.sum(s * weight, axis=0))
    tl.store(ACC + out.to(tl.int64) * BLOCK_D + d, tl.sum(acc * weight[:, None], axis=0))


@triton.jit
def _range_merge_kernel(M, L, ACC, O, so_b, so_h, so_t, H, T, NC, D,
                        BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    t = row % T
    h = (row // T) % H
    b = row // (T * H)
    c = tl.arange(0, BLOCK_C)
    cm = c < NC
    d = tl.arange(0, BLOCK_D)
    m = tl.load(M + row * NC + c, mask=cm, other=float("-inf"))
    l_ = tl.load(L + row * NC + c, mask=cm, other=0.0)
    acc = tl.load(ACC + (row.to(tl.int64) * NC + c[:, None]) * BLOCK_D + d[None, :], mask=cm[:, None], other=0.0)
    top = tl.max(m, axis=0)  # finite: every row reads at least one key
    w = tl.exp2(m - top)
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(l_ * w, axis=0)
    tl.store(O + b.to(tl.int64) * so_b + h * so_h + t * so_t + d, o.to(O.dtype.element_ty), mask=d < D)


def _range_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor
                     ) -> torch.Tensor:
    """:func:`range_attention` on validated inputs."""
    check_spans("range_attention", q, k, v)
    B, H, T, D = q.shape
    S = k.shape[2]
    rows, chunks, bd = B * H * T, triton.cdiv(S, CHUNK), block_d(D)
    m = torch.empty(rows * chunks, dtype=torch.float32, device=q.device)
    l_ = torch.empty_like(m)
    acc = torch.empty(rows * chunks, bd, dtype=torch.float32, device=q.device)
    _range_partial_kernel[(rows, chunks)](
        q, k, v, lo, hi, m, l_, acc, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), H, T, H // k.shape[1], chunks, qk_scales(D)[1], D,
        CHUNK_=CHUNK, BLOCK=BLOCK_N, BLOCK_D=bd, num_warps=PARTIAL_WARPS)
    o = new_heads(q)
    _range_merge_kernel[(rows,)](m, l_, acc, o, o.stride(0), o.stride(1), o.stride(2), H, T, chunks, D,
                                 BLOCK_C=triton.next_power_of_2(chunks), BLOCK_D=bd,
                                 num_warps=1 if INTERPRET else 4)
    return o


range_attention_op = torch.library.custom_op(f"{OPS}::range_attention", _range_attention, mutates_args=())


@range_attention_op.register_fake
def _(q, k, v, lo, hi):
    return new_heads(q)


def range_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor
                    ) -> torch.Tensor:
    """Row ``(b, h, t)`` of ``q`` (B, H, T, d_h) attends to keys ``lo[b, h, t] .. hi[b, h, t]`` (inclusive) of ``k``
    and ``v`` (B, H_kv, S, d_h), H_kv dividing H; ``lo``, ``hi`` int32 (B, H, T) with ``0 <= lo <= hi < S`` (not
    checked on the device: that would synchronise). Returns (B, H, T, d_h) in ``q``'s dtype, scale ``1/sqrt(d_h)``.
    """
    fn = "range_attention"
    check_device(fn, q)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError(f"{fn} is for decoding and has no backward: call it under torch.no_grad() or "
                           "torch.inference_mode() (its output carried no gradient silently)")
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or (k.shape[0], k.shape[3]) != (q.shape[0], q.shape[3]):
        raise ValueError(f"{fn}: q (B, H, T, d_h) and k, v (B, H_kv, S, d_h) expected, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[1] % k.shape[1] or k.shape[2] == 0 or not 1 <= q.shape[3] <= MAX_HEAD_DIM:
        raise ValueError(f"{fn}: need H_kv dividing H, S >= 1 and 1 <= d_h <= {MAX_HEAD_DIM}, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"{fn}: k and v must be on q's device {q.device}, got {k.device} and {v.device}")
    check_dtype(fn, q.dtype)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"{fn}: q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, r in (("lo", lo), ("hi", hi)):
        if r.dtype != torch.int32 or tuple(r.shape) != tuple(q.shape[:3]) or r.device != q.device:
            raise ValueError(f"{fn}: {name} must be int32 {tuple(q.shape[:3])} on {q.device}, got {r.dtype} "
                             f"{tuple(r.shape)} on {r.device}")
    return eager_or_op(range_attention_op, _range_attention, *unit_last_dim(q, k, v), lo.contiguous(), hi.contiguous())
