"""Triton device functions shared by every kernel: tile loops' bounds, one tile of forward / backward work, LSE merge.

Vocabulary (all kernels): a *row* is a query position ``i``, a *key* is a position ``j``, ``delta = i - j``.
A pair ``(i, j)`` with ``0 <= delta`` is *local* when ``delta < w`` and *far* when ``delta >= w``. Every kernel is
this one "banded" attention with two flags:

* ``USE_LOCAL``: local pairs score ``q_i . k_loc_j`` and read ``v_loc_j``;
* ``USE_FAR``: far pairs score ``q_i . k_far_j`` and read ``v_far_j``.

DAR uses both (``k_far = k_glob``), SWA/MSWA and AHA's local path use local only, AHA's far path uses far only
(``k_far = k``). Scores are kept in base 2 (``qk_scale = log2(e) / sqrt(d_h)``), so the saved log-sum-exp is
``lse2 = log2(sum_j exp2(s_ij))``; an empty row has ``lse2 = -inf`` and output 0.

Tiles come in four kinds: *pure far* (every pair far, no mask), *pure local* (every pair local and causal, no
mask), *masked local* (the diagonal: every pair within the window, causal mask) and *masked* (the tiles that
straddle ``delta = w``: per-element select; only these load both key/value sets when both flags are set).
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
def pair_masks(pos, keys, w, T, USE_LOCAL: tl.constexpr, USE_FAR: tl.constexpr, KEY_MAJOR: tl.constexpr = False):
    """For rows ``pos`` (M,) and keys ``keys`` (N,): ``(ok, is_local)``, each (M, N), or (N, M) if ``KEY_MAJOR``.

    ``ok``: the pair is scored (causal, key exists, and in a region the flags enable); ``is_local``: ``delta < w``.
    """
    if KEY_MAJOR:
        delta = pos[None, :] - keys[:, None]
        key_ok = keys[:, None] < T
    else:
        delta = pos[:, None] - keys[None, :]
        key_ok = keys[None, :] < T
    is_local = delta < w
    ok = (delta >= 0) & key_ok
    if not USE_FAR:
        ok = ok & is_local
    if not USE_LOCAL:
        ok = ok & (delta >= w)
    return ok, is_local


@triton.jit
def query_tile_key_bounds(p_min, p_max, w, BLOCK_N: tl.constexpr, HAS_LOCAL: tl.constexpr, HAS_FAR: tl.constexpr):
    """Key-tile index segments, in key order, for a query tile whose rows lie in ``[p_min, p_max]``.

    Returns ``(t_lo, t_far_end, t_mix_end, t_loc_hi, t_hi)``:
    ``[t_lo, t_far_end)`` pure far (every key ``<= p_min - w``), ``[t_far_end, t_mix_end)`` masked with both
    paths (straddles ``i - j = w``), ``[t_mix_end, t_loc_hi)`` pure local, ``[t_loc_hi, t_hi)`` masked local-only
    (the diagonal: every pair within the window, causal mask only). Without the far path the loop starts at the
    tile holding key ``p_min - w + 1``, so a sliding-window program's work is ~ its window, not ~ T.
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
    masked with both paths, ``[t_far_lo, t_hi)`` pure far.
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
def load_key_tile(KL, VL, KF, VF, keys, key_ok, s_kl, s_vl, s_kf, s_vf, offs_d, D: tl.constexpr,
                  USE_LOCAL: tl.constexpr, USE_FAR: tl.constexpr):
    """Key/value rows ``keys`` of the enabled paths -> ``(kl, vl, kf, vf)``; a disabled path aliases the other."""
    if USE_LOCAL:
        kl = load_rows(KL, keys, key_ok, s_kl, offs_d, D)
        vl = load_rows(VL, keys, key_ok, s_vl, offs_d, D)
    if USE_FAR:
        kf = load_rows(KF, keys, key_ok, s_kf, offs_d, D)
        vf = load_rows(VF, keys, key_ok, s_vf, offs_d, D)
    if not USE_LOCAL:
        kl = kf
        vl = vf
    if not USE_FAR:
        kf = kl
        vf = vl
    return kl, vl, kf, vf


@triton.jit
def pair_dots(x, yl, yf, is_local, USE_LOCAL: tl.constexpr, USE_FAR: tl.constexpr, PRECISION: tl.constexpr):
    """(M, N) products ``x_i . y_j`` with ``y = yl`` for local pairs and ``yf`` for far ones (float32)."""
    if USE_LOCAL:
        d_loc = tl.dot(x, tl.trans(yl), input_precision=PRECISION)
    if USE_FAR:
        d_far = tl.dot(x, tl.trans(yf), input_precision=PRECISION)
    if USE_LOCAL and USE_FAR:
        out = tl.where(is_local, d_loc, d_far)
    elif USE_LOCAL:
        out = d_loc
    else:
        out = d_far
    return out


@triton.jit
def tile_scores(q, pos, keys, w, T, kl, kf, qk_scale,
                USE_LOCAL: tl.constexpr, USE_FAR: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """Base-2 scores (M, N) of rows ``pos`` against a key tile (``-inf`` where masked) and ``is_local`` (M, N).

    Only masked tiles may enable both paths: there each pair takes ``q.k_loc`` or ``q.k_far`` by ``i - j < w``.
    """
    tl.static_assert(MASKED or not (USE_LOCAL and USE_FAR), "only masked tiles read both paths")
    ok, is_local = pair_masks(pos, keys, w, T, USE_LOCAL, USE_FAR)
    s = pair_dots(q, kl, kf, is_local, USE_LOCAL, USE_FAR, PRECISION) * qk_scale
    if MASKED:
        s = tl.where(ok, s, float("-inf"))
    return s, is_local


@triton.jit
def split_dot(p, is_local, vl, vf, USE_LOCAL: tl.constexpr, USE_FAR: tl.constexpr, PRECISION: tl.constexpr):
    """``sum_j p_ij x_j`` (M, BLOCK_D) in float32, where ``x`` is ``vl`` for local pairs and ``vf`` for far ones."""
    if USE_LOCAL and USE_FAR:
        p_loc = tl.where(is_local, p, 0.0)
        out = tl.dot(p_loc.to(vl.dtype), vl, input_precision=PRECISION)
        out += tl.dot((p - p_loc).to(vf.dtype), vf, input_precision=PRECISION)
    elif USE_LOCAL:
        out = tl.dot(p.to(vl.dtype), vl, input_precision=PRECISION)
    else:
        out = tl.dot(p.to(vf.dtype), vf, input_precision=PRECISION)
    return out


@triton.jit
def fwd_tile(acc, m_i, l_i, q, pos, n0, w, T, KL, VL, KF, VF, s_kl, s_vl, s_kf, s_vf, offs_n, offs_d,
             D: tl.constexpr, qk_scale,
             USE_LOCAL: tl.constexpr, USE_FAR: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """One key tile of the online-softmax forward: returns the updated ``(acc, m_i, l_i)`` (base-2 running max)."""
    keys = n0 + offs_n
    kl, vl, kf, vf = load_key_tile(KL, VL, KF, VF, keys, keys < T, s_kl, s_vl, s_kf, s_vf, offs_d, D,
                                   USE_LOCAL, USE_FAR)
    s, is_local = tile_scores(q, pos, keys, w, T, kl, kf, qk_scale, USE_LOCAL, USE_FAR, MASKED, PRECISION)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + split_dot(p, is_local, vl, vf, USE_LOCAL, USE_FAR, PRECISION)
    return acc, m_new, l_i


@triton.jit
def finish_rows(acc, m_i, l_i):
    """Normalized output rows and their base-2 LSE (``-inf`` and zeros for a row that scored no key)."""
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    return out, lse


@triton.jit
def lse_merge(o_a, lse_a, o_b, lse_b):
    """Merge two attention results over disjoint key sets: ``(o, lse)`` of the union (base-2 LSE, -inf = empty)."""
    m = tl.maximum(lse_a, lse_b)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp2(lse_a - m_safe)
    wb = tl.exp2(lse_b - m_safe)
    tot = wa + wb
    empty = tot == 0.0
    tot_safe = tl.where(empty, 1.0, tot)
    o = (o_a * wa[:, None] + o_b * wb[:, None]) / tot_safe[:, None]
    lse = tl.where(empty, float("-inf"), m_safe + tl.log2(tot_safe))
    return o, lse


@triton.jit
def load_row_stats(LSE, DELTA, pos, row_ok):
    """Saved LSE (base 2) and ``delta = rowsum(o * do)`` for rows ``pos``; empty or invalid rows get ``lse = +inf``
    so that every probability recomputed from them is 0."""
    lse = tl.load(LSE + pos, mask=row_ok, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    delta = tl.load(DELTA + pos, mask=row_ok, other=0.0)
    return lse, delta


@triton.jit
def dkdv_tile(dkl, dvl, dkf, dvf, kl, vl, kf, vf, q, do, lse, delta, pos, keys, w, T, qk_scale,
              USE_LOCAL: tl.constexpr, USE_FAR: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """One query tile's contribution to a key tile's gradients (key-major, FlashAttention-2 style).

    ``kl, vl, kf, vf``: (BLOCK_N, BLOCK_D) key tile; ``q, do``: (BLOCK_M, BLOCK_D); ``lse, delta``: (BLOCK_M,).
    Accumulates unscaled ``dk`` (multiply by ``1/sqrt(d_h)`` at the end) and ``dv``; returns all four accumulators.
    """
    tl.static_assert(MASKED or not (USE_LOCAL and USE_FAR), "only masked tiles read both paths")
    if MASKED:
        ok_t, loc_t = pair_masks(pos, keys, w, T, USE_LOCAL, USE_FAR, KEY_MAJOR=True)
    if USE_LOCAL:
        st_loc = tl.dot(kl, tl.trans(q), input_precision=PRECISION) * qk_scale
        dpt_loc = tl.dot(vl, tl.trans(do), input_precision=PRECISION)
    if USE_FAR:
        st_far = tl.dot(kf, tl.trans(q), input_precision=PRECISION) * qk_scale
        dpt_far = tl.dot(vf, tl.trans(do), input_precision=PRECISION)
    if USE_LOCAL and USE_FAR:
        st = tl.where(loc_t, st_loc, st_far)
        dpt = tl.where(loc_t, dpt_loc, dpt_far)
    elif USE_LOCAL:
        st = st_loc
        dpt = dpt_loc
    else:
        st = st_far
        dpt = dpt_far
    pt = tl.exp2(st - lse[None, :])
    if MASKED:
        pt = tl.where(ok_t, pt, 0.0)
    dst = pt * (dpt - delta[None, :])
    if USE_LOCAL and USE_FAR:
        pt_loc = tl.where(loc_t, pt, 0.0)
        dst_loc = tl.where(loc_t, dst, 0.0)
        dvl += tl.dot(pt_loc.to(q.dtype), do, input_precision=PRECISION)
        dvf += tl.dot((pt - pt_loc).to(q.dtype), do, input_precision=PRECISION)
        dkl += tl.dot(dst_loc.to(q.dtype), q, input_precision=PRECISION)
        dkf += tl.dot((dst - dst_loc).to(q.dtype), q, input_precision=PRECISION)
    elif USE_LOCAL:
        dvl += tl.dot(pt.to(q.dtype), do, input_precision=PRECISION)
        dkl += tl.dot(dst.to(q.dtype), q, input_precision=PRECISION)
    else:
        dvf += tl.dot(pt.to(q.dtype), do, input_precision=PRECISION)
        dkf += tl.dot(dst.to(q.dtype), q, input_precision=PRECISION)
    return dkl, dvl, dkf, dvf


@triton.jit
def dq_tile(dq, q, do, lse, delta, pos, n0, w, T, KL, VL, KF, VF, s_kl, s_vl, s_kf, s_vf, offs_n, offs_d,
            D: tl.constexpr, qk_scale,
            USE_LOCAL: tl.constexpr, USE_FAR: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """One key tile's contribution to a query tile's unscaled ``dq`` (BLOCK_M, BLOCK_D), query-major."""
    keys = n0 + offs_n
    kl, vl, kf, vf = load_key_tile(KL, VL, KF, VF, keys, keys < T, s_kl, s_vl, s_kf, s_vf, offs_d, D,
                                   USE_LOCAL, USE_FAR)
    s, is_local = tile_scores(q, pos, keys, w, T, kl, kf, qk_scale, USE_LOCAL, USE_FAR, MASKED, PRECISION)
    p = tl.exp2(s - lse[:, None])
    ds = p * (pair_dots(do, vl, vf, is_local, USE_LOCAL, USE_FAR, PRECISION) - delta[:, None])
    return dq + split_dot(ds, is_local, kl, kf, USE_LOCAL, USE_FAR, PRECISION)
