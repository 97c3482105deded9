"""Where the kernels may run, tile configurations for the autotuner, and input checks with one-line errors.

Triton decides at decoration time (``import kernels``) whether a kernel is compiled for the GPU or run by its CPU
interpreter, from ``TRITON_INTERPRET``. So the variable must be set before the first ``import kernels``; the value
seen then is :data:`INTERPRET`.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton
from triton import knobs

INTERPRET: bool = bool(knobs.runtime.interpret)
"""True when this process imported the kernels under ``TRITON_INTERPRET=1`` (CPU interpreter)."""

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Tiles. The interpreter runs every program serially in numpy: 16 x 16 tiles keep the tests fast and make
# T ~ 20..70 span several tiles, so every loop segment (pure far, masked, pure local) is exercised.
_INTERPRET_CONFIGS = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=1, num_stages=1)]
# GPU candidates (FlashAttention-2 style shapes; small key tiles serve heads whose window is small). Chosen with
# ptxas's sm_90a report (bench/attention.py --compile-only, docs/kernels.md): every kernel keeps candidates that
# do not spill registers at d_h 32, 64 and 128 under Triton 3.6 and 3.9; 128-row tiles use 8 warps, because with 4
# warps the two-path (DAR) kernels spill. The autotuner then picks by timing.
_GPU_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=nw, num_stages=ns)
    for bm, bn, nw, ns in [
        (128, 64, 8, 3), (64, 64, 4, 3), (64, 64, 8, 3), (128, 128, 8, 2),
        (64, 128, 4, 3), (128, 32, 8, 3), (64, 32, 4, 2), (64, 16, 4, 2),
    ]
]
# Key-major backward (dk/dv): BLOCK_N keys own up to four (BLOCK_N, d_h) float32 accumulators (DAR), so it
# prefers fewer query rows per step (BLOCK_M) than the query-major kernels, as FlashAttention-2's backward does.
_GPU_KEY_MAJOR_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=nw, num_stages=ns)
    for bm, bn, nw, ns in [
        (32, 64, 4, 3), (32, 128, 8, 3), (64, 64, 4, 3), (32, 64, 8, 3),
        (16, 64, 4, 3), (64, 32, 8, 3), (64, 32, 4, 3), (16, 128, 8, 2),
    ]
]

# Small tiles for heads whose sliding window is small: a 64-row query tile with window 8 scores ~70 keys per row to
# use 8 (its diagonal tiles dominate); 16- and 32-row tiles cut that several-fold. Below 64 rows the products are
# mma.sync, not wgmma. Offered to the autotuner only for windows up to SMALL_WINDOW (see prune_for_window).
SMALL_WINDOW = 64
_GPU_SMALL_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=nw, num_stages=ns)
    for bm, bn, nw, ns in [(16, 16, 1, 2), (16, 32, 2, 2), (32, 16, 2, 2), (32, 32, 4, 2)]
]
_GPU_KEY_MAJOR_SMALL_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=nw, num_stages=ns)
    for bm, bn, nw, ns in [(16, 16, 1, 2), (16, 32, 2, 2), (32, 16, 2, 2), (32, 32, 2, 2)]
]


def tile_configs(small_windows: bool = False) -> list[triton.Config]:
    """Autotune candidates for kernels over query rows; with ``small_windows``, also the small tiles (which
    :func:`prune_for_window` offers only to launches with small windows)."""
    if INTERPRET:
        return _INTERPRET_CONFIGS
    return _GPU_CONFIGS + (_GPU_SMALL_CONFIGS if small_windows else [])


def key_major_configs(small_windows: bool = False) -> list[triton.Config]:
    """Autotune candidates for the dk/dv kernels (one program per key tile, looping over query rows)."""
    if INTERPRET:
        return _INTERPRET_CONFIGS
    return _GPU_KEY_MAJOR_CONFIGS + (_GPU_KEY_MAJOR_SMALL_CONFIGS if small_windows else [])


def is_small_tile(config: triton.Config) -> bool:
    """True for the small-window tiles (both sides <= 32; no standard candidate is that small)."""
    return max(config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]) <= 32


def prune_for_window(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Triton ``early_config_prune`` hook of the banded kernels: small tiles only for a sliding-window launch
    (no far path) whose window bucket ``W_TUNE`` is at most :data:`SMALL_WINDOW`; standard tiles always."""
    small = not kwargs.get("HAS_FAR", False) and 0 < named_args["W_TUNE"] <= SMALL_WINDOW
    return [c for c in configs if small or not is_small_tile(c)] or configs


def block_d(head_dim: int) -> int:
    """Head-dim tile: the next power of two, at least 16 (``tl.dot``'s minimum); extra columns are masked."""
    return max(16, triton.next_power_of_2(head_dim))


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: exact fp32 products for fp32 inputs (tests), tensor-core inputs otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"


def qk_scales(head_dim: int) -> tuple[float, float]:
    """``(sm_scale, qk_scale)``: ``1/sqrt(d_h)`` and the same times ``log2(e)`` for base-2 softmax."""
    sm = 1.0 / math.sqrt(head_dim)
    return sm, sm * math.log2(math.e)


def check_device(name: str, t: torch.Tensor) -> None:
    """Raise a clear error when ``t`` lives where these Triton kernels cannot run."""
    if t.device.type == "cuda":
        if INTERPRET:
            raise RuntimeError(f"{name}: kernels were imported under TRITON_INTERPRET=1 (CPU interpreter) but got a "
                               "CUDA tensor; unset TRITON_INTERPRET before importing kernels to run on the GPU")
        return
    if t.device.type == "cpu":
        if not INTERPRET:
            raise RuntimeError(f"{name}: Triton kernels need a CUDA tensor; on CPU they run only under the Triton "
                               "interpreter: set TRITON_INTERPRET=1 before importing kernels (slow, for tests)")
        return
    raise RuntimeError(f"{name}: Triton kernels run on CUDA (or CPU under TRITON_INTERPRET=1), got device {t.device}")


def check_qkv(fn: str, q: torch.Tensor, **others: torch.Tensor) -> None:
    """Validate ``q`` (B, H, T, d_h) and every tensor in ``others`` against it: same shape, dtype and device."""
    if q.dim() != 4:
        raise ValueError(f"{fn}: q must be (B, H, T, d_h), got shape {tuple(q.shape)}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{fn}: dtype {q.dtype} unsupported; use float16, bfloat16 or float32")
    if INTERPRET and q.dtype == torch.bfloat16:
        raise TypeError(f"{fn}: the Triton CPU interpreter computes bfloat16 tl.dot incorrectly; "
                        "use float32 or float16 under TRITON_INTERPRET=1")
    if q.shape[-1] > 256 or q.shape[2] == 0:
        raise ValueError(f"{fn}: need 1 <= T and d_h <= 256, got shape {tuple(q.shape)}")
    spans = [t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
             for t in (q, *others.values())]
    if max(spans) >= 2**31:
        raise ValueError(f"{fn}: tensors spanning 2**31 or more elements are unsupported (int32 offsets); "
                         "split the batch")
    check_device(fn, q)
    for name, t in others.items():
        if t.shape != q.shape:
            raise ValueError(f"{fn}: {name} shape {tuple(t.shape)} != q shape {tuple(q.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{fn}: {name} dtype {t.dtype} != q dtype {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{fn}: {name} is on {t.device} but q is on {q.device}")


def check_window(fn: str, window) -> int:
    """A non-negative Python int window (``key j inside when i - j < window``)."""
    if isinstance(window, torch.Tensor):
        if window.numel() != 1:
            raise ValueError(f"{fn}: window must be a single integer, got a tensor of shape {tuple(window.shape)}")
        window = int(window.item())
    if isinstance(window, bool) or int(window) != window or window < 0:
        raise ValueError(f"{fn}: window must be an integer >= 0, got {window!r}")
    return int(window)


def unit_last_dim(*ts: torch.Tensor) -> list[torch.Tensor]:
    """The tensors with stride 1 along d_h (copies only those that are not); other strides are passed to kernels."""
    return [t if t.stride(-1) == 1 else t.contiguous() for t in ts]


class HeadGroup(NamedTuple):
    """Heads launched together: ``heads`` int32 (G,) on the kernels' device, and ``tune_bucket``, the autotuner's
    key for them: their window (capped at T) rounded up to a power of two, 0 for a zero window."""

    heads: torch.Tensor
    tune_bucket: int


class HeadWindows(NamedTuple):
    """Per-head windows: ``values`` int32 (H,) on the kernels' device, and ``groups``, one launch each: heads
    whose windows share a tune bucket. A launch's tile shape is tuned for its bucket, so a head with window 8 is
    not run with the tiles of a head with window 512 (MSWA mixes both in one layer)."""

    values: torch.Tensor
    groups: tuple[HeadGroup, ...]


def tune_bucket(window: int, seq_len: int) -> int:
    """``min(window, T)`` rounded up to a power of two; 0 for a zero window."""
    w = min(window, seq_len)
    return triton.next_power_of_2(w) if w > 0 else 0


@functools.lru_cache(maxsize=1024)
def _grouped_windows(values: tuple[int, ...], seq_len: int, device: torch.device,
                     group_by_window: bool) -> HeadWindows:
    """The device tensors and launch groups of ``values``, built once per (windows, T, device, grouping): a
    later layer with the same windows neither copies to the device, nor synchronizes, nor regroups."""
    buckets = [tune_bucket(v, seq_len) for v in values]
    if not group_by_window:
        buckets = [max(buckets)] * len(values)

    def int32(xs):
        return torch.tensor(xs, dtype=torch.int32, device=device)

    groups = tuple(HeadGroup(int32([h for h, b in enumerate(buckets) if b == bucket]), bucket)
                   for bucket in sorted(set(buckets), reverse=True))
    return HeadWindows(int32(values), groups)


def head_windows(fn: str, windows: torch.Tensor | int, num_heads: int, seq_len: int, device: torch.device,
                 group_by_window: bool = True) -> HeadWindows:
    """Validate per-head windows (an int for every head, or an integer tensor (H,)), place them on ``device``
    and group the heads by tune bucket (or, without ``group_by_window``, all heads in one group tuned for the
    largest window).

    Windows are read on the host: a CPU tensor (or an int) costs nothing; a CUDA tensor costs one device
    synchronization per call. Values are clamped to 2**30 (beyond any sequence).
    """
    if isinstance(windows, torch.Tensor):
        if windows.dim() != 1 or windows.shape[0] != num_heads:
            raise ValueError(f"{fn}: windows must have shape ({num_heads},), got {tuple(windows.shape)}")
        if windows.dtype.is_floating_point or windows.dtype == torch.bool:
            raise TypeError(f"{fn}: windows must be an integer tensor, got {windows.dtype}")
        values = windows.tolist()
        if min(values) < 0:
            raise ValueError(f"{fn}: every window must be >= 0, got {values}")
    else:
        values = [check_window(fn, windows)] * num_heads
    return _grouped_windows(tuple(min(v, 2**30) for v in values), seq_len, device, group_by_window)
