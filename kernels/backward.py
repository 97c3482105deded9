"""The banded attention's backward kernels and launcher (forward and shared row loops: :mod:`kernels.banded`).

Kernels:

* ``_delta_kernel``: ``delta = rowsum(o * do)``, zeroing the atomic pass's float32 ``dq`` accumulator in the same
  pass.
* ``_bwd_kernel``: one program per key tile and key/value head -> ``dk``/``dv`` of each key set, looping over the
  query heads of the key/value head and the query tiles that see the key tile (four products per tile pair).
  With ``ATOMIC_DQ`` each visited query tile's ``dq`` part also goes to a float32 accumulator by atomic adds
  (FlashAttention-2's backward: five products, no separate ``dq`` pass). DAR finishes and stores the local key
  set's gradients before it loads the far set. With ``ROUTED`` (AHA) it also visits the far pairs of the head's
  routed rows, into the same accumulators, so ``dk``/``dv`` are stored once.
* ``_dq_kernel``: without ``ATOMIC_DQ``, one program per query tile and query head -> its ``dq`` over the
  forward's key tiles (three products per tile pair), written once.
* ``_routed_dq_kernel`` (AHA, without ``ATOMIC_DQ``): the routed rows, compacted as in the forward, -> their ``dq``
  over every causal key, written over the local-only ``dq`` of ``_dq_kernel``.

Tensors as in :mod:`kernels.banded`; ``do`` any strides with unit stride on d_h; ``delta`` float32 (B*H, T).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .banded import FWD_KEY, PRUNE, attend_rows, kernel_strides, launch_groups, query_tile, routed_tile
from .runtime import (HeadWindows, block_d, dot_precision, key_major_configs, new_heads, qk_scales,
                      query_major_dq_configs, s3, seq_bucket, tuned_launch)
from .tiles import bwd_tile, key_tile_query_bounds, load_lse_delta, load_rows, store_rows

_BWD_KEY = ["T_TUNE", "D", "W_TUNE", "G", "R", "HAS_FAR", "ROUTED", "ATOMIC_DQ"]
_DELTA_ROWS = 64  # rows per program of the delta kernel (a memory-bound row reduction)
DQ_PASSES = ("atomic", "rows")  # how the backward computes dq (banded_backward)
DQ_PASS_ENV = "NEOX_DAR_DQ_PASS"  # the environment's way to set DQ_PASS (train.py: every rank reads it at import)
DQ_PASS: str | None = os.environ.get(DQ_PASS_ENV) or None  # one of DQ_PASSES for every backward the autograd path
# runs (banded_backward refuses another); None: banded_backward chooses
DQ_CHOICES: list[dict] = []  # each choice banded_backward timed on CUDA: the specialization, both times, the pass


# ----------------------------------------------------------------------------------------------------- key-major loops
@triton.jit
def query_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, t_from, t_to, keys, w, T, s_qt, s_dot, s_dqt, offs_m,
                offs_d, D: tl.constexpr, sm_scale, qk_scale, LOCAL: tl.constexpr, MASKED: tl.constexpr,
                ATOMIC_DQ: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr):
    """:func:`bwd_tile` over the contiguous query tiles ``t_from .. t_to - 1`` of one query head."""
    for t in range(t_from, t_to):
        pos = t * BLOCK_M + offs_m
        dk, dv = bwd_tile(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, pos, pos < T, keys, w, T, s_qt, s_dot, s_dqt,
                          offs_d, D, sm_scale, qk_scale, LOCAL, MASKED, ATOMIC_DQ, PRECISION)
    return dk, dv


@triton.jit
def key_set_pass(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, n0, keys, w, T, s_qt, s_dot, s_dqt, offs_m, offs_d,
                 D: tl.constexpr, sm_scale, qk_scale, LOCAL: tl.constexpr, HAS_FAR: tl.constexpr,
                 ATOMIC_DQ: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One query head's contribution to one key tile of one key set (``LOCAL``: the local set, else the far set):
    the diagonal, pure-local and straddling query tiles for the local set; the straddling and pure-far ones for
    the far set."""
    t_lo, t_diag_end, t_loc_end, t_far_lo, t_hi = key_tile_query_bounds(n0, w, T, BLOCK_M, BLOCK_N, HAS_FAR)
    if LOCAL:
        dk, dv = query_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, t_lo, t_diag_end, keys, w, T, s_qt, s_dot,
                             s_dqt, offs_m, offs_d, D, sm_scale, qk_scale, True, True, ATOMIC_DQ, PRECISION,
                             BLOCK_M)
        dk, dv = query_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, t_diag_end, t_loc_end, keys, w, T, s_qt, s_dot,
                             s_dqt, offs_m, offs_d, D, sm_scale, qk_scale, True, False, ATOMIC_DQ, PRECISION,
                             BLOCK_M)
        t_mix_hi = t_far_lo
        if w <= 0:  # no local pair
            t_mix_hi = t_loc_end
        dk, dv = query_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, t_loc_end, t_mix_hi, keys, w, T, s_qt, s_dot,
                             s_dqt, offs_m, offs_d, D, sm_scale, qk_scale, True, True, ATOMIC_DQ, PRECISION,
                             BLOCK_M)
    else:
        dk, dv = query_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, t_loc_end, t_far_lo, keys, w, T, s_qt, s_dot,
                             s_dqt, offs_m, offs_d, D, sm_scale, qk_scale, False, True, ATOMIC_DQ, PRECISION,
                             BLOCK_M)
        dk, dv = query_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, t_far_lo, t_hi, keys, w, T, s_qt, s_dot,
                             s_dqt, offs_m, offs_d, D, sm_scale, qk_scale, False, False, ATOMIC_DQ, PRECISION,
                             BLOCK_M)
    return dk, dv


@triton.jit
def routed_far_pass(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, ROWSh, count, n0, keys, w, T, s_qt, s_dot, s_dqt,
                    offs_m, offs_d, D: tl.constexpr, sm_scale, qk_scale, ATOMIC_DQ: tl.constexpr,
                    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr):
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
                          offs_d, D, sm_scale, qk_scale, False, True, ATOMIC_DQ, PRECISION)
    return dk, dv


@triton.jit
def key_set_grads(K, V, s_kt, s_vt, DK, DV, s_gt, Qb, DOb, DQb, LSEb, DELTAb, s_qh, s_qt, s_doh, s_dot, s_dqh, s_dqt,
                  WIN, ROWSb, COUNTSb, kv, R, n0, keys, key_ok, T, D: tl.constexpr, sm_scale, qk_scale,
                  LOCAL: tl.constexpr, HAS_FAR: tl.constexpr, ROUTED: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                  PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
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
                              offs_d, D, sm_scale, qk_scale, LOCAL, HAS_FAR, ATOMIC_DQ, PRECISION, BLOCK_M,
                              BLOCK_N)
        if ROUTED:
            dk, dv = routed_far_pass(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, DQh, ROWSb + h * T, tl.load(COUNTSb + h),
                                     n0, keys, w, T, s_qt, s_dot, s_dqt, offs_m, offs_d, D, sm_scale, qk_scale,
                                     ATOMIC_DQ, PRECISION, BLOCK_M)
    store_rows(DK, dk * sm_scale, keys, key_ok, s_gt, offs_d, D)
    store_rows(DV, dv, keys, key_ok, s_gt, offs_d, D)


# ------------------------------------------------------------------------------------------------------------- kernels
@triton.autotune(configs=key_major_configs(small_windows=True), key=_BWD_KEY, prune_configs_by=PRUNE)
@triton.jit(do_not_specialize=["T_TUNE", "W_TUNE"])
def _bwd_kernel(Q, KL, VL, KF, VF, DO, LSE, DELTA, DQ, DKL, DVL, DKF, DVF, WIN, KV_HEADS, ROWS, COUNTS,
                s_qb, s_qh, s_qt, s_klb, s_klh, s_klt, s_vlb, s_vlh, s_vlt,
                s_kfb, s_kfh, s_kft, s_vfb, s_vfh, s_vft, s_dob, s_doh, s_dot, s_dqb, s_dqh, s_dqt,
                s_gb, s_gh, s_gt,
                H, R, G, T, T_TUNE, W_TUNE, D: tl.constexpr, sm_scale, qk_scale,
                HAS_FAR: tl.constexpr, ROUTED: tl.constexpr, ATOMIC_DQ: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
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
                  key_ok, T, D, sm_scale, qk_scale, True, HAS_FAR, ROUTED, ATOMIC_DQ, PRECISION, BLOCK_M, BLOCK_N,
                  BLOCK_D)
    if HAS_FAR:
        key_set_grads(KF + b * s_kfb + kv * s_kfh, VF + b * s_vfb + kv * s_vfh, s_kft, s_vft,
                      DKF + b * s_gb + kv * s_gh, DVF + b * s_gb + kv * s_gh, s_gt, Qb, DOb, DQb, LSEb, DELTAb,
                      s_qh, s_qt, s_doh, s_dot, s_dqh, s_dqt, WIN, ROWS, COUNTS, kv, R, n0, keys, key_ok, T, D,
                      sm_scale, qk_scale, False, True, False, ATOMIC_DQ, PRECISION, BLOCK_M, BLOCK_N, BLOCK_D)


@triton.autotune(configs=query_major_dq_configs(small_windows=True), key=FWD_KEY, prune_configs_by=PRUNE)
@triton.jit(do_not_specialize=["T_TUNE", "W_TUNE"])
def _dq_kernel(Q, KL, VL, KF, VF, DO, LSE, DELTA, DQ, WIN, KV_HEADS,
               s_qb, s_qh, s_qt, s_klb, s_klh, s_klt, s_vlb, s_vlh, s_vlt,
               s_kfb, s_kfh, s_kft, s_vfb, s_vfh, s_vft, s_dob, s_doh, s_dot, s_dqb, s_dqh, s_dqt,
               H, R, G, T, T_TUNE, W_TUNE, D: tl.constexpr, sm_scale, qk_scale,
               HAS_LOCAL: tl.constexpr, HAS_FAR: tl.constexpr, PRECISION: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``dq`` of one query tile of one query head, written once in the input dtype (no atomics): the forward's
    key tiles again, three products each (:func:`kernels.tiles.dq_tile`). The key-major kernel then runs
    without ``ATOMIC_DQ``."""
    m0, b, h, kv, w, pos, row_ok, offs_d, q = query_tile(Q, WIN, KV_HEADS, s_qb, s_qh, s_qt, G, R, T, D, BLOCK_M,
                                                         BLOCK_D)
    do = load_rows(DO + b * s_dob + h * s_doh, pos, row_ok, s_dot, offs_d, D)
    lse, delta = load_lse_delta(LSE + (b * H + h) * T, DELTA + (b * H + h) * T, pos, row_ok)
    dq, _, _ = attend_rows(q, (do, lse, delta), pos, m0, tl.minimum(m0 + BLOCK_M, T) - 1, w, T,
                           KL + b * s_klb + kv * s_klh, VL + b * s_vlb + kv * s_vlh,
                           KF + b * s_kfb + kv * s_kfh, VF + b * s_vfb + kv * s_vfh,
                           s_klt, s_vlt, s_kft, s_vft, D, qk_scale, HAS_LOCAL, HAS_FAR, True, PRECISION,
                           BLOCK_M, BLOCK_N, BLOCK_D)
    store_rows(DQ + b * s_dqb + h * s_dqh, dq * sm_scale, pos, row_ok, s_dqt, offs_d, D)


@triton.autotune(configs=query_major_dq_configs(), key=["T_TUNE", "D", "R"])
@triton.jit(do_not_specialize=["T_TUNE"])
def _routed_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, ROWS, COUNTS,
                      s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_dob, s_doh, s_dot, s_dqb, s_dqh, s_dqt,
                      H, R, T, T_TUNE, D: tl.constexpr, sm_scale, qk_scale,
                      PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """AHA without ``ATOMIC_DQ``: ``dq`` of rows ``tile * BLOCK_M ..`` of head ``bh``'s sorted routed list (the
    first ``COUNTS[bh]`` of ``ROWS[bh]``) over every causal key (the far path with ``w = 0``, as
    ``_routed_fwd_kernel``), written over the local-only ``dq`` that ``_dq_kernel`` gave those rows. A program past
    the head's count does nothing."""
    live, bh, b, h, pos, row_ok, offs_d, q, Kp, Vp = routed_tile(Q, K, V, ROWS, COUNTS, s_qb, s_qh, s_qt, s_kb, s_kh,
                                                                 s_vb, s_vh, H, R, T, D, BLOCK_M, BLOCK_D)
    if live:
        do = load_rows(DO + b * s_dob + h * s_doh, pos, row_ok, s_dot, offs_d, D)
        lse, delta = load_lse_delta(LSE + bh * T, DELTA + bh * T, pos, row_ok)
        dq, _, _ = attend_rows(q, (do, lse, delta), pos, tl.min(tl.where(row_ok, pos, T)),
                               tl.max(tl.where(row_ok, pos, -1)), 0, T, Kp, Vp, Kp, Vp, s_kt, s_vt, s_kt, s_vt,
                               D, qk_scale, False, True, True, PRECISION, BLOCK_M, BLOCK_N, BLOCK_D)
        store_rows(DQ + b * s_dqb + h * s_dqh, dq * sm_scale, pos, row_ok, s_dqt, offs_d, D)


@triton.jit
def _delta_kernel(O, DO, DELTA, DQ, s_ob, s_oh, s_ot, s_dob, s_doh, s_dot, s_dqb, s_dqh, s_dqt, H, T,
                  D: tl.constexpr, ZERO_DQ: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """``DELTA[bh, i] = sum_d O[b, h, i, d] * DO[b, h, i, d]`` in float32 for one tile of rows; with ``ZERO_DQ``
    zeroes the same rows of the float32 ``DQ`` accumulator (one launch instead of a separate fill)."""
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    pos = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = pos < T
    offs_d = tl.arange(0, BLOCK_D)
    o = load_rows(O + b * s_ob + h * s_oh, pos, row_ok, s_ot, offs_d, D).to(tl.float32)
    do = load_rows(DO + b * s_dob + h * s_doh, pos, row_ok, s_dot, offs_d, D).to(tl.float32)
    tl.store(DELTA + bh * T + pos, tl.sum(o * do, axis=1), mask=row_ok)
    if ZERO_DQ:
        store_rows(DQ + b * s_dqb + h * s_dqh, tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32), pos, row_ok, s_dqt,
                   offs_d, D)


# ----------------------------------------------------------------------------------------------------------- launchers
def row_deltas(o: torch.Tensor, do: torch.Tensor, dq: torch.Tensor | None) -> torch.Tensor:
    """``delta = rowsum(o * do)`` in float32, (B*H, T): the softmax-backward correction (FlashAttention-2); and
    ``dq`` (the atomic backward's float32 accumulator, shaped like ``o``), unless None, zeroed in the same pass.

    ``o``, ``do``, ``dq``: (B, H, T, d_h), any strides with unit stride on d_h. One pass that reads each once.
    """
    B, H, T, D = o.shape
    delta = torch.empty((B * H, T), dtype=torch.float32, device=o.device)
    zero = dq is not None
    target = (dq, *s3(dq)) if zero else (delta, 0, 0, 0)  # unread without ZERO_DQ
    _delta_kernel[(triton.cdiv(T, _DELTA_ROWS), B * H)](o, do, delta, target[0], *s3(o), *s3(do), *target[1:], H, T,
                                                         D, ZERO_DQ=zero, BLOCK_M=_DELTA_ROWS, BLOCK_D=block_d(D))
    return delta


def banded_backward(q, k_loc, v_loc, k_far, v_far, o, lse, do, windows: HeadWindows, has_far: bool,
                    routed: tuple[torch.Tensor, torch.Tensor] | None = None, dq_pass: str | None = None):
    """Gradients of the banded forward (local path on): one key-major launch per head group for ``dk``/``dv``,
    and ``dq`` by one of two passes (:data:`DQ_PASSES`):

    * ``"atomic"``: the key-major kernel adds each tile pair's ``dq`` part into a float32 accumulator (atomic adds;
      zeroed by the ``delta`` pass), cast once at the end (FlashAttention-2's backward: five products per pair);
    * ``"rows"``: the key-major kernel does four products per pair and a query-major kernel (``_dq_kernel``)
      computes each query tile's ``dq`` over the forward's key tiles (three products per pair), written once in
      the input dtype: no atomics, no float32 buffer, the same result at every run.

    AHA's routed rows (``routed``: ``(rows, counts)``, :func:`kernels.aha.route_rows`): their far pairs join the
    local key set's ``dk``/``dv`` in the key-major kernel (and, in the atomic pass, their ``dq``); in the rows pass
    ``_routed_dq_kernel`` then computes their whole ``dq`` over every causal key, over the local one.

    ``dq_pass=None`` (the autograd path) takes :data:`DQ_PASS` when set, else chooses per specialization
    (``windows.plans``; routed or not is part of it): on CUDA the faster of the two, timed on first use
    (:func:`_timed_passes`; recorded in :data:`DQ_CHOICES`), under the interpreter ``"atomic"``.
    ``do``: (B, H, T, d_h), unit stride on d_h. Returns ``(dq, dk_loc, dv_loc, dk_far, dv_far)`` in the input dtype;
    the far pair is ``None`` unless ``has_far``.
    """
    precision = dot_precision(q.dtype, q.device)
    spec = (q.dtype, q.shape[-1], q.shape[1] // k_loc.shape[1], has_far, routed is not None, precision)
    dq_pass = dq_pass or DQ_PASS
    if dq_pass is not None and dq_pass not in DQ_PASSES:
        raise ValueError(f"banded_backward: dq_pass must be one of {DQ_PASSES} or None, got {dq_pass!r}")
    if dq_pass is None:
        dq_pass = windows.plans.get(("dq_pass", *spec))
        if dq_pass is None:
            dq_pass = "atomic"
            if q.is_cuda:
                times = _timed_passes(lambda p: _backward(q, k_loc, v_loc, k_far, v_far, o, lse, do, windows,
                                                          has_far, routed, p, precision))
                dq_pass = min(times, key=times.get)
                DQ_CHOICES.append({"dtype": str(q.dtype).removeprefix("torch."), "head_dim": q.shape[-1],
                                   "group": spec[2], "has_far": has_far, "routed": routed is not None,
                                   "seq_len": q.shape[2],
                                   "windows": sorted(set(windows.values.tolist())), "median_ms": times,
                                   "dq_pass": dq_pass})
            windows.plans[("dq_pass", *spec)] = dq_pass
    dq, dkl, dvl, dkf, dvf = _backward(q, k_loc, v_loc, k_far, v_far, o, lse, do, windows, has_far, routed, dq_pass,
                                       precision)
    if has_far:
        return dq, dkl, dvl, dkf, dvf
    return dq, dkl, dvl, None, None


def _timed_passes(run, reps: int = 3) -> dict[str, float]:
    """Median milliseconds of ``run(dq_pass)`` on CUDA for each of :data:`DQ_PASSES`: each run once (its kernels
    tune), then timed ``reps`` times with CUDA events. A few extra backward calls, once per specialization and
    sequence-length bucket."""
    times = {}
    for name in DQ_PASSES:
        run(name)
        samples = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(name)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        times[name] = sorted(samples)[reps // 2]
    return times


def _backward(q, k_loc, v_loc, k_far, v_far, o, lse, do, windows: HeadWindows, has_far: bool, routed, dq_pass: str,
              precision: str):
    """:func:`banded_backward` with its ``dq`` pass chosen: ``(dq, dk_loc, dv_loc, dk_far, dv_far)`` (the far pair
    aliases the local one without ``has_far``)."""
    B, H, T, D = q.shape
    R = H // k_loc.shape[1]
    atomic = dq_pass == "atomic"
    dq = new_heads(q, dtype=torch.float32) if atomic else new_heads(q)
    dkl, dvl = new_heads(k_loc), new_heads(k_loc)
    dkf, dvf = (new_heads(k_loc), new_heads(k_loc)) if has_far else (dkl, dvl)
    rows, counts = routed if routed is not None else (windows.values, windows.values)  # unread without ROUTED
    sm_scale, qk_scale = qk_scales(D)
    delta = row_deltas(o, do, dq if atomic else None)
    strides = kernel_strides(q=q, kl=k_loc, vl=v_loc, kf=k_far, vf=v_far, do=do, dq=dq)
    shared = dict(Q=q, KL=k_loc, VL=v_loc, KF=k_far, VF=v_far, DO=do, LSE=lse, DELTA=delta, DQ=dq,
                  WIN=windows.values, **strides, H=H, R=R, T=T, T_TUNE=seq_bucket(T), D=D, sm_scale=sm_scale,
                  qk_scale=qk_scale, HAS_FAR=has_far, PRECISION=precision, BLOCK_D=block_d(D))
    args = dict(shared, DKL=dkl, DVL=dvl, DKF=dkf, DVF=dvf, ROWS=rows, COUNTS=counts, **kernel_strides(g=dkl),
                ROUTED=routed is not None, ATOMIC_DQ=atomic)
    tuned_launch(_bwd_kernel, windows.plans, ("bwd", q.dtype, D, R, has_far, routed is not None, atomic, precision),
                 launch_groups(windows), lambda meta, g: (triton.cdiv(T, meta["BLOCK_N"]), B * g["G"]), args,
                 scratch=lambda: {"DQ": torch.empty_like(dq)} if atomic else {})
    if atomic:
        return dq.to(q.dtype), dkl, dvl, dkf, dvf
    tuned_launch(_dq_kernel, windows.plans, ("dq", q.dtype, D, R, has_far, precision), launch_groups(windows),
                 lambda meta, g: (triton.cdiv(T, meta["BLOCK_M"]), B * g["G"] * R), dict(shared, HAS_LOCAL=True))
    if routed is not None:  # AHA: the routed rows' dq again, over every causal key, written over the local one
        args = dict(Q=q, K=k_loc, V=v_loc, DO=do, LSE=lse, DELTA=delta, DQ=dq, ROWS=rows, COUNTS=counts,
                    **kernel_strides(q=q, k=k_loc, v=v_loc, do=do, dq=dq), H=H, R=R, T=T, T_TUNE=seq_bucket(T), D=D,
                    sm_scale=sm_scale, qk_scale=qk_scale, PRECISION=precision, BLOCK_D=block_d(D))
        tuned_launch(_routed_dq_kernel, windows.plans, ("routed_dq", q.dtype, D, R, precision), [{}],
                     lambda meta, g: (triton.cdiv(T, meta["BLOCK_M"]), B * H), args)
    return dq, dkl, dvl, dkf, dvf
