"""DAR's decode step over its compressed cache: the far keys' softmax summaries read from ``c`` once per step.

A far key of DAR's cache (:class:`neox_dar.standalone.dar.DARCache`) is ``c = dar_down(h)`` (``d_c`` numbers, shared
by every head) plus, per key/value head, the ``width`` dims of the key that cannot be absorbed into the query
(rotated; ``kr``). Query head ``h``'s score against far column ``j`` is

    ``s[h, j] = qc[h] . c[j] + qr[h] . kr[h // G, j] + qb[h]``

with ``qc`` the absorbed query (``d_c``), ``qr`` its rotated dims and ``qb`` its bias term (``G`` query heads per
key/value head). :func:`dar_far_attention` returns, per query row, the softmax summaries of its far columns
``lo .. hi - 1``: the maximum ``m`` of ``scale * s``, ``l = sum_j exp(scale * s_j - m)`` and
``acc = sum_j exp(scale * s_j - m) c_j`` (``d_c``): the caller merges them with the near window's scores under one
softmax and applies the value side (``A_v acc + b_v l``).

One program per (batch row, query token, chunk of :data:`CHUNK` columns) holds every head: each block of columns
loads ``c`` and ``kr`` once for all heads (a head-major kernel would read ``c`` once per head), the scores are two
``tl.dot`` products (``qc`` against ``c``; ``qr`` laid out block-diagonally over the key/value heads against the
columns' ``kr`` of all heads) and ``acc`` a third. The chunks' summaries are merged by the caller
(:func:`merge_chunks`). Inference only (no backward), eager only (no custom op).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .runtime import INTERPRET, check_device

CHUNK = 32 if INTERPRET else 512
"""Columns per program (the interpreter: small chunks, so tests cover several chunks a row). On a GPU, 512: a
batch of 16 at context 8k makes 256 programs, enough to keep every streaming multiprocessor reading (a choice by
occupancy, not yet timed against others)."""
BLOCK_N = 16 if INTERPRET else 64
"""Columns per block of a program's loop."""
MAX_DIMS = 256
"""The widest ``d_c`` and ``H_kv x width`` a launch takes (each is one register tile of the program): Pythia's
shapes up to 410M (``d_down = d / 4 <= 256``; ``H x rotary dims = d / 4``)."""
WARPS = 1 if INTERPRET else 8
"""Warps per program. ptxas for sm_90a (bf16, Pythia-160M's shape, ``bench/attention.py --compile-only``; Triton
3.9): 64-column blocks with 8 warps use 178 registers and spill nothing, with 4 warps 255 registers and spill 24
bytes (32-column blocks: 174 with 4 warps, 168 with 8, no spill). Chosen from the report, not timed."""


@triton.jit
def _far_kernel(QC, QR, QB, C, KR, LO, HI, M, L, ACC,
                sqc_r, sqc_h, sqr_r, sqr_h, sc_b, sc_s, skr_b, skr_h, skr_s,
                T, H, G, DC, WIDTH, NC, qk_scale,
                HAS_QC: tl.constexpr, HAS_KR: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_DC: tl.constexpr,
                BLOCK_DK: tl.constexpr, CHUNK_: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # b * T + t
    chunk = tl.program_id(1)
    b = row // T
    lo = tl.load(LO + row)
    hi = tl.load(HI + row)
    first = tl.maximum(lo, chunk * CHUNK_)
    end = tl.minimum(hi, (chunk + 1) * CHUNK_)  # exclusive
    heads = tl.arange(0, BLOCK_H)
    hm = heads < H
    dc = tl.arange(0, BLOCK_DC)
    dcm = dc < DC
    dk = tl.arange(0, BLOCK_DK)
    kv_of_dim = dk // tl.maximum(WIDTH, 1)
    dkm = dk < WIDTH * (H // G)
    lanes = tl.arange(0, BLOCK)
    row64 = row.to(tl.int64)
    if HAS_QC:
        qc = tl.load(QC + row64 * sqc_r + heads[:, None] * sqc_h + dc[None, :], mask=hm[:, None] & dcm[None, :],
                     other=0.0)
    if HAS_KR:  # each head's rotated dims in its key/value head's slot, zeros elsewhere
        own = hm[:, None] & dkm[None, :] & (kv_of_dim[None, :] == (heads // G)[:, None])
        qr = tl.load(QR + row64 * sqr_r + heads[:, None] * sqr_h + (dk % tl.maximum(WIDTH, 1))[None, :], mask=own,
                     other=0.0)
    qb = tl.load(QB + row64 * H + heads, mask=hm, other=0.0) * qk_scale
    c_base = C + b.to(tl.int64) * sc_b
    kr_base = KR + b.to(tl.int64) * skr_b + kv_of_dim * skr_h + dk % tl.maximum(WIDTH, 1)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DC], tl.float32)
    for start in range(first, end, BLOCK):
        cols = start + lanes
        cm = cols < end
        c = tl.load(c_base + cols[:, None] * sc_s + dc[None, :], mask=cm[:, None] & dcm[None, :], other=0.0)
        x = tl.zeros([BLOCK_H, BLOCK], tl.float32)
        if HAS_QC:
            x += tl.dot(qc, tl.trans(c))
        if HAS_KR:
            kr = tl.load(kr_base[None, :] + cols[:, None] * skr_s, mask=cm[:, None] & dkm[None, :], other=0.0)
            x += tl.dot(qr, tl.trans(kr))
        x = tl.where(cm[None, :], x * qk_scale + qb[:, None], float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - shift)
        p = tl.exp2(x - shift[:, None])
        s = s * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c)
        m = m_new
    out = (row64 * NC + chunk) * BLOCK_H + heads
    tl.store(M + out, m)
    tl.store(L + out, s)
    tl.store(ACC + out[:, None] * BLOCK_DC + dc[None, :], acc)


def merge_chunks(m: torch.Tensor, l_: torch.Tensor, acc: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge per-chunk summaries ``m``, ``l`` (..., NC, H) and ``acc`` (..., NC, H, d) along the chunks -> (..., H),
    (..., H), (..., H, d). ``m`` base 2 in, natural log out; a row without columns keeps ``m = -inf``, ``l = 0``,
    ``acc = 0``."""
    top = m.amax(-2, keepdim=True)
    w = torch.exp2(m - torch.where(top == float("-inf"), 0.0, top))  # 0 for an empty chunk
    return (top.squeeze(-2) * math.log(2.0), (l_ * w).sum(-2), (acc * w[..., None]).sum(-3))


def fits(d_c: int, rotated: int) -> bool:
    """Whether a layer with ``d_c`` absorbed dims and ``rotated`` = ``H_kv x width`` rotated dims per far column fits
    one launch (:data:`MAX_DIMS`)."""
    return d_c <= MAX_DIMS and rotated <= MAX_DIMS


def dar_far_attention(qc: torch.Tensor | None, qr: torch.Tensor | None, qb: torch.Tensor, c: torch.Tensor,
                      kr: torch.Tensor | None, lo: torch.Tensor, hi: torch.Tensor, scale: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax summaries of each query row over its far columns ``lo .. hi - 1`` (module docstring).

    ``qc`` (B, T, H, d_c) or None (no absorbed dims); ``qr`` (B, T, H, width) or None (``width = 0``); ``qb``
    (B, T, H) float32 (the bias term; zeros without a key bias); ``c`` (B, S, d_c) with unit stride on d_c (the
    cache's storage, any row strides); ``kr`` (B, H_kv, S, width) or None; ``lo``, ``hi`` int32 (B, T) with
    ``0 <= lo``, ``hi <= S`` (not checked on the device); queries and cache in one dtype (float16, bfloat16,
    float32). Returns ``m`` (B, T, H) float32 (natural log; ``-inf`` for a row without far columns), ``l`` (B, T, H)
    and ``acc`` (B, T, H, d_c) float32, for scores times ``scale``."""
    fn = "dar_far_attention"
    check_device(fn, c)
    B, S, DC = c.shape
    T, H = qb.shape[1], qb.shape[2]
    if (qc is None) == (qr is None) and qc is None:
        raise ValueError(f"{fn}: need qc or qr (some dims of the far keys)")
    width = 0 if qr is None else qr.shape[-1]
    Hk = 1 if kr is None else kr.shape[1]
    if (qr is None) != (kr is None) or (kr is not None and (kr.shape[0], kr.shape[2], kr.shape[3]) != (B, S, width)):
        raise ValueError(f"{fn}: qr and kr come together, kr (B, H_kv, S, width) = ({B}, H_kv, {S}, {width})")
    if H % Hk:
        raise ValueError(f"{fn}: key/value heads ({Hk}) must divide query heads ({H})")
    for name, t in (("qc", qc), ("qr", qr), ("kr", kr)):
        if t is not None and (t.dtype != c.dtype or t.device != c.device or t.stride(-1) != 1):
            raise ValueError(f"{fn}: {name} must share c's dtype and device with unit stride on its last dim")
    if qc is not None and tuple(qc.shape) != (B, T, H, DC):
        raise ValueError(f"{fn}: qc must be (B, T, H, d_c) = {(B, T, H, DC)}, got {tuple(qc.shape)}")
    if not fits(DC, Hk * width):
        raise ValueError(f"{fn}: d_c = {DC} and H_kv x width = {Hk * width} must each be at most {MAX_DIMS}")
    nc = triton.cdiv(S, CHUNK)
    bh = max(16, triton.next_power_of_2(H))
    bdc = max(16, triton.next_power_of_2(DC))
    bdk = max(16, triton.next_power_of_2(max(1, Hk * width)))
    m = torch.empty(B * T * nc * bh, dtype=torch.float32, device=c.device)
    l_ = torch.empty_like(m)
    acc = torch.empty(B * T * nc * bh, bdc, dtype=torch.float32, device=c.device)
    qc_ = c if qc is None else qc.reshape(B * T, H, DC)
    qr_ = c if qr is None else qr.reshape(B * T, H, width)
    kr_ = c.unsqueeze(1) if kr is None else kr
    _far_kernel[(B * T, nc)](
        qc_, qr_, qb.contiguous(), c, kr_, lo.contiguous(), hi.contiguous(), m, l_, acc,
        qc_.stride(0) if qc is not None else 0, qc_.stride(1) if qc is not None else 0,
        qr_.stride(0) if qr is not None else 0, qr_.stride(1) if qr is not None else 0,
        c.stride(0), c.stride(1), kr_.stride(0), kr_.stride(1), kr_.stride(2),
        T, H, H // Hk, DC, width, nc, scale * math.log2(math.e),
        HAS_QC=qc is not None, HAS_KR=kr is not None, BLOCK_H=bh, BLOCK_DC=bdc, BLOCK_DK=bdk, CHUNK_=CHUNK,
        BLOCK=BLOCK_N, num_warps=WARPS)
    top, total, summed = merge_chunks(m.view(B, T, nc, bh), l_.view(B, T, nc, bh), acc.view(B, T, nc, bh, bdc))
    return top[..., :H], total[..., :H], summed[..., :H, :DC]
