"""DAR's decode step over its compressed cache: the far columns read once for all heads, then the step's output.

A far key of DAR's cache (:class:`neox_dar.standalone.dar.DARCache`) is ``c = dar_down(h)`` (``d_c`` numbers, shared
by every head) plus, per key/value head, the ``width`` dims of the key that cannot be absorbed into the query
(rotated; ``kr``). Query head ``h``'s score against far column ``j`` is

    ``s[h, j] = qc[h] . c[j] + qr[h] . kr[h // G, j] + qb[h]``

with ``qc`` the absorbed query (``d_c``), ``qr`` its rotated dims and ``qb`` its bias term (``G`` query heads per
key/value head); the value side is absorbed too: ``sum_j p_j v_glob_j = A_v (sum_j p_j c_j) + b_v sum_j p_j``.
:func:`dar_decode_attention` computes a step's output from the window's scores and values and the far columns
``lo .. hi - 1`` of each query row, under one softmax, in two launches:

* ``_far_kernel``: one program per (batch row, query token, chunk of :data:`CHUNK` columns) holds every head: each
  block of columns loads ``c`` and ``kr`` once for all heads (a head-major kernel would read ``c`` once per head),
  the scores are two ``tl.dot`` products (``qc`` against ``c``; ``qr`` laid out block-diagonally over the key/value
  heads against the columns' ``kr`` of all heads) and the chunk's ``sum_j exp(s_j - m) c_j`` a third; it writes
  the chunk's maximum, sum and that vector per head;
* ``_finish_kernel``: one program per (batch row, query token, head) merges the chunks with the window's scores
  (one softmax), weights the window's values and applies ``A_v`` and ``b_v`` to the far part.

Float32 products follow PyTorch's float32 matmul precision as the other kernels do (``runtime.dot_precision``).
Inference only (no backward), eager only (no custom op).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .runtime import INTERPRET, block_d, check_device, check_dtype, dot_precision

CHUNK = 32 if INTERPRET else 512
"""Columns per program (the interpreter: small chunks, so tests cover several chunks a row). On a GPU, 512: a
batch of 16 at context 8k makes 256 programs, enough to keep every streaming multiprocessor reading (a choice by
occupancy, not yet timed against others)."""
BLOCK_N = 16 if INTERPRET else 32
"""Columns per block of a program's loop (see :data:`WARPS`)."""
STEP = 16 if INTERPRET else 32
"""Window columns and ``c`` dims per step of ``_finish_kernel``'s loops."""
FINISH_WARPS = 1 if INTERPRET else 4
"""Warps per ``_finish_kernel`` program (one head's row: vectors of at most 256, blocks of STEP x d_h)."""
MAX_DIMS, MAX_HEADS = 256, 16
"""The widest ``d_c`` and ``H_kv x width``, and the most query heads, a launch takes (a program holds each width
times the heads as one register tile, compiled spill-free at 16 x 256): Pythia's shapes up to 410M
(``d_down = d / 4 <= 256``; ``H x rotary dims = d / 4``; 16 heads)."""
WARPS = 1 if INTERPRET else 8
"""Warps per ``_far_kernel`` program. ptxas for sm_90a (bf16, Pythia-160M's shape, ``bench/attention.py
--compile-only``): 32-column blocks with 8 warps spill nothing under Triton 3.6 (the GPU machine's; 208 registers)
and 3.9 (168), where 64-column blocks with 8 warps spill 44 bytes under 3.6 (255 registers; none under 3.9) and
with 4 warps spill under both (32-column blocks with 4 warps: 256 bytes under 3.6). Chosen from the reports, not
timed."""


@triton.jit
def _far_kernel(QC, QR, QB, C, KR, LO, HI, M, L, ACC,
                sqc_r, sqc_h, sqr_r, sqr_h, sc_b, sc_s, skr_b, skr_h, skr_s,
                T, H, G, DC, WIDTH, NC, qk_scale,
                HAS_QC: tl.constexpr, HAS_KR: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_DC: tl.constexpr,
                BLOCK_DK: tl.constexpr, CHUNK_: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr):
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
            x += tl.dot(qc, tl.trans(c), input_precision=PRECISION)
        if HAS_KR:
            kr = tl.load(kr_base[None, :] + cols[:, None] * skr_s, mask=cm[:, None] & dkm[None, :], other=0.0)
            x += tl.dot(qr, tl.trans(kr), input_precision=PRECISION)
        x = tl.where(cm[None, :], x * qk_scale + qb[:, None], float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - shift)
        p = tl.exp2(x - shift[:, None])
        s = s * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision=PRECISION)
        m = m_new
    out = (row64 * NC + chunk) * BLOCK_H + heads
    tl.store(M + out, m)
    tl.store(L + out, s)
    tl.store(ACC + out[:, None] * BLOCK_DC + dc[None, :], acc)


@triton.jit
def _finish_kernel(M, L, ACC, NS, V, AV, BV, O,
                   sns_b, sns_h, sns_r, sv_b, sv_h, sv_s, so_b, so_h, so_t,
                   T, H, G, NC, W, DC, D, scale,
                   HAS_NEAR: tl.constexpr, HAS_BV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
                   BLOCK_W: tl.constexpr, BLOCK_DC: tl.constexpr, STEP: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)  # (b * T + t) * H + h
    h = pid % H
    bt = pid // H
    t = bt % T
    b = bt // T
    kv = h // G
    chunks = tl.arange(0, BLOCK_C)
    cm = chunks < NC
    part = (bt.to(tl.int64) * NC + chunks) * BLOCK_H + h  # (BLOCK_C,) rows of the far kernel's partials
    m_c = tl.load(M + part, mask=cm, other=float("-inf"))  # base 2
    top = tl.max(m_c, axis=0) * 0.6931471805599453  # natural log
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    out = tl.zeros([BLOCK_D], tl.float32)
    total = 0.0
    if HAS_NEAR:  # the window's scores: the maximum first, then the values a block of STEP columns at a time
        ns_row = NS + b.to(tl.int64) * sns_b + kv * sns_h + ((h % G) * T + t) * sns_r
        j = tl.arange(0, BLOCK_W)
        s = tl.load(ns_row + j, mask=j < W, other=float("-inf")) * scale
        top = tl.maximum(top, tl.max(s, axis=0))
        total = tl.sum(tl.exp(s - top), axis=0)
        js = tl.arange(0, STEP)
        v_row = V + b.to(tl.int64) * sv_b + kv * sv_h
        for j0 in range(0, W, STEP):
            jm = j0 + js < W
            p = tl.exp(tl.load(ns_row + j0 + js, mask=jm, other=float("-inf")) * scale - top)
            v = tl.load(v_row + (j0 + js)[:, None] * sv_s + d[None, :], mask=jm[:, None] & dm[None, :],
                        other=0.0).to(tl.float32)
            out += tl.sum(p[:, None] * v, axis=0)
    w_c = tl.exp2(m_c - top * 1.4426950408889634)  # 0 for an empty chunk
    l_far = tl.sum(tl.load(L + part, mask=cm, other=0.0) * w_c, axis=0)
    total += l_far
    i = tl.arange(0, STEP)
    for d0 in range(0, BLOCK_DC, STEP):
        im = d0 + i < DC
        acc = tl.load(ACC + part[:, None] * BLOCK_DC + d0 + i[None, :], mask=cm[:, None] & im[None, :], other=0.0)
        acc = tl.sum(acc * w_c[:, None], axis=0)  # (STEP,): sum_j exp(s_j - top) c_j over these dims
        av = tl.load(AV + (kv.to(tl.int64) * DC + d0 + i[:, None]) * D + d[None, :], mask=im[:, None] & dm[None, :],
                     other=0.0).to(tl.float32)
        out += tl.sum(acc[:, None] * av, axis=0)
    if HAS_BV:
        out += l_far * tl.load(BV + kv * D + d, mask=dm, other=0.0).to(tl.float32)
    tl.store(O + b.to(tl.int64) * so_b + h * so_h + t * so_t + d, (out / total).to(O.dtype.element_ty), mask=dm)


def fits(d_c: int, rotated: int, heads: int) -> bool:
    """Whether a layer with ``d_c`` absorbed dims and ``rotated`` = ``H_kv x width`` rotated dims per far column and
    ``heads`` query heads fits one launch (:data:`MAX_DIMS`, :data:`MAX_HEADS`)."""
    return d_c <= MAX_DIMS and rotated <= MAX_DIMS and heads <= MAX_HEADS


def dar_decode_attention(qc: torch.Tensor | None, qr: torch.Tensor | None, qb: torch.Tensor, c: torch.Tensor,
                         kr: torch.Tensor | None, lo: torch.Tensor, hi: torch.Tensor, near: torch.Tensor | None,
                         near_v: torch.Tensor | None, a_v: torch.Tensor, b_v: torch.Tensor | None, scale: float
                         ) -> torch.Tensor:
    """DAR's decode step for ``T`` new query tokens (module docstring) -> ``o`` (B, H, T, d_h) in ``c``'s dtype.

    Far columns: ``qc`` (B, T, H, d_c) or None (no absorbed dims); ``qr`` (B, T, H, width) or None (``width = 0``);
    ``qb`` (B, T, H) float32 (the key bias's term; zeros without one); ``c`` (B, S, d_c) with unit stride on d_c (the
    cache's storage, any row strides); ``kr`` (B, H_kv, S, width) or None; ``lo``, ``hi`` int32 (B, T): each query's
    far columns ``lo .. hi - 1`` (``0 <= lo``, ``hi <= S``, not checked on the device). Window: ``near`` (B, H_kv,
    G T, W) float32, the unscaled scores of the window's ``W`` columns (``-inf`` where not allowed; row ``r T + t``
    is query head ``kv G + r`` at token ``t``), ``near_v`` (B, H_kv, W, d_h) their values, both None without a
    window. Value side: ``a_v`` (H_kv, d_c, d_h) contiguous, ``b_v`` (H_kv, 1, d_h) or None. Every query needs at
    least one column (far or near). Scores times ``scale``; queries and cache in one dtype (float16, bfloat16,
    float32)."""
    fn = "dar_decode_attention"
    check_device(fn, c)
    check_dtype(fn, c.dtype)
    if c.dim() != 3 or c.stride(-1) != 1:
        raise ValueError(f"{fn}: c must be (B, S, d_c) with unit stride on d_c, got shape {tuple(c.shape)}, strides "
                         f"{c.stride()}")
    B, S, DC = c.shape
    if qb.dtype != torch.float32 or qb.dim() != 3 or qb.shape[0] != B or qb.device != c.device:
        raise ValueError(f"{fn}: qb must be float32 (B, T, H) with B = {B} on {c.device}, got {qb.dtype} "
                         f"{tuple(qb.shape)} on {qb.device}")
    T, H = qb.shape[1], qb.shape[2]
    if a_v.dim() != 3:
        raise ValueError(f"{fn}: a_v must be (H_kv, d_c, d_h), got shape {tuple(a_v.shape)}")
    Hk, _, D = a_v.shape
    if qc is None and qr is None:
        raise ValueError(f"{fn}: need qc or qr (some dims of the far keys)")
    if qr is not None and (qr.dim() != 4 or tuple(qr.shape[:3]) != (B, T, H)):
        raise ValueError(f"{fn}: qr must be (B, T, H, width) with (B, T, H) = {(B, T, H)}, got {tuple(qr.shape)}")
    for name, r in (("lo", lo), ("hi", hi)):
        if r.dtype != torch.int32 or tuple(r.shape) != (B, T) or r.device != c.device:
            raise ValueError(f"{fn}: {name} must be int32 {(B, T)} on {c.device}, got {r.dtype} {tuple(r.shape)} on "
                             f"{r.device}")
    if b_v is not None and tuple(b_v.shape) != (Hk, 1, D):
        raise ValueError(f"{fn}: b_v must be (H_kv, 1, d_h) = {(Hk, 1, D)}, got {tuple(b_v.shape)}")
    width = 0 if qr is None else qr.shape[-1]
    if (qr is None) != (kr is None) or (kr is not None and tuple(kr.shape) != (B, Hk, S, width)):
        raise ValueError(f"{fn}: qr and kr come together, kr (B, H_kv, S, width) = ({B}, {Hk}, {S}, {width})")
    if H % Hk or tuple(a_v.shape) != (Hk, DC, D) or not a_v.is_contiguous():
        raise ValueError(f"{fn}: a_v must be contiguous (H_kv, d_c, d_h) with H_kv dividing the {H} query heads")
    if (near is None) != (near_v is None) or (near is not None and (
            near.dtype != torch.float32 or near.shape[:3] != (B, Hk, H // Hk * T)
            or tuple(near_v.shape) != (B, Hk, near.shape[3], D))):
        raise ValueError(f"{fn}: near (B, H_kv, G T, W) float32 and near_v (B, H_kv, W, d_h) come together")
    for name, t in (("qc", qc), ("qr", qr), ("kr", kr), ("near", near), ("near_v", near_v), ("b_v", b_v),
                    ("a_v", a_v)):
        if t is not None and (t.device != c.device or t.stride(-1) != 1 or (name != "near" and t.dtype != c.dtype)):
            raise ValueError(f"{fn}: {name} must be on c's device, in its dtype (near: float32), with unit stride "
                             "on its last dim")
    if qc is not None and tuple(qc.shape) != (B, T, H, DC):
        raise ValueError(f"{fn}: qc must be (B, T, H, d_c) = {(B, T, H, DC)}, got {tuple(qc.shape)}")
    if not fits(DC, Hk * width, H):
        raise ValueError(f"{fn}: d_c = {DC} and H_kv x width = {Hk * width} must each be at most {MAX_DIMS}, the "
                         f"query heads ({H}) at most {MAX_HEADS}")
    nc = triton.cdiv(S, CHUNK)
    bdc = block_d(DC)
    m = torch.empty(B * T * nc * MAX_HEADS, dtype=torch.float32, device=c.device)
    l_ = torch.empty_like(m)
    acc = torch.empty(B * T * nc * MAX_HEADS, bdc, dtype=torch.float32, device=c.device)
    qc_ = c if qc is None else qc.reshape(B * T, H, DC)
    qr_ = c if qr is None else qr.reshape(B * T, H, width)
    kr_ = c.unsqueeze(1) if kr is None else kr
    _far_kernel[(B * T, nc)](
        qc_, qr_, qb.contiguous(), c, kr_, lo.contiguous(), hi.contiguous(), m, l_, acc,
        qc_.stride(0) if qc is not None else 0, qc_.stride(1) if qc is not None else 0,
        qr_.stride(0) if qr is not None else 0, qr_.stride(1) if qr is not None else 0,
        c.stride(0), c.stride(1), kr_.stride(0), kr_.stride(1), kr_.stride(2),
        T, H, H // Hk, DC, width, nc, scale * math.log2(math.e),
        HAS_QC=qc is not None, HAS_KR=kr is not None, BLOCK_H=MAX_HEADS, BLOCK_DC=bdc,
        BLOCK_DK=block_d(Hk * width), CHUNK_=CHUNK, BLOCK=BLOCK_N,
        PRECISION=dot_precision(c.dtype, c.device), num_warps=WARPS)
    o = torch.empty((B, T, H, D), dtype=c.dtype, device=c.device).transpose(1, 2)  # the model's merged layout
    W = 0 if near is None else near.shape[3]
    ns, nv = (m, c.unsqueeze(1)) if near is None else (near, near_v)
    _finish_kernel[(B * T * H,)](
        m, l_, acc, ns, nv, a_v, a_v if b_v is None else b_v, o,
        *(ns.stride(i) if near is not None else 0 for i in range(3)), nv.stride(0), nv.stride(1), nv.stride(2),
        o.stride(0), o.stride(1), o.stride(2), T, H, H // Hk, nc, W, DC, D, scale,
        HAS_NEAR=near is not None, HAS_BV=b_v is not None, BLOCK_H=MAX_HEADS,
        BLOCK_C=max(16, triton.next_power_of_2(nc)), BLOCK_W=max(16, triton.next_power_of_2(W)), BLOCK_DC=bdc,
        STEP=min(STEP, bdc), BLOCK_D=block_d(D), num_warps=FINISH_WARPS)
    return o
