"""The banded attention kernels every entry point launches (see :mod:`kernels.tiles` for the local/far vocabulary).

Kernels (one program per tile on grid axis 0; batch x heads on axis 1):

* ``_fwd_kernel``: query tile -> output rows and base-2 LSE (FlashAttention-2 forward).
* ``_dkdv_kernel``: key tile -> ``dk``/``dv`` for both key sets, looping over the query tiles that see it.
* ``_dq_kernel``: query tile -> ``dq``, looping over the same key tiles as the forward.
* ``_far_*_gather`` kernels: the same three, but the query rows are each head's routed positions, compacted and
  sorted (AHA): the forward merges its far result into the local one by LSE, the backward adds into the local
  path's gradients.

The first three run once per group of heads whose windows share a tune bucket (``runtime.HeadWindows``): axis 1
is (batch, the group's ``G`` heads listed in ``HEADS``), and each group's launch is autotuned for its windows.

Tensors: ``q, k_*, v_*`` (B, H, T, d_h) with unit stride on d_h (other strides passed); ``o``, ``do`` and the
gradients contiguous (B, H, T, d_h); ``lse``, ``delta`` float32 (B*H, T); ``windows`` int32 (H,); ``heads``
int32 (G,); routed ``rows`` int32 (B*H, T) and ``counts`` int32 (B*H,).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .runtime import (HeadWindows, block_d, dot_precision, key_major_configs, prune_for_window, qk_scales,
                      tile_configs)
from .tiles import (dkdv_tile, dq_tile, finish_rows, fwd_tile, key_tile_query_bounds, load_row_stats, load_rows,
                    lse_merge, query_tile_key_bounds, store_rows)

# W_TUNE: the launch's window bucket (runtime.HeadGroup.tune_bucket). The kernels never read it; it is in the
# key so that each window regime (MSWA's 8 and 512, SWA, DAR) gets its own tuned tile shape.
_TUNE_KEY = ["T", "D", "W_TUNE", "HAS_LOCAL", "HAS_FAR"]
_PRUNE = {"early_config_prune": prune_for_window}
_DELTA_ROWS = 64  # rows per program of the delta kernel (a memory-bound row reduction)


# ----------------------------------------------------------------------------------------------------- row loops
@triton.jit
def attend_rows(q, pos, p_min, p_max, w, T, KL, VL, KF, VF, s_kl, s_vl, s_kf, s_vf, D: tl.constexpr,
                qk_scale,
                HAS_LOCAL: tl.constexpr, HAS_FAR: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Online softmax of rows ``pos`` (within ``[p_min, p_max]``) over every key tile they see: ``(acc, m, l)``."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    t_lo, t_far_end, t_mix_end, t_loc_hi, t_hi = query_tile_key_bounds(p_min, p_max, w, BLOCK_N, HAS_LOCAL, HAS_FAR)
    if HAS_FAR:
        for t in range(t_lo, t_far_end):
            acc, m_i, l_i = fwd_tile(acc, m_i, l_i, q, pos, t * BLOCK_N, w, T, KL, VL, KF, VF, s_kl, s_vl, s_kf, s_vf,
                                     offs_n, offs_d, D, qk_scale, False, True, False, PRECISION)
    for t in range(t_far_end, t_mix_end):
        acc, m_i, l_i = fwd_tile(acc, m_i, l_i, q, pos, t * BLOCK_N, w, T, KL, VL, KF, VF, s_kl, s_vl, s_kf, s_vf,
                                 offs_n, offs_d, D, qk_scale, HAS_LOCAL, HAS_FAR, True, PRECISION)
    if HAS_LOCAL:
        for t in range(t_mix_end, t_loc_hi):
            acc, m_i, l_i = fwd_tile(acc, m_i, l_i, q, pos, t * BLOCK_N, w, T, KL, VL, KF, VF, s_kl, s_vl, s_kf, s_vf,
                                     offs_n, offs_d, D, qk_scale, True, False, False, PRECISION)
        for t in range(t_loc_hi, t_hi):
            acc, m_i, l_i = fwd_tile(acc, m_i, l_i, q, pos, t * BLOCK_N, w, T, KL, VL, KF, VF, s_kl, s_vl, s_kf,
                                     s_vf, offs_n, offs_d, D, qk_scale, True, False, True, PRECISION)
    return acc, m_i, l_i


@triton.jit
def dq_rows(q, do, lse, delta, pos, p_min, p_max, w, T, KL, VL, KF, VF, s_kl, s_vl, s_kf, s_vf, D: tl.constexpr,
            qk_scale,
            HAS_LOCAL: tl.constexpr, HAS_FAR: tl.constexpr, PRECISION: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Unscaled ``dq`` (BLOCK_M, BLOCK_D) of rows ``pos``, over the same key tiles as :func:`attend_rows`."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    t_lo, t_far_end, t_mix_end, t_loc_hi, t_hi = query_tile_key_bounds(p_min, p_max, w, BLOCK_N, HAS_LOCAL, HAS_FAR)
    if HAS_FAR:
        for t in range(t_lo, t_far_end):
            dq = dq_tile(dq, q, do, lse, delta, pos, t * BLOCK_N, w, T, KL, VL, KF, VF, s_kl, s_vl, s_kf, s_vf,
                         offs_n, offs_d, D, qk_scale, False, True, False, PRECISION)
    for t in range(t_far_end, t_mix_end):
        dq = dq_tile(dq, q, do, lse, delta, pos, t * BLOCK_N, w, T, KL, VL, KF, VF, s_kl, s_vl, s_kf, s_vf,
                     offs_n, offs_d, D, qk_scale, HAS_LOCAL, HAS_FAR, True, PRECISION)
    if HAS_LOCAL:
        for t in range(t_mix_end, t_loc_hi):
            dq = dq_tile(dq, q, do, lse, delta, pos, t * BLOCK_N, w, T, KL, VL, KF, VF, s_kl, s_vl, s_kf, s_vf,
                         offs_n, offs_d, D, qk_scale, True, False, False, PRECISION)
        for t in range(t_loc_hi, t_hi):
            dq = dq_tile(dq, q, do, lse, delta, pos, t * BLOCK_N, w, T, KL, VL, KF, VF, s_kl, s_vl, s_kf, s_vf,
                         offs_n, offs_d, D, qk_scale, True, False, True, PRECISION)
    return dq


@triton.jit
def dkdv_rows(dkl, dvl, dkf, dvf, kl, vl, kf, vf, Q, DO, LSE, DELTA, pos, row_ok, keys, w, T, s_q, s_g,
              D: tl.constexpr, qk_scale,
              USE_LOCAL: tl.constexpr, USE_FAR: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr,
              BLOCK_D: tl.constexpr):
    """Load query rows ``pos`` (q, do, lse, delta) and add their contribution to the key tile's gradients."""
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(Q, pos, row_ok, s_q, offs_d, D)
    do = load_rows(DO, pos, row_ok, s_g, offs_d, D)
    lse, delta = load_row_stats(LSE, DELTA, pos, row_ok)
    return dkdv_tile(dkl, dvl, dkf, dvf, kl, vl, kf, vf, q, do, lse, delta, pos, keys, w, T, qk_scale,
                     USE_LOCAL, USE_FAR, MASKED, PRECISION)


@triton.jit
def launch_head(HEADS, G, H):
    """Grid axis 1 runs over (batch, the launch's G heads ``HEADS``): ``(bh, b, h)`` with ``bh = b * H + h``."""
    b = tl.program_id(1) // G
    h = tl.load(HEADS + tl.program_id(1) % G)
    return b * H + h, b, h


@triton.jit
def contiguous_rows(WIN, HEADS, G, H, T, BLOCK_M: tl.constexpr):
    """This program's rows ``m0 .. m0 + BLOCK_M``: ``(bh, b, h, w, pos, row_ok, p_min, p_max)``."""
    m0 = tl.program_id(0) * BLOCK_M
    bh, b, h = launch_head(HEADS, G, H)
    pos = m0 + tl.arange(0, BLOCK_M)
    return bh, b, h, tl.load(WIN + h), pos, pos < T, m0, tl.minimum(m0 + BLOCK_M, T) - 1


@triton.jit
def gathered_rows(ROWS, COUNTS, WIN, H, T, BLOCK_M: tl.constexpr):
    """This program's routed rows: rows ``tile * BLOCK_M ..`` of head ``bh``'s sorted list (``ROWS[bh]``, the
    first ``COUNTS[bh]`` entries valid). Returns ``(bh, b, h, w, pos, row_ok, p_min, p_max)``; a program past
    the head's count has no valid row and does no work."""
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    r = tl.arange(0, BLOCK_M)
    row_ok = r < tl.load(COUNTS + bh) - tile * BLOCK_M
    pos = tl.load(ROWS + bh * T + tile * BLOCK_M + r, mask=row_ok, other=0)
    p_min = tl.min(tl.where(row_ok, pos, T))
    p_max = tl.max(tl.where(row_ok, pos, -1))
    return bh, bh // H, bh % H, tl.load(WIN + bh % H), pos, row_ok, p_min, p_max


# ----------------------------------------------------------------------------------------------------- kernels
@triton.autotune(configs=tile_configs(small_windows=True), key=_TUNE_KEY, prune_configs_by=_PRUNE)
@triton.jit(do_not_specialize=["W_TUNE"])
def _fwd_kernel(Q, KL, VL, KF, VF, O, LSE, WIN, HEADS,
                s_qb, s_qh, s_qt, s_klb, s_klh, s_klt, s_vlb, s_vlh, s_vlt,
                s_kfb, s_kfh, s_kft, s_vfb, s_vfh, s_vft, s_gb, s_gh, s_gt,
                H, G, T, W_TUNE, D: tl.constexpr, qk_scale,
                HAS_LOCAL: tl.constexpr, HAS_FAR: tl.constexpr, PRECISION: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh, b, h, w, pos, row_ok, p_min, p_max = contiguous_rows(WIN, HEADS, G, H, T, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(Q + b * s_qb + h * s_qh, pos, row_ok, s_qt, offs_d, D)
    acc, m_i, l_i = attend_rows(q, pos, p_min, p_max, w, T,
                                KL + b * s_klb + h * s_klh, VL + b * s_vlb + h * s_vlh,
                                KF + b * s_kfb + h * s_kfh, VF + b * s_vfb + h * s_vfh,
                                s_klt, s_vlt, s_kft, s_vft, D, qk_scale, HAS_LOCAL, HAS_FAR, PRECISION,
                                BLOCK_M, BLOCK_N, BLOCK_D)
    out, lse = finish_rows(acc, m_i, l_i)
    store_rows(O + b * s_gb + h * s_gh, out, pos, row_ok, s_gt, offs_d, D)
    tl.store(LSE + bh * T + pos, lse, mask=row_ok)


@triton.autotune(configs=tile_configs(small_windows=True), key=_TUNE_KEY, prune_configs_by=_PRUNE)
@triton.jit(do_not_specialize=["W_TUNE"])
def _dq_kernel(Q, KL, VL, KF, VF, DO, LSE, DELTA, DQ, WIN, HEADS,
               s_qb, s_qh, s_qt, s_klb, s_klh, s_klt, s_vlb, s_vlh, s_vlt,
               s_kfb, s_kfh, s_kft, s_vfb, s_vfh, s_vft, s_gb, s_gh, s_gt,
               H, G, T, W_TUNE, D: tl.constexpr, sm_scale, qk_scale,
               HAS_LOCAL: tl.constexpr, HAS_FAR: tl.constexpr, PRECISION: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh, b, h, w, pos, row_ok, p_min, p_max = contiguous_rows(WIN, HEADS, G, H, T, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(Q + b * s_qb + h * s_qh, pos, row_ok, s_qt, offs_d, D)
    do = load_rows(DO + b * s_gb + h * s_gh, pos, row_ok, s_gt, offs_d, D)
    lse, delta = load_row_stats(LSE + bh * T, DELTA + bh * T, pos, row_ok)
    dq = dq_rows(q, do, lse, delta, pos, p_min, p_max, w, T,
                 KL + b * s_klb + h * s_klh, VL + b * s_vlb + h * s_vlh,
                 KF + b * s_kfb + h * s_kfh, VF + b * s_vfb + h * s_vfh,
                 s_klt, s_vlt, s_kft, s_vft, D, qk_scale, HAS_LOCAL, HAS_FAR, PRECISION, BLOCK_M, BLOCK_N, BLOCK_D)
    store_rows(DQ + b * s_gb + h * s_gh, dq * sm_scale, pos, row_ok, s_gt, offs_d, D)


@triton.autotune(configs=key_major_configs(small_windows=True), key=_TUNE_KEY, prune_configs_by=_PRUNE)
@triton.jit(do_not_specialize=["W_TUNE"])
def _dkdv_kernel(Q, KL, VL, KF, VF, DO, LSE, DELTA, DKL, DVL, DKF, DVF, WIN, HEADS,
                 s_qb, s_qh, s_qt, s_klb, s_klh, s_klt, s_vlb, s_vlh, s_vlt,
                 s_kfb, s_kfh, s_kft, s_vfb, s_vfh, s_vft, s_gb, s_gh, s_gt,
                 H, G, T, W_TUNE, D: tl.constexpr, sm_scale, qk_scale,
                 HAS_LOCAL: tl.constexpr, HAS_FAR: tl.constexpr, PRECISION: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tl.static_assert(HAS_LOCAL, "contiguous-row backward always has the local path")
    n0 = tl.program_id(0) * BLOCK_N
    bh, b, h = launch_head(HEADS, G, H)
    w = tl.load(WIN + h)
    keys = n0 + tl.arange(0, BLOCK_N)
    key_ok = keys < T
    offs_d = tl.arange(0, BLOCK_D)
    offs_m = tl.arange(0, BLOCK_M)
    kl = load_rows(KL + b * s_klb + h * s_klh, keys, key_ok, s_klt, offs_d, D)
    vl = load_rows(VL + b * s_vlb + h * s_vlh, keys, key_ok, s_vlt, offs_d, D)
    if HAS_FAR:
        kf = load_rows(KF + b * s_kfb + h * s_kfh, keys, key_ok, s_kft, offs_d, D)
        vf = load_rows(VF + b * s_vfb + h * s_vfh, keys, key_ok, s_vft, offs_d, D)
    else:
        kf = kl
        vf = vl
    dkl = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dvl = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dkf = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dvf = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    Qp = Q + b * s_qb + h * s_qh
    DOp = DO + b * s_gb + h * s_gh
    LSEp = LSE + bh * T
    DELTAp = DELTA + bh * T
    t_lo, t_diag_end, t_loc_end, t_far_lo, t_hi = key_tile_query_bounds(n0, w, T, BLOCK_M, BLOCK_N, HAS_FAR)
    for t in range(t_lo, t_diag_end):
        pos = t * BLOCK_M + offs_m
        dkl, dvl, dkf, dvf = dkdv_rows(dkl, dvl, dkf, dvf, kl, vl, kf, vf, Qp, DOp, LSEp, DELTAp, pos, pos < T, keys,
                                       w, T, s_qt, s_gt, D, qk_scale, True, False, True, PRECISION, BLOCK_D)
    for t in range(t_diag_end, t_loc_end):
        pos = t * BLOCK_M + offs_m
        dkl, dvl, dkf, dvf = dkdv_rows(dkl, dvl, dkf, dvf, kl, vl, kf, vf, Qp, DOp, LSEp, DELTAp, pos, pos < T, keys,
                                       w, T, s_qt, s_gt, D, qk_scale, True, False, False, PRECISION, BLOCK_D)
    for t in range(t_loc_end, t_far_lo):
        pos = t * BLOCK_M + offs_m
        dkl, dvl, dkf, dvf = dkdv_rows(dkl, dvl, dkf, dvf, kl, vl, kf, vf, Qp, DOp, LSEp, DELTAp, pos, pos < T, keys,
                                       w, T, s_qt, s_gt, D, qk_scale, True, HAS_FAR, True, PRECISION, BLOCK_D)
    if HAS_FAR:
        for t in range(t_far_lo, t_hi):
            pos = t * BLOCK_M + offs_m
            dkl, dvl, dkf, dvf = dkdv_rows(dkl, dvl, dkf, dvf, kl, vl, kf, vf, Qp, DOp, LSEp, DELTAp, pos, pos < T,
                                           keys, w, T, s_qt, s_gt, D, qk_scale, False, True, False, PRECISION, BLOCK_D)
    g_off = b * s_gb + h * s_gh
    store_rows(DKL + g_off, dkl * sm_scale, keys, key_ok, s_gt, offs_d, D)
    store_rows(DVL + g_off, dvl, keys, key_ok, s_gt, offs_d, D)
    if HAS_FAR:
        store_rows(DKF + g_off, dkf * sm_scale, keys, key_ok, s_gt, offs_d, D)
        store_rows(DVF + g_off, dvf, keys, key_ok, s_gt, offs_d, D)


@triton.autotune(configs=tile_configs(), key=["T", "D"], restore_value=["O", "LSE"])
@triton.jit
def _far_fwd_gather_kernel(Q, K, V, O, LSE, WIN, ROWS, COUNTS,
                           s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_gb, s_gh, s_gt,
                           H, T, D: tl.constexpr, qk_scale,
                           PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr):
    """Far keys (``i - j >= w``) for the compacted rows, merged by LSE into ``O``/``LSE`` (the local result)."""
    bh, b, h, w, pos, row_ok, p_min, p_max = gathered_rows(ROWS, COUNTS, WIN, H, T, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(Q + b * s_qb + h * s_qh, pos, row_ok, s_qt, offs_d, D)
    Kp = K + b * s_kb + h * s_kh
    Vp = V + b * s_vb + h * s_vh
    acc, m_i, l_i = attend_rows(q, pos, p_min, p_max, w, T, Kp, Vp, Kp, Vp, s_kt, s_vt, s_kt, s_vt, D, qk_scale,
                                False, True, PRECISION, BLOCK_M, BLOCK_N, BLOCK_D)
    o_far, lse_far = finish_rows(acc, m_i, l_i)
    Op = O + b * s_gb + h * s_gh
    o_loc = load_rows(Op, pos, row_ok, s_gt, offs_d, D).to(tl.float32)
    lse_loc = tl.load(LSE + bh * T + pos, mask=row_ok, other=float("-inf"))
    out, lse = lse_merge(o_loc, lse_loc, o_far, lse_far)
    store_rows(Op, out, pos, row_ok, s_gt, offs_d, D)
    tl.store(LSE + bh * T + pos, lse, mask=row_ok)


@triton.autotune(configs=tile_configs(), key=["T", "D"], restore_value=["DQ"])
@triton.jit
def _far_dq_gather_kernel(Q, K, V, DO, LSE, DELTA, DQ, WIN, ROWS, COUNTS,
                          s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_gb, s_gh, s_gt,
                          H, T, D: tl.constexpr, sm_scale, qk_scale,
                          PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    """Adds the far keys' part of ``dq`` for the compacted rows into ``DQ``."""
    bh, b, h, w, pos, row_ok, p_min, p_max = gathered_rows(ROWS, COUNTS, WIN, H, T, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(Q + b * s_qb + h * s_qh, pos, row_ok, s_qt, offs_d, D)
    g_off = b * s_gb + h * s_gh
    do = load_rows(DO + g_off, pos, row_ok, s_gt, offs_d, D)
    lse, delta = load_row_stats(LSE + bh * T, DELTA + bh * T, pos, row_ok)
    Kp = K + b * s_kb + h * s_kh
    Vp = V + b * s_vb + h * s_vh
    dq = dq_rows(q, do, lse, delta, pos, p_min, p_max, w, T, Kp, Vp, Kp, Vp, s_kt, s_vt, s_kt, s_vt, D, qk_scale,
                 False, True, PRECISION, BLOCK_M, BLOCK_N, BLOCK_D)
    dq_prev = load_rows(DQ + g_off, pos, row_ok, s_gt, offs_d, D).to(tl.float32)
    store_rows(DQ + g_off, dq_prev + dq * sm_scale, pos, row_ok, s_gt, offs_d, D)


@triton.autotune(configs=key_major_configs(), key=["T", "D"], restore_value=["DK", "DV"])
@triton.jit
def _far_dkdv_gather_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, WIN, ROWS, COUNTS,
                            s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_gb, s_gh, s_gt,
                            H, T, D: tl.constexpr, sm_scale, qk_scale,
                            PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr):
    """Adds the compacted rows' far-pair gradients into the key tile's ``DK``/``DV``.

    Rows of one (b, h) are sorted by position, so the rows with a far pair in this key tile (``pos >= n0 + w``)
    are a suffix of that head's list, found by binary search: the program reads only routed rows that need it.
    """
    n0 = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    w = tl.load(WIN + h)
    lo = bh * T
    row_end = lo + tl.load(COUNTS + bh)
    hi = row_end
    target = n0 + w
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(ROWS + mid) < target:
            lo = mid + 1
        else:
            hi = mid
    if lo < row_end:
        keys = n0 + tl.arange(0, BLOCK_N)
        key_ok = keys < T
        offs_d = tl.arange(0, BLOCK_D)
        offs_m = tl.arange(0, BLOCK_M)
        k = load_rows(K + b * s_kb + h * s_kh, keys, key_ok, s_kt, offs_d, D)
        v = load_rows(V + b * s_vb + h * s_vh, keys, key_ok, s_vt, offs_d, D)
        dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        Qp = Q + b * s_qb + h * s_qh
        g_off = b * s_gb + h * s_gh
        for r0 in range(lo, row_end, BLOCK_M):
            rr = r0 + offs_m
            row_ok = rr < row_end
            pos = tl.load(ROWS + rr, mask=row_ok, other=0)
            local_dk, local_dv, dk, dv = dkdv_rows(dk, dv, dk, dv, k, v, k, v, Qp, DO + g_off, LSE + bh * T,
                                                   DELTA + bh * T,
                                       pos, row_ok, keys, w, T, s_qt, s_gt, D, qk_scale, False, True, True,
                                       PRECISION, BLOCK_D)
        dk_prev = load_rows(DK + g_off, keys, key_ok, s_gt, offs_d, D).to(tl.float32)
        dv_prev = load_rows(DV + g_off, keys, key_ok, s_gt, offs_d, D).to(tl.float32)
        store_rows(DK + g_off, dk_prev + dk * sm_scale, keys, key_ok, s_gt, offs_d, D)
        store_rows(DV + g_off, dv_prev + dv, keys, key_ok, s_gt, offs_d, D)


@triton.jit
def _delta_kernel(O, DO, DELTA, T, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """``DELTA[bh, i] = sum_d O[bh, i, d] * DO[bh, i, d]`` in float32 for one tile of rows (contiguous inputs)."""
    bh = tl.program_id(1)
    pos = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = pos < T
    offs_d = tl.arange(0, BLOCK_D)
    o = load_rows(O + bh * T * D, pos, row_ok, D, offs_d, D).to(tl.float32)
    do = load_rows(DO + bh * T * D, pos, row_ok, D, offs_d, D).to(tl.float32)
    tl.store(DELTA + bh * T + pos, tl.sum(o * do, axis=1), mask=row_ok)


# ----------------------------------------------------------------------------------------------------- launchers
def _s3(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def banded_forward(q, k_loc, v_loc, k_far, v_far, windows: HeadWindows, has_local: bool, has_far: bool):
    """Banded attention forward over contiguous rows. Returns ``o`` (B, H, T, d_h) contiguous, ``lse`` (B*H, T)."""
    B, H, T, D = q.shape
    o = torch.empty((B, H, T, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B * H, T), dtype=torch.float32, device=q.device)
    _, qk_scale = qk_scales(D)
    for heads, bucket in windows.groups:
        G = heads.numel()
        _fwd_kernel[lambda m, G=G: (triton.cdiv(T, m["BLOCK_M"]), B * G)](
            q, k_loc, v_loc, k_far, v_far, o, lse, windows.values, heads,
            *_s3(q), *_s3(k_loc), *_s3(v_loc), *_s3(k_far), *_s3(v_far), *_s3(o), H, G, T, bucket, D, qk_scale,
            HAS_LOCAL=has_local, HAS_FAR=has_far, PRECISION=dot_precision(q.dtype), BLOCK_D=block_d(D))
    return o, lse


def row_deltas(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """``delta = rowsum(o * do)`` in float32, (B*H, T): the softmax-backward correction (FlashAttention-2).

    ``o``, ``do``: contiguous (B, H, T, d_h). One pass that reads each once (no float32 copies of either).
    """
    B, H, T, D = o.shape
    delta = torch.empty((B * H, T), dtype=torch.float32, device=o.device)
    _delta_kernel[(triton.cdiv(T, _DELTA_ROWS), B * H)](o, do, delta, T, D, BLOCK_M=_DELTA_ROWS, BLOCK_D=block_d(D))
    return delta


def banded_backward(q, k_loc, v_loc, k_far, v_far, lse, delta, do, windows: HeadWindows, has_far: bool,
                    grad_dtype=None):
    """Gradients of the banded forward (local path on). ``do`` contiguous (B, H, T, d_h); ``delta`` from
    :func:`row_deltas`.

    Returns ``(dq, dk_loc, dv_loc, dk_far, dv_far)``; the far pair is ``None`` unless ``has_far``. ``grad_dtype``
    (default: the input dtype) lets a caller keep float32 gradients to add more into them.
    """
    B, H, T, D = q.shape
    dtype = grad_dtype or q.dtype
    new = lambda: torch.empty((B, H, T, D), dtype=dtype, device=q.device)  # noqa: E731
    dq, dkl, dvl = new(), new(), new()
    dkf, dvf = (new(), new()) if has_far else (dkl, dvl)
    sm_scale, qk_scale = qk_scales(D)
    strides = (*_s3(q), *_s3(k_loc), *_s3(v_loc), *_s3(k_far), *_s3(v_far), *_s3(dq))
    meta = dict(HAS_LOCAL=True, HAS_FAR=has_far, PRECISION=dot_precision(q.dtype), BLOCK_D=block_d(D))
    for heads, bucket in windows.groups:
        G = heads.numel()
        _dkdv_kernel[lambda m, G=G: (triton.cdiv(T, m["BLOCK_N"]), B * G)](
            q, k_loc, v_loc, k_far, v_far, do, lse, delta, dkl, dvl, dkf, dvf, windows.values, heads, *strides,
            H, G, T, bucket, D, sm_scale, qk_scale, **meta)
        _dq_kernel[lambda m, G=G: (triton.cdiv(T, m["BLOCK_M"]), B * G)](
            q, k_loc, v_loc, k_far, v_far, do, lse, delta, dq, windows.values, heads, *strides,
            H, G, T, bucket, D, sm_scale, qk_scale, **meta)
    if has_far:
        return dq, dkl, dvl, dkf, dvf
    return dq, dkl, dvl, None, None


def far_forward_gathered(q, k, v, o, lse, windows: HeadWindows, rows, counts):
    """Add the far part of the routed rows (:func:`kernels.aha.route_rows`) into ``o``/``lse`` in place (LSE merge
    with the local result). One program per (row tile, head); a tile past a head's count does no work."""
    B, H, T, D = q.shape
    _, qk_scale = qk_scales(D)
    _far_fwd_gather_kernel[lambda m: (triton.cdiv(T, m["BLOCK_M"]), B * H)](
        q, k, v, o, lse, windows.values, rows, counts, *_s3(q), *_s3(k), *_s3(v), *_s3(o), H, T, D, qk_scale,
        PRECISION=dot_precision(q.dtype), BLOCK_D=block_d(D))


def far_backward_gathered(q, k, v, do, lse, delta, dq, dk, dv, windows: HeadWindows, rows, counts):
    """Add the far pairs' gradients of the routed rows into ``dq``, ``dk``, ``dv`` (contiguous like ``do``)."""
    B, H, T, D = q.shape
    sm_scale, qk_scale = qk_scales(D)
    strides = (*_s3(q), *_s3(k), *_s3(v), *_s3(dq))
    meta = dict(PRECISION=dot_precision(q.dtype), BLOCK_D=block_d(D))
    _far_dkdv_gather_kernel[lambda m: (triton.cdiv(T, m["BLOCK_N"]), B * H)](
        q, k, v, do, lse, delta, dk, dv, windows.values, rows, counts, *strides, H, T, D, sm_scale, qk_scale, **meta)
    _far_dq_gather_kernel[lambda m: (triton.cdiv(T, m["BLOCK_M"]), B * H)](
        q, k, v, do, lse, delta, dq, windows.values, rows, counts, *strides, H, T, D, sm_scale, qk_scale, **meta)
