"""The banded attention's forward kernels, the row loops the query-major kernels share, and the launch helpers
(see :mod:`kernels.tiles` for the local/far vocabulary; the backward is :mod:`kernels.backward`).

Kernels:

* ``_fwd_kernel``: one program per query tile and query head -> output rows and base-2 LSE (FlashAttention-2
  forward). Grid ``(query tiles, B x G x R)``, the heaviest (last) query tiles of each head first.
* ``_routed_fwd_kernel`` (AHA): the routed rows of each head, compacted and sorted, attend to every causal key;
  their output and LSE overwrite the local pass's.

The banded kernels run once per group of key/value heads whose windows share a tune bucket
(``runtime.HeadWindows``); after tuning, groups with the same tile shape share a launch (``runtime.tuned_launch``).

Tensors: ``q`` (B, H, T, d_h); ``k_*, v_*`` (B, H_kv, T, d_h), query head ``h`` reading key/value head
``h // R`` (R = H // H_kv, grouped-query attention); any strides with unit stride on d_h. Outputs are
(B, heads, T, d_h) views of (B, T, heads, d_h) storage (``runtime.new_heads``). ``lse`` float32 (B*H, T);
``windows`` int32 (H,), per query head; ``KV_HEADS`` int32 (G,); routed ``rows`` int32 (B*H, T) and ``counts``
int32 (B*H,).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .runtime import (HeadWindows, block_d, dot_precision, new_heads, prune_for_window, qk_scales, s3, seq_bucket,
                      tile_configs, tuned_launch)
from .tiles import dq_tile, finish_rows, fwd_tile, load_rows, query_tile_key_bounds, store_rows

# T_TUNE: the sequence length's bucket (runtime.seq_bucket); W_TUNE: the launch's window bucket
# (runtime.HeadGroup.tune_bucket); G: key/value heads per launch; R: query heads per key/value head. The kernels
# never read T_TUNE or W_TUNE (not specialized); they are in the key so that each window regime (MSWA's 8 and
# 512, SWA, DAR) and each launch size gets its own tuned tile, and a new T tunes again only past a power of two.
FWD_KEY = ["T_TUNE", "D", "W_TUNE", "G", "R", "HAS_LOCAL", "HAS_FAR"]
PRUNE = {"early_config_prune": prune_for_window}


# ----------------------------------------------------------------------------------------------------------- row loops
@triton.jit
def key_tiles(acc, m_i, l_i, q, grad_rows, pos, t_from, t_to, w, T, K, V, s_kt, s_vt, offs_n, offs_d,
              D: tl.constexpr, qk_scale, LOCAL: tl.constexpr, MASKED: tl.constexpr, GRAD: tl.constexpr,
              PRECISION: tl.constexpr, BLOCK_N: tl.constexpr):
    """:func:`fwd_tile` (or, with ``GRAD``, :func:`dq_tile` into ``acc`` with ``grad_rows = (do, lse, delta)``)
    over key tiles ``t_from .. t_to - 1`` of one key set."""
    for t in range(t_from, t_to):
        if GRAD:
            acc = dq_tile(acc, q, grad_rows[0], grad_rows[1], grad_rows[2], pos, t * BLOCK_N, w, T, K, V, s_kt,
                          s_vt, offs_n, offs_d, D, qk_scale, LOCAL, MASKED, PRECISION)
        else:
            acc, m_i, l_i = fwd_tile(acc, m_i, l_i, q, pos, t * BLOCK_N, w, T, K, V, s_kt, s_vt, offs_n, offs_d, D,
                                     qk_scale, LOCAL, MASKED, PRECISION)
    return acc, m_i, l_i


@triton.jit
def attend_rows(q, grad_rows, pos, p_min, p_max, w, T, KL, VL, KF, VF, s_klt, s_vlt, s_kft, s_vft, D: tl.constexpr,
                qk_scale,
                HAS_LOCAL: tl.constexpr, HAS_FAR: tl.constexpr, GRAD: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Online softmax of rows ``pos`` (within ``[p_min, p_max]``) over every key tile they see: ``(acc, m, l)``.
    The far key set's tiles first (pure, then the straddling ones masked to far pairs), then the local set's
    (straddling masked to local pairs, pure, diagonal). With ``GRAD`` the same tiles give the rows' unscaled ``dq``
    in ``acc`` instead (``grad_rows``: their ``(do, lse, delta)``, :func:`dq_tile`; unread otherwise)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    t_lo, t_far_end, t_mix_end, t_loc_hi, t_hi = query_tile_key_bounds(p_min, p_max, w, BLOCK_N, HAS_LOCAL, HAS_FAR)
    if HAS_FAR:
        acc, m_i, l_i = key_tiles(acc, m_i, l_i, q, grad_rows, pos, t_lo, t_far_end, w, T, KF, VF, s_kft, s_vft,
                                  offs_n, offs_d, D, qk_scale, False, False, GRAD, PRECISION, BLOCK_N)
        acc, m_i, l_i = key_tiles(acc, m_i, l_i, q, grad_rows, pos, t_far_end, t_mix_end, w, T, KF, VF, s_kft, s_vft,
                                  offs_n, offs_d, D, qk_scale, False, True, GRAD, PRECISION, BLOCK_N)
    if HAS_LOCAL:
        t_mix_lo = t_far_end
        if w <= 0:  # no local pair: the straddling tiles hold far pairs only
            t_mix_lo = t_mix_end
        acc, m_i, l_i = key_tiles(acc, m_i, l_i, q, grad_rows, pos, t_mix_lo, t_mix_end, w, T, KL, VL, s_klt, s_vlt,
                                  offs_n, offs_d, D, qk_scale, True, True, GRAD, PRECISION, BLOCK_N)
        acc, m_i, l_i = key_tiles(acc, m_i, l_i, q, grad_rows, pos, t_mix_end, t_loc_hi, w, T, KL, VL, s_klt, s_vlt,
                                  offs_n, offs_d, D, qk_scale, True, False, GRAD, PRECISION, BLOCK_N)
        acc, m_i, l_i = key_tiles(acc, m_i, l_i, q, grad_rows, pos, t_loc_hi, t_hi, w, T, KL, VL, s_klt, s_vlt,
                                  offs_n, offs_d, D, qk_scale, True, True, GRAD, PRECISION, BLOCK_N)
    return acc, m_i, l_i


@triton.jit
def query_tile(Q, WIN, KV_HEADS, s_qb, s_qh, s_qt, G, R, T, D: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """The query tile of a query-major program (grid ``(query tiles, B x G x R)``, the heaviest (last) tiles
    first): ``(m0, b, h, kv, w, pos, row_ok, offs_d, q)``: its first row, batch, query and key/value head, the
    head's window, rows (BLOCK_M,), their validity, the head-dim offsets and the rows of ``Q`` (BLOCK_M, BLOCK_D)."""
    m0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    b = tl.program_id(1) // (G * R)
    h, kv = query_head(tl.program_id(1) % (G * R), KV_HEADS, R)
    w = tl.load(WIN + h)
    pos = m0 + tl.arange(0, BLOCK_M)
    row_ok = pos < T
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(Q + b * s_qb + h * s_qh, pos, row_ok, s_qt, offs_d, D)
    return m0, b, h, kv, w, pos, row_ok, offs_d, q


@triton.jit
def routed_tile(Q, K, V, ROWS, COUNTS, s_qb, s_qh, s_qt, s_kb, s_kh, s_vb, s_vh, H, R, T, D: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """The routed kernels' program (grid ``(row tiles, B x H)``, the heaviest (last) tiles first): rows
    ``tile * BLOCK_M ..`` of head ``bh``'s sorted routed list (``ROWS[bh]``, the first ``COUNTS[bh]`` valid):
    ``(live, bh, b, h, pos, row_ok, offs_d, q, Kp, Vp)``: whether the tile holds a routed row (a program past the
    head's count has nothing to do), the (batch, head) row, batch, query head, positions (BLOCK_M,), their
    validity, the head-dim offsets, the rows of ``Q`` and the head's key/value pointers."""
    tile = tl.num_programs(0) - 1 - tl.program_id(0)  # later routed rows see more keys
    bh = tl.program_id(1)
    count = tl.load(COUNTS + bh)
    b = bh // H
    h = bh % H
    kv = h // R
    r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = r < count
    pos = tl.load(ROWS + bh * T + r, mask=row_ok, other=0)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(Q + b * s_qb + h * s_qh, pos, row_ok, s_qt, offs_d, D)  # masked: nothing read past the count
    return tile * BLOCK_M < count, bh, b, h, pos, row_ok, offs_d, q, K + b * s_kb + kv * s_kh, V + b * s_vb + kv * s_vh


@triton.jit
def query_head(j, KV_HEADS, R):
    """Query head of launch slot ``j`` (0 <= j < G * R): the ``j % R``-th query head of key/value head
    ``KV_HEADS[j // R]``. Returns ``(h, kv)``."""
    kv = tl.load(KV_HEADS + j // R)
    return kv * R + j % R, kv


# ------------------------------------------------------------------------------------------------------------- kernels
@triton.autotune(configs=tile_configs(small_windows=True), key=FWD_KEY, prune_configs_by=PRUNE)
@triton.jit(do_not_specialize=["T_TUNE", "W_TUNE"])
def _fwd_kernel(Q, KL, VL, KF, VF, O, LSE, WIN, KV_HEADS,
                s_qb, s_qh, s_qt, s_klb, s_klh, s_klt, s_vlb, s_vlh, s_vlt,
                s_kfb, s_kfh, s_kft, s_vfb, s_vfh, s_vft, s_ob, s_oh, s_ot,
                H, R, G, T, T_TUNE, W_TUNE, D: tl.constexpr, qk_scale,
                HAS_LOCAL: tl.constexpr, HAS_FAR: tl.constexpr, PRECISION: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    m0, b, h, kv, w, pos, row_ok, offs_d, q = query_tile(Q, WIN, KV_HEADS, s_qb, s_qh, s_qt, G, R, T, D, BLOCK_M,
                                                         BLOCK_D)
    acc, m_i, l_i = attend_rows(q, None, pos, m0, tl.minimum(m0 + BLOCK_M, T) - 1, w, T,
                                KL + b * s_klb + kv * s_klh, VL + b * s_vlb + kv * s_vlh,
                                KF + b * s_kfb + kv * s_kfh, VF + b * s_vfb + kv * s_vfh,
                                s_klt, s_vlt, s_kft, s_vft, D, qk_scale, HAS_LOCAL, HAS_FAR, False, PRECISION,
                                BLOCK_M, BLOCK_N, BLOCK_D)
    out, lse = finish_rows(acc, m_i, l_i)
    store_rows(O + b * s_ob + h * s_oh, out, pos, row_ok, s_ot, offs_d, D)
    tl.store(LSE + (b * H + h) * T + pos, lse, mask=row_ok)


@triton.autotune(configs=tile_configs(), key=["T_TUNE", "D", "R"])
@triton.jit(do_not_specialize=["T_TUNE"])
def _routed_fwd_kernel(Q, K, V, O, LSE, ROWS, COUNTS,
                       s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_ob, s_oh, s_ot,
                       H, R, T, T_TUNE, D: tl.constexpr, qk_scale,
                       PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    """Rows ``tile * BLOCK_M ..`` of head ``bh``'s sorted routed list (``ROWS[bh]``, the first ``COUNTS[bh]``
    valid): full causal attention (the far path with ``w = 0``), written over the local pass's rows of ``O`` and
    ``LSE``. A program past the head's count does nothing."""
    live, bh, b, h, pos, row_ok, offs_d, q, Kp, Vp = routed_tile(Q, K, V, ROWS, COUNTS, s_qb, s_qh, s_qt, s_kb, s_kh,
                                                                 s_vb, s_vh, H, R, T, D, BLOCK_M, BLOCK_D)
    if live:
        acc, m_i, l_i = attend_rows(q, None, pos, tl.min(tl.where(row_ok, pos, T)),
                                    tl.max(tl.where(row_ok, pos, -1)), 0, T, Kp, Vp, Kp, Vp, s_kt, s_vt, s_kt, s_vt,
                                    D, qk_scale, False, True, False, PRECISION, BLOCK_M, BLOCK_N, BLOCK_D)
        out, lse = finish_rows(acc, m_i, l_i)
        store_rows(O + b * s_ob + h * s_oh, out, pos, row_ok, s_ot, offs_d, D)
        tl.store(LSE + bh * T + pos, lse, mask=row_ok)


# ----------------------------------------------------------------------------------------------------------- launchers
def launch_groups(windows: HeadWindows) -> list[dict]:
    """:func:`runtime.tuned_launch`'s groups: per head group its ``KV_HEADS``, ``G`` and ``W_TUNE``."""
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
                **kernel_strides(q=q, kl=k_loc, vl=v_loc, kf=k_far, vf=v_far, o=o), H=H, R=R, T=T, T_TUNE=seq_bucket(T),
                D=D, qk_scale=qk_scale, HAS_LOCAL=has_local, HAS_FAR=has_far, PRECISION=precision, BLOCK_D=block_d(D))
    tuned_launch(_fwd_kernel, windows.plans, ("fwd", q.dtype, D, R, has_local, has_far, precision),
                 launch_groups(windows), lambda meta, g: (triton.cdiv(T, meta["BLOCK_M"]), B * g["G"] * R), args)
    return o, lse


def routed_forward(q, k, v, o, lse, windows: HeadWindows, rows, counts):
    """Overwrite the routed rows (:func:`kernels.aha.route_rows`) of ``o``/``lse`` with full causal attention.
    One program per (tile of routed rows, query head); a tile past its head's count does nothing."""
    B, H, T, D = q.shape
    R = H // k.shape[1]
    _, qk_scale = qk_scales(D)
    precision = dot_precision(q.dtype, q.device)
    args = dict(Q=q, K=k, V=v, O=o, LSE=lse, ROWS=rows, COUNTS=counts, **kernel_strides(q=q, k=k, v=v, o=o), H=H,
                R=R, T=T, T_TUNE=seq_bucket(T), D=D, qk_scale=qk_scale, PRECISION=precision, BLOCK_D=block_d(D))
    tuned_launch(_routed_fwd_kernel, windows.plans, ("routed_fwd", q.dtype, D, R, precision), [{}],
                 lambda meta, g: (triton.cdiv(T, meta["BLOCK_M"]), B * H), args)


def kernel_strides(**tensors: torch.Tensor) -> dict:
    """``s_<name>b, s_<name>h, s_<name>t`` of each (B, heads, T, d_h) tensor, as the kernels name them."""
    return {f"s_{name}{axis}": st for name, t in tensors.items() for axis, st in zip("bht", s3(t))}
