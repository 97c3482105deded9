"""Triton device functions shared by every kernel: tile loops' bounds and one tile of forward / backward work.

Vocabulary (all kernels): a *row* is a query position ``i``, a *key* is a position ``j``, ``delta = i - j``.
A pair ``(i, j)`` with ``0 <= delta`` is *local* when ``delta < w`` and *far* when ``delta >= w``. Every kernel is
this one "banded" attention with two flags:

* ``HAS_LOCAL``: local pairs score ``q_i . k_loc_j`` and read ``v_loc_j``;
* ``HAS_FAR``: far pairs score ``q_i . k_far_j`` and read ``v_far_j``.

DAR uses both (``k_far = k_glob``), SWA/MSWA and AHA's local pass use local only, AHA's routed rows use far only
with ``w = 0`` (every causal pair is "far": full attention). Scores are kept in base 2
(``qk_scale = log2(e) / sqrt(d_h)``), so the saved log-sum-exp is ``lse2 = log2(sum_j exp2(s_ij))``; an empty row
has ``lse2 = -inf`` and output 0.

Every tile reads ONE key/value set: a tile is *pure* (every pair in one region, no mask) or *masked* (the
diagonal, and the tiles that straddle ``delta = w``). A DAR tile that straddles the boundary is visited twice,
once per key set, each pass masked to its own region (the same number of matrix products as one pass that
computes both and selects per element), so no tile keeps both key sets or two score tiles live: registers and
shared memory are sized for one key set.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_col_mask(row_ok, offs_d, D: tl.constexpr):
    """(BLOCK, BLOCK_D) mask: valid rows, and columns ``< D`` only when ``D`` is not the tile width."""
    if D == offs_d.shape[0]:
        mask = row_ok[:, None] & (offs_d[None, :] >= 0)
    else:
        mask = row_ok[:, None] & (offs_d[None, :] < D)
    return mask


@triton.jit
def load_rows(base, pos, row_ok, stride_t, offs_d, D: tl.constexpr):
    """Load rows ``pos`` (BLOCK,) of a (T, D) slab with row stride ``stride_t`` -> (BLOCK, BLOCK_D), zeros outside."""
    return tl.load(base + pos[:, None] * stride_t + offs_d[None, :], mask=row_col_mask(row_ok, offs_d, D), other=0.0)


@triton.jit
def store_rows(base, val, pos, row_ok, stride_t, offs_d, D: tl.constexpr):
    """Store (BLOCK, BLOCK_D) ``val`` to rows ``pos`` of a (T, D) slab."""
    tl.store(base + pos[:, None] * stride_t + offs_d[None, :], val.to(base.dtype.element_ty),
             mask=row_col_mask(row_ok, offs_d, D))


@triton.jit
def region_mask(pos, keys, w, T, LOCAL: tl.constexpr, KEY_MAJOR: tl.constexpr = False):
    """Pairs of rows ``pos`` (M,) and keys ``keys`` (N,) that are causal, have a key ``< T`` and lie in the pass's
    region (``0 <= delta < w`` if ``LOCAL`` else ``delta >= w``): bool (M, N), or (N, M) if ``KEY_MAJOR``."""
    if KEY_MAJOR:
        delta = pos[None, :] - keys[:, None]
        ok = (delta >= 0) & (keys[:, None] < T)
    else:
        delta = pos[:, None] - keys[None, :]
        ok = (delta >= 0) & (keys[None, :] < T)
    if LOCAL:
        ok = ok & (delta < w)
    else:
        ok = ok & (delta >= w)
    return ok


@triton.jit
def query_tile_key_bounds(p_min, p_max, w, BLOCK_N: tl.constexpr, HAS_LOCAL: tl.constexpr, HAS_FAR: tl.constexpr):
    """Key-tile index segments, in key order, for a query tile whose rows lie in ``[p_min, p_max]``.

    Returns ``(t_lo, t_far_end, t_mix_end, t_loc_hi, t_hi)``:
    ``[t_lo, t_far_end)`` pure far (every key ``<= p_min - w``), ``[t_far_end, t_mix_end)`` straddling
    ``i - j = w`` (masked, once per enabled path), ``[t_mix_end, t_loc_hi)`` pure local, ``[t_loc_hi, t_hi)``
    masked local-only (the diagonal: every pair within the window, causal mask). Without the far path the loop
    starts at the tile holding key ``p_min - w + 1``, so a sliding-window program's work is ~ its window, not ~ T.
    """
    if HAS_LOCAL:
        t_hi = tl.cdiv(p_max + 1, BLOCK_N)
    else:
        t_hi = tl.cdiv(tl.maximum(p_max - w + 1, 0), BLOCK_N)
    if HAS_FAR:
        t_lo = t_hi * 0
        t_far_end = tl.minimum(tl.maximum(p_min - w + 1, 0) // BLOCK_N, t_hi)
    else:
        t_lo = tl.maximum(p_min - w + 1, 0) // BLOCK_N
        if w <= 0:
            t_hi = t_lo
        t_far_end = t_lo
    if HAS_LOCAL:
        t_mix_end = tl.minimum(tl.maximum(tl.cdiv(tl.maximum(p_max - w + 1, 0), BLOCK_N), t_far_end), t_hi)
        t_loc_hi = tl.minimum(tl.maximum((p_min + 1) // BLOCK_N, t_mix_end), t_hi)
    else:
        t_mix_end = t_hi
        t_loc_hi = t_hi
    return t_lo, t_far_end, t_mix_end, t_loc_hi, t_hi


@triton.jit
def key_tile_query_bounds(n0, w, T, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_FAR: tl.constexpr):
    """Query-tile index segments, in row order, for the key tile ``[n0, n0 + BLOCK_N)`` (contiguous rows).

    Returns ``(t_lo, t_diag_end, t_loc_end, t_far_lo, t_hi)``: ``[t_lo, t_diag_end)`` masked local-only (the
    diagonal, every pair within the window), ``[t_diag_end, t_loc_end)`` pure local, ``[t_loc_end, t_far_lo)``
    straddling (masked, once per enabled path), ``[t_far_lo, t_hi)`` pure far.
    """
    t_lo = n0 // BLOCK_M
    if HAS_FAR:
        t_hi = tl.cdiv(T, BLOCK_M)
    else:
        t_hi = tl.cdiv(tl.minimum(T, n0 + BLOCK_N - 1 + w), BLOCK_M)
        if w <= 0:
            t_hi = t_lo
    t_loc_end = tl.minimum(tl.maximum((n0 + w) // BLOCK_M, t_lo), t_hi)  # below: max(i - j) < w
    t_diag_end = tl.minimum(tl.maximum(tl.cdiv(n0 + BLOCK_N - 1, BLOCK_M), t_lo), t_loc_end)  # below: not causal
    if HAS_FAR:
        t_far_lo = tl.minimum(tl.maximum(tl.cdiv(n0 + BLOCK_N - 1 + w, BLOCK_M), t_loc_end), t_hi)
    else:
        t_far_lo = t_hi
    return t_lo, t_diag_end, t_loc_end, t_far_lo, t_hi


@triton.jit
def fwd_tile(acc, m_i, l_i, q, pos, n0, w, T, K, V, s_kt, s_vt, offs_n, offs_d, D: tl.constexpr, qk_scale,
             LOCAL: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """One key tile of one key set in the online-softmax forward: returns the updated ``(acc, m_i, l_i)``
    (base-2 running max). ``MASKED`` keeps only the pairs of the pass's region (``LOCAL`` or far)."""
    keys = n0 + offs_n
    k = load_rows(K, keys, keys < T, s_kt, offs_d, D)
    v = load_rows(V, keys, keys < T, s_vt, offs_d, D)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    if MASKED:
        s = tl.where(region_mask(pos, keys, w, T, LOCAL), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def finish_rows(acc, m_i, l_i):
    """Normalized output rows and their base-2 LSE (``-inf`` and zeros for a row that scored no key)."""
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    return out, lse


@triton.jit
def load_lse_delta(LSE, DELTA, pos, row_ok):
    """Rows ``pos`` of one head's base-2 LSE and ``delta`` (float32): ``(lse, delta)``, the LSE ``+inf`` for an empty
    row (saved as ``-inf``) or one past ``T``, so that every probability of that row is 0; ``delta`` 0 there."""
    lse = tl.load(LSE + pos, mask=row_ok, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    return lse, tl.load(DELTA + pos, mask=row_ok, other=0.0)


@triton.jit
def bwd_tile(dk, dv, k, v, Q, DO, LSE, DELTA, DQ, pos, row_ok, keys, w, T, s_qt, s_dot, s_dqt, offs_d,
             D: tl.constexpr, sm_scale, qk_scale,
             LOCAL: tl.constexpr, MASKED: tl.constexpr, ATOMIC_DQ: tl.constexpr, PRECISION: tl.constexpr):
    """One query tile's part of the backward for one key tile and one key set (FlashAttention-2's products).

    ``k, v``: (BLOCK_N, BLOCK_D) key tile; rows ``pos`` (BLOCK_M,) of one query head, read here (``q``, ``do``,
    ``lse``, ``delta``). Returns the key tile's unscaled ``dk`` (multiply by ``1/sqrt(d_h)`` at the end) and
    ``dv`` accumulators. With ``ATOMIC_DQ`` (five products) the rows' ``dq`` part is added to the float32 ``DQ``
    rows with atomic adds; without it (four products) ``dq`` is left to the query-major pass (:func:`dq_tile`).
    """
    q = load_rows(Q, pos, row_ok, s_qt, offs_d, D)
    do = load_rows(DO, pos, row_ok, s_dot, offs_d, D)
    lse, delta = load_lse_delta(LSE, DELTA, pos, row_ok)
    pt = tl.exp2(tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale - lse[None, :])  # (N, M)
    if MASKED:
        pt = tl.where(region_mask(pos, keys, w, T, LOCAL, KEY_MAJOR=True), pt, 0.0)
    dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
    dst = pt * (dpt - delta[None, :])
    dv += tl.dot(pt.to(q.dtype), do, input_precision=PRECISION)
    dk += tl.dot(dst.to(q.dtype), q, input_precision=PRECISION)
    if ATOMIC_DQ:
        dq = tl.dot(tl.trans(dst.to(k.dtype)), k, input_precision=PRECISION) * sm_scale
        tl.atomic_add(DQ + pos[:, None] * s_dqt + offs_d[None, :], dq, mask=row_col_mask(row_ok, offs_d, D),
                      sem="relaxed")
    return dk, dv


@triton.jit
def dq_tile(dq, q, do, lse, delta, pos, n0, w, T, K, V, s_kt, s_vt, offs_n, offs_d, D: tl.constexpr, qk_scale,
            LOCAL: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """One key tile of one key set in the query-major ``dq`` pass (three products): returns ``dq`` plus the tile's
    ``dS @ K``, unscaled (multiply by ``1/sqrt(d_h)`` at the end). ``q``, ``do``: the rows (BLOCK_M, BLOCK_D);
    ``lse``: their base-2 LSE with ``+inf`` for an empty row or one past ``T``; ``delta``: ``rowsum(o * do)``."""
    keys = n0 + offs_n
    k = load_rows(K, keys, keys < T, s_kt, offs_d, D)
    v = load_rows(V, keys, keys < T, s_vt, offs_d, D)
    p = tl.exp2(tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale - lse[:, None])
    if MASKED:
        p = tl.where(region_mask(pos, keys, w, T, LOCAL), p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    ds = p * (dp - delta[:, None])
    return dq + tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
