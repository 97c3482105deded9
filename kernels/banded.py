"""The banded attention kernels every entry point launches (see :mod:`kernels.tiles` for the local/far vocabulary).

Kernels:

* ``_fwd_kernel``: one program per query tile and query head -> output rows and base-2 LSE (FlashAttention-2
  forward). Grid ``(query tiles, B x G x R)``, the heaviest (last) query tiles of each head first.
* ``_bwd_kernel``: one program per key tile and key/value head -> ``dk``/``dv`` of each key set, looping over the
  query heads of the key/value head and the query tiles that see the key tile; each visited query tile's ``dq``
  part goes to a float32 accumulator by atomic adds (FlashAttention-2's backward: five matrix products per tile
  pair, no separate ``dq`` pass). DAR finishes and stores the local key set's gradients before it loads the
  far set. With ``ROUTED`` (AHA) it also visits the far pairs of the head's routed rows, into the same
  accumulators, so ``dk``/``dv`` are stored once.
* ``_routed_fwd_kernel`` (AHA): the routed rows of each head, compacted and sorted, attend to every causal key;
  their output and LSE overwrite the local pass's.
* ``_delta_kernel``: ``delta = rowsum(o * do)``, zeroing the ``dq`` accumulator in the same pass.

The banded kernels run once per group of key/value heads whose windows share a tune bucket
(``runtime.HeadWindows``); after tuning, groups with the same tile shape share a launch (``runtime.tuned_launch``).

Tensors: ``q`` (B, H, T, d_h); ``k_*, v_*`` (B, H_kv, T, d_h), query head ``h`` reading key/value head
``h // R`` (R = H // H_kv, grouped-query attention); any strides with unit stride on d_h, ``do`` included.
Outputs are (B, heads, T, d_h) views of (B, T, heads, d_h) storage (``runtime.new_heads``). ``lse``, ``delta``
float32 (B*H, T); ``windows`` int32 (H,), per query head; ``KV_HEADS`` int32 (G,); routed ``rows`` int32
(B*H, T) and ``counts`` int32 (B*H,).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .runtime import (HeadWindows, block_d, dot_precision, key_major_configs, new_heads, prune_for_window,
                      qk_scales, s3, seq_bucket, tile_configs, tuned_launch)
from .tiles import (bwd_tile, finish_rows, fwd_tile, key_tile_query_bounds, load_rows, query_tile_key_bounds,
                    store_rows)

# T_TUNE: the sequence length's bucket (runtime.seq_bucket); W_TUNE: the launch's window bucket
# (runtime.HeadGroup.tune_bucket); G: key/value heads per launch; R: query heads per key/value head. The kernels
# never read T_TUNE or W_TUNE (not specialized); they are in the key so that each window regime (MSWA's 8 and
# 512, SWA, DAR) and each launch size gets its own tuned tile, and a new T tunes again only past a power of two.
_FWD_KEY = ["T_TUNE", "D", "W_TUNE", "G", "R", "HAS_LOCAL", "HAS_FAR"]
_BWD_KEY = ["T_TUNE", "D", "W_TUNE", "G", "R", "HAS_FAR", "ROUTED"]
_PRUNE = {"early_config_prune": prune_for_window}
_DELTA_ROWS = 64  # rows per program of the delta kernel (a memory-bound row reduction)


# ----------------------------------------------------------------------------------------------------- row loops
@triton.jit
def key_tiles(acc, m_i, l_i, q, pos, t_from, t_to, w, T, K, V, s_kt, s_vt, offs_n, offs_d, D: tl.constexpr,
              qk_scale, LOCAL: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr, BLOCK_N: tl.constexpr):
    """:func:`fwd_tile` over key tiles ``t_from .. t_to - 1`` of one key set."""
    for t in range(t_from, t_to):
        acc, m_i, l_i = fwd_tile(acc, m_i, l_i, q, pos, t * BLOCK_N, w, T, K, V, s_kt, s_vt, offs_n, offs_d, D,
                                 qk_scale, LOCAL, MASKED, PRECISION)
    return acc, m_i, l_i


@triton.jit
def attend_rows(q, pos, p_min, p_max, w, T, KL, VL, KF, VF, s_klt, s_vlt, s_kft, s_vft, D: tl.constexpr,
                qk_scale,
                HAS_LOCAL: tl.constexpr, HAS_FAR: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Online softmax of rows ``pos`` (within ``[p_min, p_max]``) over every key tile they see: ``(acc, m, l)``.
    The far key set's tiles first (pure, then the straddling ones masked to far pairs), then the local set's
    (straddling masked to local pairs, pure, diagonal)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    t_lo, t_far_end, t_mix_end, t_loc_hi, t_hi = query_tile_key_bounds(p_min, p_max, w, BLOCK_N, HAS_LOCAL, HAS_FAR)
    if HAS_FAR:
        acc, m_i, l_i = key_tiles(acc, m_i, l_i, q, pos, t_lo, t_far_end, w, T, KF, VF, s_kft, s_vft, offs_n, offs_d,
                                  D, qk_scale, False, False, PRECISION, BLOCK_N)
        acc, m_i, l_i = key_tiles(acc, m_i, l_i, q, pos, t_far_end, t_mix_end, w, T, KF, VF, s_kft, s_vft, offs_n,
                                  offs_d, D, qk_scale, False, True, PRECISION, BLOCK_N)
    if HAS_LOCAL:
        t_mix_lo = t_far_end
        if w <= 0:  # no local pair: the straddling tiles hold far pairs only
            t_mix_lo = t_mix_end
        acc, m_i, l_i = key_tiles(acc, m_i, l_i, q, pos, t_mix_lo, t_mix_end, w, T, KL, VL, s_klt, s_vlt, offs_n,
                                  offs_d, D, qk_scale, True, True, PRECISION, BLOCK_N)
        acc, m_i, l_i = key_tiles(acc, m_i, l_i, q, pos, t_mix_end, t_loc_hi, w, T, KL, VL, s_klt, s_vlt, offs_n,
                                  offs_d, D, qk_scale, True, False, PRECISION, BLOCK_N)
        acc, m_i, l_i = key_tiles(acc, m_i, l_i, q, pos, t_loc_hi, t_hi, w, T, KL, VL, s_klt, s_vlt, offs_n, offs_d,
                                  D, qk_scale, True, True, PRECISION, BLOCK_N)
    return acc, m_i, l_i


@triton.jit
def query_head(j, KV_HEADS, R):
    """Query head of launch slot ``j`` (0 <= j < G * R): the ``j % R``-th query head of key/value head
    ``KV_HEADS[j // R]``. Returns ``(h, kv)``."""
    kv = tl.load(KV_HEADS + j // R)
    return kv * R + j % R, kv


@triton.jit
def query_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, t_from, t_to, keys, w, T, s_qt, s_dot, s_dqt, offs_m,
                offs_d, D: tl.constexpr, sm_scale, qk_scale, LOCAL: tl.constexpr, MASKED: tl.constexpr,
                PRECISION: tl.constexpr, BLOCK_M: tl.constexpr):
    """:func:`bwd_tile` over the contiguous query tiles ``t_from .. t_to - 1`` of one query head."""
    for t in range(t_from, t_to):
        pos = t * BLOCK_M + offs_m
        dk, dv = bwd_tile(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, pos, pos < T, keys, w, T, s_qt, s_dot, s_dqt,
                          offs_d, D, sm_scale, qk_scale, LOCAL, MASKED, PRECISION)
    return dk, dv


@triton.jit
def key_set_pass(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, n0, keys, w, T, s_qt, s_dot, s_dqt, offs_m, offs_d,
                 D: tl.constexpr, sm_scale, qk_scale, LOCAL: tl.constexpr, HAS_FAR: tl.constexpr,
                 PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One query head's contribution to one key tile of one key set (``LOCAL``: the local set, else the far set):
    the diagonal, pure-local and straddling query tiles for the local set; the straddling and pure-far ones for
    the far set."""
    t_lo, t_diag_end, t_loc_end, t_far_lo, t_hi = key_tile_query_bounds(n0, w, T, BLOCK_M, BLOCK_N, HAS_FAR)
    if LOCAL:
        dk, dv = query_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, t_lo, t_diag_end, keys, w, T, s_qt, s_dot,
                             s_dqt, offs_m, offs_d, D, sm_scale, qk_scale, True, True, PRECISION, BLOCK_M)
        dk, dv = query_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, t_diag_end, t_loc_end, keys, w, T, s_qt, s_dot,
                             s_dqt, offs_m, offs_d, D, sm_scale, qk_scale, True, False, PRECISION, BLOCK_M)
        t_mix_hi = t_far_lo
        if w <= 0:  # no local pair
            t_mix_hi = t_loc_end
        dk, dv = query_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, t_loc_end, t_mix_hi, keys, w, T, s_qt, s_dot,
                             s_dqt, offs_m, offs_d, D, sm_scale, qk_scale, True, True, PRECISION, BLOCK_M)
    else:
        dk, dv = query_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, t_loc_end, t_far_lo, keys, w, T, s_qt, s_dot,
                             s_dqt, offs_m, offs_d, D, sm_scale, qk_scale, False, True, PRECISION, BLOCK_M)
        dk, dv = query_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, t_far_lo, t_hi, keys, w, T, s_qt, s_dot,
                             s_dqt, offs_m, offs_d, D, sm_scale, qk_scale, False, False, PRECISION, BLOCK_M)
    return dk, dv


@triton.jit
def routed_far_pass(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, ROWSh, count, n0, keys, w, T, s_qt, s_dot, s_dqt,
                    offs_m, offs_d, D: tl.constexpr, sm_scale, qk_scale, PRECISION: tl.constexpr,
                    BLOCK_M: tl.constexpr):
    """The far pairs (``i - j >= w``) of one head's routed rows with the key tile ``[n0, ..)``: the rows of the
    sorted list ``ROWSh[:count]`` with a far pair here (``pos >= n0 + w``) are a suffix, found by binary search,
    so the program reads only the routed rows that need it."""
    lo = count * 0
    hi = count
    target = n0 + w
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(ROWSh + mid) < target:
            lo = mid + 1
        else:
            hi = mid
    for r0 in range(lo, count, BLOCK_M):
        rr = r0 + offs_m
        row_ok = rr < count
        pos = tl.load(ROWSh + rr, mask=row_ok, other=0)
        dk, dv = bwd_tile(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, pos, row_ok, keys, w, T, s_qt, s_dot, s_dqt,
                          offs_d, D, sm_scale, qk_scale, False, True, PRECISION)
    return dk, dv


@triton.jit
def key_set_grads(K, V, s_kt, s_vt, DK, DV, s_gt, Qb, DOb, DQb, LSEb, DELTAb, s_qh, s_qt, s_doh, s_dot, s_dqh, s_dqt,
                  WIN, ROWSb, COUNTSb, kv, R, n0, keys, key_ok, T, D: tl.constexpr, sm_scale, qk_scale,
                  LOCAL: tl.constexpr, HAS_FAR: tl.constexpr, ROUTED: tl.constexpr, PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """``dk``, ``dv`` of one key tile of one key set (``K``, ``V`` at key/value head ``kv``), summed over that head's
    ``R`` query heads (``Qb, DOb, DQb``: the batch's slabs; ``LSEb, DELTAb, ROWSb``: its (H, T) rows), then stored
    to ``DK``, ``DV``; with ``ROUTED``, the routed rows' far pairs too."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_m = tl.arange(0, BLOCK_M)
    k = load_rows(K, keys, key_ok, s_kt, offs_d, D)
    v = load_rows(V, keys, key_ok, s_vt, offs_d, D)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    for r in range(R):
        h = kv * R + r
        w = tl.load(WIN + h)
        Qh, DOh, DQh, LSEh, DELTAh = Qb + h * s_qh, DOb + h * s_doh, DQb + h * s_dqh, LSEb + h * T, DELTAb + h * T
        dk, dv = key_set_pass(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, n0, keys, w, T, s_qt, s_dot, s_dqt, offs_m,
                              offs_d, D, sm_scale, qk_scale, LOCAL, HAS_FAR, PRECISION, BLOCK_M, BLOCK_N)
        if ROUTED:
            dk, dv = routed_far_pass(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, ROWSb + h * T, tl.load(COUNTSb + h),
                                     n0, keys, w, T, s_qt, s_dot, s_dqt, offs_m, offs_d, D, sm_scale, qk_scale,
                                     PRECISION, BLOCK_M)
    store_rows(DK, dk * sm_scale, keys, key_ok, s_gt, offs_d, D)
    store_rows(DV, dv, keys, key_ok, s_gt, offs_d, D)


# ----------------------------------------------------------------------------------------------------- kernels
@triton.autotune(configs=tile_configs(small_windows=True), key=_FWD_KEY, prune_configs_by=_PRUNE)
@triton.jit(do_not_specialize=["T_TUNE", "W_TUNE"])
def _fwd_kernel(Q, KL, VL, KF, VF, O, LSE, WIN, KV_HEADS,
                s_qb, s_qh, s_qt, s_klb, s_klh, s_klt, s_vlb, s_vlh, s_vlt,
                s_kfb, s_kfh, s_kft, s_vfb, s_vfh, s_vft, s_ob, s_oh, s_ot,
                H, R, G, T, T_TUNE, W_TUNE, D: tl.constexpr, qk_scale,
                HAS_LOCAL: tl.constexpr, HAS_FAR: tl.constexpr, PRECISION: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    m0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M  # the heaviest (last) query tiles first
    b = tl.program_id(1) // (G * R)
    h, kv = query_head(tl.program_id(1) % (G * R), KV_HEADS, R)
    w = tl.load(WIN + h)
    pos = m0 + tl.arange(0, BLOCK_M)
    row_ok = pos < T
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(Q + b * s_qb + h * s_qh, pos, row_ok, s_qt, offs_d, D)
    acc, m_i, l_i = attend_rows(q, pos, m0, tl.minimum(m0 + BLOCK_M, T) - 1, w, T,
                                KL + b * s_klb + kv * s_klh, VL + b * s_vlb + kv * s_vlh,
                                KF + b * s_kfb + kv * s_kfh, VF + b * s_vfb + kv * s_vfh,
                                s_klt, s_vlt, s_kft, s_vft, D, qk_scale, HAS_LOCAL, HAS_FAR, PRECISION,
                                BLOCK_M, BLOCK_N, BLOCK_D)
    out, lse = finish_rows(acc, m_i, l_i)
    store_rows(O + b * s_ob + h * s_oh, out, pos, row_ok, s_ot, offs_d, D)
    tl.store(LSE + (b * H + h) * T + pos, lse, mask=row_ok)


@triton.autotune(configs=key_major_configs(small_windows=True), key=_BWD_KEY, prune_configs_by=_PRUNE)
@triton.jit(do_not_specialize=["T_TUNE", "W_TUNE"])
def _bwd_kernel(Q, KL, VL, KF, VF, DO, LSE, DELTA, DQ, DKL, DVL, DKF, DVF, WIN, KV_HEADS, ROWS, COUNTS,
                s_qb, s_qh, s_qt, s_klb, s_klh, s_klt, s_vlb, s_vlh, s_vlt,
                s_kfb, s_kfh, s_kft, s_vfb, s_vfh, s_vft, s_dob, s_doh, s_dot, s_dqb, s_dqh, s_dqt,
                s_gb, s_gh, s_gt,
                H, R, G, T, T_TUNE, W_TUNE, D: tl.constexpr, sm_scale, qk_scale,
                HAS_FAR: tl.constexpr, ROUTED: tl.constexpr, PRECISION: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    n0 = tl.program_id(0) * BLOCK_N  # key tile 0 sees every query tile: the heaviest first
    b = tl.program_id(1) // G
    kv = tl.load(KV_HEADS + tl.program_id(1) % G)
    keys = n0 + tl.arange(0, BLOCK_N)
    key_ok = keys < T
    Qb, DOb, DQb, LSEb, DELTAb = Q + b * s_qb, DO + b * s_dob, DQ + b * s_dqb, LSE + b * H * T, DELTA + b * H * T
    # the local key set (and, for AHA, the routed rows' far pairs: the same keys), stored before the far set loads
    key_set_grads(KL + b * s_klb + kv * s_klh, VL + b * s_vlb + kv * s_vlh, s_klt, s_vlt,
                  DKL + b * s_gb + kv * s_gh, DVL + b * s_gb + kv * s_gh, s_gt, Qb, DOb, DQb, LSEb, DELTAb,
                  s_qh, s_qt, s_doh, s_dot, s_dqh, s_dqt, WIN, ROWS + b * H * T, COUNTS + b * H, kv, R, n0, keys,
                  key_ok, T, D, sm_scale, qk_scale, True, HAS_FAR, ROUTED, PRECISION, BLOCK_M, BLOCK_N, BLOCK_D)
    if HAS_FAR:
        key_set_grads(KF + b * s_kfb + kv * s_kfh, VF + b * s_vfb + kv * s_vfh, s_kft, s_vft,
                      DKF + b * s_gb + kv * s_gh, DVF + b * s_gb + kv * s_gh, s_gt, Qb, DOb, DQb, LSEb, DELTAb,
                      s_qh, s_qt, s_doh, s_dot, s_dqh, s_dqt, WIN, ROWS, COUNTS, kv, R, n0, keys, key_ok, T, D,
                      sm_scale, qk_scale, False, True, False, PRECISION, BLOCK_M, BLOCK_N, BLOCK_D)


@triton.autotune(configs=tile_configs(), key=["T_TUNE", "D", "R"])
@triton.jit(do_not_specialize=["T_TUNE"])
def _routed_fwd_kernel(Q, K, V, O, LSE, ROWS, COUNTS,
                       s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_ob, s_oh, s_ot,
                       H, R, T, T_TUNE, D: tl.constexpr, qk_scale,
                       PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    """Rows ``tile * BLOCK_M ..`` of head ``bh``'s sorted routed list (``ROWS[bh]``, the first ``COUNTS[bh]``
    valid): full causal attention (the far path with ``w = 0``), written over the local pass's rows of ``O`` and
    ``LSE``. A program past the head's count returns at once."""
    tile = tl.num_programs(0) - 1 - tl.program_id(0)  # later routed rows see more keys: the heaviest first
    bh = tl.program_id(1)
    count = tl.load(COUNTS + bh)
    if tile * BLOCK_M < count:
        b = bh // H
        h = bh % H
        kv = h // R
        r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = r < count
        pos = tl.load(ROWS + bh * T + r, mask=row_ok, other=0)
        offs_d = tl.arange(0, BLOCK_D)
        q = load_rows(Q + b * s_qb + h * s_qh, pos, row_ok, s_qt, offs_d, D)
        Kp = K + b * s_kb + kv * s_kh
        Vp = V + b * s_vb + kv * s_vh
        acc, m_i, l_i = attend_rows(q, pos, tl.min(tl.where(row_ok, pos, T)), tl.max(tl.where(row_ok, pos, -1)), 0,
                                    T, Kp, Vp, Kp, Vp, s_kt, s_vt, s_kt, s_vt, D, qk_scale, False, True, PRECISION,
                                    BLOCK_M, BLOCK_N, BLOCK_D)
        out, lse = finish_rows(acc, m_i, l_i)
        store_rows(O + b * s_ob + h * s_oh, out, pos, row_ok, s_ot, offs_d, D)
        tl.store(LSE + bh * T + pos, lse, mask=row_ok)


@triton.jit
def _delta_kernel(O, DO, DELTA, DQ, s_ob, s_oh, s_ot, s_dob, s_doh, s_dot, s_dqb, s_dqh, s_dqt, H, T,
                  D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """``DELTA[bh, i] = sum_d O[b, h, i, d] * DO[b, h, i, d]`` in float32 for one tile of rows; zeroes the same rows
    of the float32 ``DQ`` accumulator (one launch instead of a separate fill)."""
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    pos = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = pos < T
    offs_d = tl.arange(0, BLOCK_D)
    o = load_rows(O + b * s_ob + h * s_oh, pos, row_ok, s_ot, offs_d, D).to(tl.float32)
    do = load_rows(DO + b * s_dob + h * s_doh, pos, row_ok, s_dot, offs_d, D).to(tl.float32)
    tl.store(DELTA + bh * T + pos, tl.sum(o * do, axis=1), mask=row_ok)
    store_rows(DQ + b * s_dqb + h * s_dqh, tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32), pos, row_ok, s_dqt, offs_d,
               D)


# ----------------------------------------------------------------------------------------------------- launchers
def _groups(windows: HeadWindows) -> list[dict]:
    return [{"KV_HEADS": g.kv_heads, "G": g.kv_heads.numel(), "W_TUNE": g.tune_bucket} for g in windows.groups]


def banded_forward(q, k_loc, v_loc, k_far, v_far, windows: HeadWindows, has_local: bool, has_far: bool):
    """Banded attention forward over contiguous rows. Returns ``o`` (B, H, T, d_h) (:func:`runtime.new_heads`
    layout) and ``lse`` (B*H, T)."""
    B, H, T, D = q.shape
    R = H // k_loc.shape[1]
    o = new_heads(q)
    lse = torch.empty((B * H, T), dtype=torch.float32, device=q.device)
    _, qk_scale = qk_scales(D)
    precision = dot_precision(q.dtype, q.device)
    args = dict(Q=q, KL=k_loc, VL=v_loc, KF=k_far, VF=v_far, O=o, LSE=lse, WIN=windows.values,
                **_strides(q=q, kl=k_loc, vl=v_loc, kf=k_far, vf=v_far, o=o), H=H, R=R, T=T, T_TUNE=seq_bucket(T),
                D=D, qk_scale=qk_scale, HAS_LOCAL=has_local, HAS_FAR=has_far, PRECISION=precision, BLOCK_D=block_d(D))
    tuned_launch(_fwd_kernel, windows.plans, ("fwd", q.dtype, D, R, has_local, has_far, precision), _groups(windows),
                 lambda meta, g: (triton.cdiv(T, meta["BLOCK_M"]), B * g["G"] * R), args)
    return o, lse


def row_deltas(o: torch.Tensor, do: torch.Tensor, dq: torch.Tensor) -> torch.Tensor:
    """``delta = rowsum(o * do)`` in float32, (B*H, T): the softmax-backward correction (FlashAttention-2); and
    ``dq`` (the backward's float32 accumulator, shaped like ``o``) zeroed in the same pass.

    ``o``, ``do``, ``dq``: (B, H, T, d_h), any strides with unit stride on d_h. One pass that reads each once.
    """
    B, H, T, D = o.shape
    delta = torch.empty((B * H, T), dtype=torch.float32, device=o.device)
    _delta_kernel[(triton.cdiv(T, _DELTA_ROWS), B * H)](o, do, delta, dq, *s3(o), *s3(do), *s3(dq), H, T, D,
                                                         BLOCK_M=_DELTA_ROWS, BLOCK_D=block_d(D))
    return delta


def banded_backward(q, k_loc, v_loc, k_far, v_far, o, lse, do, windows: HeadWindows, has_far: bool,
                    routed: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Gradients of the banded forward (local path on), in one key-major launch per head group.

    ``do``: (B, H, T, d_h), unit stride on d_h. ``routed``: AHA's ``(rows, counts)`` (:func:`kernels.aha.route_rows`)
    whose far pairs join the local set's gradients. Returns ``(dq, dk_loc, dv_loc, dk_far, dv_far)`` in the input
    dtype; the far pair is ``None`` unless ``has_far``. ``dq`` accumulates in float32 (atomic adds; zeroed by the
    ``delta`` pass) and is cast once.
    """
    B, H, T, D = q.shape
    R = H // k_loc.shape[1]
    dq = new_heads(q, dtype=torch.float32)
    dkl, dvl = new_heads(k_loc), new_heads(k_loc)
    dkf, dvf = (new_heads(k_loc), new_heads(k_loc)) if has_far else (dkl, dvl)
    rows, counts = routed if routed is not None else (windows.values, windows.values)  # unread without ROUTED
    sm_scale, qk_scale = qk_scales(D)
    precision = dot_precision(q.dtype, q.device)
    args = dict(Q=q, KL=k_loc, VL=v_loc, KF=k_far, VF=v_far, DO=do, LSE=lse, DELTA=row_deltas(o, do, dq), DQ=dq,
                DKL=dkl, DVL=dvl, DKF=dkf, DVF=dvf, WIN=windows.values, ROWS=rows, COUNTS=counts,
                **_strides(q=q, kl=k_loc, vl=v_loc, kf=k_far, vf=v_far, do=do, dq=dq, g=dkl), H=H, R=R, T=T,
                T_TUNE=seq_bucket(T), D=D, sm_scale=sm_scale, qk_scale=qk_scale, HAS_FAR=has_far,
                ROUTED=routed is not None, PRECISION=precision, BLOCK_D=block_d(D))
    tuned_launch(_bwd_kernel, windows.plans, ("bwd", q.dtype, D, R, has_far, routed is not None, precision),
                 _groups(windows), lambda meta, g: (triton.cdiv(T, meta["BLOCK_N"]), B * g["G"]), args,
                 scratch=lambda: {"DQ": torch.empty_like(dq)})
    dq = dq.to(q.dtype)
    if has_far:
        return dq, dkl, dvl, dkf, dvf
    return dq, dkl, dvl, None, None


def routed_forward(q, k, v, o, lse, windows: HeadWindows, rows, counts):
    """Overwrite the routed rows (:func:`kernels.aha.route_rows`) of ``o``/``lse`` with full causal attention.
    One program per (tile of routed rows, query head); a tile past its head's count returns at once."""
    B, H, T, D = q.shape
    R = H // k.shape[1]
    _, qk_scale = qk_scales(D)
    precision = dot_precision(q.dtype, q.device)
    args = dict(Q=q, K=k, V=v, O=o, LSE=lse, ROWS=rows, COUNTS=counts, **_strides(q=q, k=k, v=v, o=o), H=H, R=R, T=T,
                T_TUNE=seq_bucket(T), D=D, qk_scale=qk_scale, PRECISION=precision, BLOCK_D=block_d(D))
    tuned_launch(_routed_fwd_kernel, windows.plans, ("routed_fwd", q.dtype, D, R, precision), [{}],
                 lambda meta, g: (triton.cdiv(T, meta["BLOCK_M"]), B * H), args)


def _strides(**tensors: torch.Tensor) -> dict:
    """``s_<name>b, s_<name>h, s_<name>t`` of each (B, heads, T, d_h) tensor, as the kernels name them."""
    return {f"s_{name}{axis}": st for name, t in tensors.items() for axis, st in zip("bht", s3(t))}
