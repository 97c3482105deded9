"""Where the kernels may run, tile configurations and tuned launches, and input checks with one-line errors.

Triton decides at decoration time (``import kernels``) whether a kernel is compiled for the GPU or run by its CPU
interpreter, from ``TRITON_INTERPRET``. So the variable must be set before the first ``import kernels``; the value
seen then is :data:`INTERPRET`.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from typing import NamedTuple

import torch
import triton
from triton import knobs

INTERPRET: bool = bool(knobs.runtime.interpret)
"""True when this process imported the kernels under ``TRITON_INTERPRET=1`` (CPU interpreter)."""

OPS = "neox_dar" if __package__ == "neox_dar.kernels" else "neox_dar_checkout"
"""The ``torch.library`` namespace of the kernels' custom ops (``torch.ops.neox_dar.mswa_forward``): the installed
package's; a checkout's top-level ``kernels`` folder registers its own, so both can live in one process."""

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

MAX_HEAD_DIM = 256
"""The largest d_h the kernels take (one register tile of d_h columns per row). ``neox_dar`` reads it as
``variants.spec.KERNEL_MAX_HEAD_DIM`` without importing Triton; a test holds the two equal."""

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
# Key-major backward (dk/dv, and dq by atomic adds): BLOCK_N keys own two (BLOCK_N, d_h) float32 accumulators and
# each step computes five products over BLOCK_M query rows (FlashAttention-2's backward), so it takes fewer query
# rows per step than the forward, and 8 warps except for 16-row steps: with 4 warps, 32- and 64-row steps spill at
# d_h = 64. Under Triton 3.9 each candidate below is spill-free at d_h 32 and 64 in the DAR and local backward; with
# atomic dq AHA's 32 x 64 spills 40 bytes at d_h 64, and Triton 3.6 spills a few more (docs/kernels.md's table).
_GPU_KEY_MAJOR_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=nw, num_stages=ns)
    for bm, bn, nw, ns in [(64, 64, 8, 3), (32, 64, 8, 3), (16, 64, 4, 3), (16, 128, 8, 2), (64, 32, 8, 3)]
]
# Without atomic dq (banded_backward's "rows" pass) a step does four products, not five, and keeps no dq tile:
# a 128-key tile with 32-row steps halves the passes over the query rows and stays spill-free at d_h 32 and 64
# (with atomic dq it does not; 64-row steps spill in both).
_GPU_KEY_MAJOR_WIDE_CONFIGS = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 128}, num_warps=8, num_stages=3)]
# The query-major dq kernel: q, do and the dq accumulator per query tile (one more row tile than the forward).
_GPU_DQ_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=nw, num_stages=ns)
    for bm, bn, nw, ns in [(128, 64, 8, 3), (64, 64, 4, 3), (64, 128, 8, 2), (128, 32, 8, 3), (64, 32, 4, 2)]
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
    for bm, bn, nw, ns in [(16, 16, 1, 2), (16, 32, 2, 2), (32, 16, 2, 2), (32, 32, 4, 2)]
]


def tile_configs(small_windows: bool = False) -> list[triton.Config]:
    """Autotune candidates for kernels over query rows; with ``small_windows``, also the small tiles (which
    :func:`prune_for_window` offers only to launches with small windows)."""
    if INTERPRET:
        return _INTERPRET_CONFIGS
    return _GPU_CONFIGS + (_GPU_SMALL_CONFIGS if small_windows else [])


def key_major_configs(small_windows: bool = False) -> list[triton.Config]:
    """Autotune candidates for the dk/dv kernels (one program per key tile, looping over query rows); the wide key
    tiles only serve launches without atomic ``dq`` (:func:`prune_for_window`)."""
    if INTERPRET:
        return _INTERPRET_CONFIGS
    return (_GPU_KEY_MAJOR_CONFIGS + _GPU_KEY_MAJOR_WIDE_CONFIGS
            + (_GPU_KEY_MAJOR_SMALL_CONFIGS if small_windows else []))


def query_major_dq_configs(small_windows: bool = False) -> list[triton.Config]:
    """Autotune candidates for the query-major ``dq`` kernel (one program per query tile, looping over keys)."""
    if INTERPRET:
        return _INTERPRET_CONFIGS
    return _GPU_DQ_CONFIGS + (_GPU_SMALL_CONFIGS if small_windows else [])


def is_small_tile(config: triton.Config) -> bool:
    """True for the small-window tiles (both sides <= 32; no standard candidate is that small)."""
    return max(config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]) <= 32


def is_wide_key_tile(config: triton.Config) -> bool:
    """True for the key-major tiles that only a backward without atomic ``dq`` keeps spill-free (see
    ``_GPU_KEY_MAJOR_WIDE_CONFIGS``)."""
    return config in _GPU_KEY_MAJOR_WIDE_CONFIGS


def prune_for_window(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Triton ``early_config_prune`` hook of the banded kernels: small tiles only for a sliding-window launch
    (no far path) whose window bucket ``W_TUNE`` is at most :data:`SMALL_WINDOW`; wide key tiles only for a
    backward without atomic ``dq``; standard tiles always."""
    args = {**named_args, **kwargs}
    small = not args.get("HAS_FAR", False) and not args.get("ROUTED", False) and 0 < args["W_TUNE"] <= SMALL_WINDOW
    wide = not args.get("ATOMIC_DQ", True)
    return [c for c in configs if (small or not is_small_tile(c)) and (wide or not is_wide_key_tile(c))] or configs


def block_d(head_dim: int) -> int:
    """Head-dim tile: the next power of two, at least 16 (``tl.dot``'s minimum); extra columns are masked."""
    return max(16, triton.next_power_of_2(head_dim))


def seq_bucket(seq_len: int) -> int:
    """The autotuner's key for a sequence length: the next power of two (``T_TUNE``). Evaluation pads each batch
    to its own width and generation grows T by one: keyed on the exact T, every new T would tune again."""
    return triton.next_power_of_2(seq_len)


@functools.lru_cache(maxsize=None)
def _warn_exact_fp32() -> None:
    warnings.warn("kernels: float32 inputs on CUDA use exact float32 products (input_precision='ieee', no tensor "
                  "cores) because torch.get_float32_matmul_precision() is 'highest'; "
                  "torch.set_float32_matmul_precision('high') selects TF32, bfloat16 inputs are faster still",
                  stacklevel=4)


def dot_precision(dtype: torch.dtype, device: torch.device) -> str:
    """``tl.dot`` input precision. Half inputs: tensor cores (the value is unused). float32 inputs follow PyTorch's
    own switch for float32 matrix products, ``torch.get_float32_matmul_precision()``: ``'highest'`` (PyTorch's
    default) gives exact float32 products (``'ieee'``; on CUDA with a one-time warning that this is the slow path),
    ``'high'`` or ``'medium'`` TF32 (``'tf32'``), as for every other float32 product of the model."""
    if dtype != torch.float32:
        return "tf32"
    if torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    if device.type == "cuda":
        _warn_exact_fp32()
    return "ieee"


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


def check_dtype(fn: str, dtype: torch.dtype) -> None:
    """TypeError unless ``dtype`` is one the kernels compute in (:data:`SUPPORTED_DTYPES`; not bfloat16 under the
    interpreter, whose bfloat16 ``tl.dot`` is wrong)."""
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{fn}: dtype {dtype} unsupported; use float16, bfloat16 or float32")
    if INTERPRET and dtype == torch.bfloat16:
        raise TypeError(f"{fn}: the Triton CPU interpreter computes bfloat16 tl.dot incorrectly; "
                        "use float32 or float16 under TRITON_INTERPRET=1")


def check_qkv(fn: str, q: torch.Tensor, **kv: torch.Tensor) -> int:
    """Validate ``q`` (B, H, T, d_h) and the key/value tensors ``kv``, each (B, H_kv, T, d_h) with one H_kv that
    divides H (grouped-query attention: query head ``h`` reads key/value head ``h // (H // H_kv)``), same dtype
    and device. Returns the group size ``H // H_kv``."""
    if q.dim() != 4:
        raise ValueError(f"{fn}: q must be (B, H, T, d_h), got shape {tuple(q.shape)}")
    check_dtype(fn, q.dtype)
    B, H, T, D = q.shape
    if not 1 <= D <= MAX_HEAD_DIM or T == 0:
        raise ValueError(f"{fn}: need 1 <= T and 1 <= d_h <= {MAX_HEAD_DIM}, got shape {tuple(q.shape)}")
    if B * H > 65535:
        raise ValueError(f"{fn}: batch x heads = {B * H} exceeds the 65535 programs of a grid axis; split the batch")
    if B * H * T * D >= 2**31:
        raise ValueError(f"{fn}: tensors of 2**31 or more elements are unsupported (int32 offsets); split the batch")
    check_device(fn, q)
    first = next(iter(kv))
    h_kv = kv[first].shape[1] if kv[first].dim() == 4 else 0
    for name, t in kv.items():
        if t.dim() != 4 or (t.shape[0], t.shape[2], t.shape[3]) != (B, T, D) or t.shape[1] != h_kv:
            raise ValueError(f"{fn}: {name} shape {tuple(t.shape)} must be (B, H_kv, T, d_h) = "
                             f"({B}, {h_kv or 'H_kv'}, {T}, {D}), the same H_kv for every key/value tensor")
        if t.dtype != q.dtype:
            raise TypeError(f"{fn}: {name} dtype {t.dtype} != q dtype {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{fn}: {name} is on {t.device} but q is on {q.device}")
    if h_kv == 0 or H % h_kv:
        raise ValueError(f"{fn}: key/value heads ({h_kv}) must divide query heads ({H})")
    return H // h_kv


def check_spans(fn: str, *tensors: torch.Tensor) -> None:
    """The kernels address with int32 offsets: each tensor's storage span (offset and strides, which only the eager
    tensors a custom op receives have; checked there) must stay under 2**31 elements."""
    for t in tensors:
        if t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) >= 2**31:
            raise ValueError(f"{fn}: tensors spanning 2**31 or more elements are unsupported (int32 offsets); "
                             "split the batch")


def check_window(fn: str, window) -> int:
    """A non-negative Python int window (``key j inside when i - j < window``)."""
    if isinstance(window, torch.Tensor):
        if window.numel() != 1:
            raise ValueError(f"{fn}: window must be a single integer, got a tensor of shape {tuple(window.shape)}")
        window = int(window.item())
    whole = (isinstance(window, numbers.Integral) and not isinstance(window, bool)
             or isinstance(window, float) and window.is_integer())
    if not whole or window < 0:
        raise ValueError(f"{fn}: window must be an integer >= 0, got {window!r}")
    return int(window)


def eager_or_op(op, impl, *args):
    """``impl(*args)`` in eager mode, ``op(*args)`` under torch.compile: ``op`` is ``impl`` registered as a custom op
    with a shape-only fake, which torch.compile traces as one node of the graph. In eager mode the call skips the
    custom op's dispatch (PyTorch's dispatcher and its Python wrappers), which costs the host tens of microseconds a
    call, the same order as a kernel launch."""
    return op(*args) if torch.compiler.is_compiling() else impl(*args)


def refuse_double_backward(do: torch.Tensor) -> None:
    """RuntimeError when a kernel's backward is asked to build a graph of its gradients (``create_graph=True`` with
    an output gradient that requires grad): it computes them without one, so a gradient of a gradient (a gradient
    penalty) would lose its term silently. SDPA's flash backward refuses the same."""
    if torch.is_grad_enabled() and do.requires_grad:
        raise RuntimeError("the Triton attention kernels have no double backward (create_graph=True): use "
                           "attention_impl: sdpa or reference for a gradient of a gradient")


def unit_last_dim(*ts: torch.Tensor) -> list[torch.Tensor]:
    """The tensors with stride 1 along d_h (copies only those that are not); other strides are passed to kernels."""
    return [t if t.stride(-1) == 1 else t.contiguous() for t in ts]


def new_heads(like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialized tensor shaped like ``like`` (B, H, T, d_h), stored as (B, T, H, d_h): the layout of the
    model's fused projections. The model's ``o.transpose(1, 2).reshape(B, T, H * d_h)`` is then a view, not a copy
    (as for SDPA's flash output), and a gradient copied into a fused ``qkv`` gradient reads whole (t, head) rows."""
    B, H, T, D = like.shape
    return torch.empty((B, T, H, D), dtype=dtype or like.dtype, device=like.device).transpose(1, 2)


def s3(t: torch.Tensor) -> tuple[int, int, int]:
    """Batch, head and row strides of a (B, H, T, d_h) tensor."""
    return t.stride(0), t.stride(1), t.stride(2)


# ---------------------------------------------------------------------------------------------- head groups
class HeadGroup(NamedTuple):
    """Key/value heads launched together: ``kv_heads`` int32 (G,) on the kernels' device (their query heads are
    ``kv * R .. kv * R + R - 1``, R = H // H_kv), and ``tune_bucket``, the autotuner's key for them: the largest of
    their query heads' windows (capped at T), rounded up to a power of two; 0 when every window is 0."""

    kv_heads: torch.Tensor
    tune_bucket: int


class HeadWindows(NamedTuple):
    """Per-query-head windows: ``values`` int32 (H,) on the kernels' device, and ``groups``, one launch each before
    tuning: key/value heads whose windows share a tune bucket. A launch's tile shape is tuned for its bucket, so a
    head with window 8 is not run with the tiles of a head with window 512 (MSWA mixes both in one layer).
    ``plans``: per kernel and specialization, the tuned launches (:func:`tuned_launch`), filled on first use."""

    values: torch.Tensor
    groups: tuple[HeadGroup, ...]
    plans: dict


def tune_bucket(window: int, seq_len: int) -> int:
    """``min(window, T)`` rounded up to a power of two; 0 for a zero window."""
    w = min(window, seq_len)
    return triton.next_power_of_2(w) if w > 0 else 0


@functools.lru_cache(maxsize=1024)
def _grouped_windows(values: tuple[int, ...], t_bucket: int, device: torch.device, group_by_window: bool,
                     kv_group: int) -> HeadWindows:
    """The device tensors and launch groups of ``values``, built once per (windows, T bucket, device, grouping,
    query heads per key/value head): a later layer with the same windows neither copies to the device, nor
    synchronizes, nor regroups, and reuses the tuned launches."""
    per_kv = [max(tune_bucket(v, t_bucket) for v in values[kv * kv_group:(kv + 1) * kv_group])
              for kv in range(len(values) // kv_group)]
    if not group_by_window:
        per_kv = [max(per_kv)] * len(per_kv)

    def int32(xs):
        return torch.tensor(xs, dtype=torch.int32, device=device)

    groups = tuple(HeadGroup(int32([kv for kv, b in enumerate(per_kv) if b == bucket]), bucket)
                   for bucket in sorted(set(per_kv), reverse=True))
    return HeadWindows(int32(values), groups, {})


def window_values(fn: str, windows, num_heads: int) -> list[int]:
    """Validated per-query-head windows as Python ints, each clamped to 2**30 (beyond any sequence): ``windows`` an
    int (every head), a list/tuple of ints or an integer tensor (H,). A tensor is read on the host: a CPU tensor
    costs nothing, a CUDA tensor a device synchronization (and, under torch.compile, a graph break)."""
    if isinstance(windows, torch.Tensor):
        if windows.dim() != 1 or windows.shape[0] != num_heads:
            raise ValueError(f"{fn}: windows must have shape ({num_heads},), got {tuple(windows.shape)}")
        if windows.dtype.is_floating_point or windows.dtype == torch.bool:
            raise TypeError(f"{fn}: windows must be an integer tensor, got {windows.dtype}")
        values = windows.tolist()
    elif isinstance(windows, (list, tuple)):
        if len(windows) != num_heads:
            raise ValueError(f"{fn}: windows must hold one window per query head ({num_heads}), got {len(windows)}")
        values = [check_window(fn, w) for w in windows]
    else:
        values = [check_window(fn, windows)] * num_heads
    if min(values) < 0:
        raise ValueError(f"{fn}: every window must be >= 0, got {values}")
    return [min(v, 2**30) for v in values]


def head_windows(fn: str, windows, num_heads: int, seq_len: int, device: torch.device,
                 group_by_window: bool = True, kv_group: int = 1) -> HeadWindows:
    """Validate per-head windows (:func:`window_values`), place them on ``device`` and group the key/value heads
    (``kv_group`` query heads each) by tune bucket (or, without ``group_by_window``, all in one group tuned for the
    largest window); built once per distinct argument set (cached)."""
    return launch_windows(window_values(fn, windows, num_heads), seq_len, device, group_by_window, kv_group)


def launch_windows(values: list[int], seq_len: int, device: torch.device, group_by_window: bool = True,
                   kv_group: int = 1) -> HeadWindows:
    """:func:`head_windows` of windows already validated by :func:`window_values` (one Python int per query head):
    what the kernels' custom ops receive from their entry points, so a call validates its windows once."""
    return _grouped_windows(tuple(values), seq_bucket(seq_len), device, group_by_window, kv_group)


def tile_of(config: triton.Config) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of an autotune candidate."""
    return config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps, config.num_stages


def tuned_launch(kernel, plans: dict, name: tuple, groups: list[dict], grid, args: dict,
                 scratch=lambda: {}) -> None:
    """Launch the autotuned ``kernel`` once per head group, then, once tuned, once per distinct tile shape.

    ``groups``: per launch group the arguments that differ (``KV_HEADS``, ``G``, ``W_TUNE``), or ``[{}]`` for an
    ungrouped kernel; ``grid(meta, group)`` -> the launch grid; ``args``: every other argument, by name. The first
    call for ``name`` (the kernel and its specialization, a key of ``plans``) runs each group through the
    autotuner (its key holds the group's window bucket and size) with ``scratch`` replacing the arguments the
    kernel accumulates into (a tuning run must not add into them twice), records each group's tuned
    configuration and merges groups that got the same one. Every call then launches that plan straight through
    ``kernel.fn``: no ``Autotuner.run`` bookkeeping per launch, and one launch per tile shape. ``scratch()`` is
    called only when tuning.
    """
    plan = plans.get(name)
    if plan is None:
        tuned: dict[tuple, list[dict]] = {}
        configs = {}
        spare = scratch()
        for group in groups:
            kernel[lambda meta, group=group: grid(meta, group)](**{**args, **spare, **group})
            config = kernel.best_config
            configs[tile_of(config)] = config
            tuned.setdefault(tile_of(config), []).append(group)
        plan = plans[name] = [(configs[tile], _merge_groups(members)) for tile, members in tuned.items()]
    for config, group in plan:
        kernel.fn[grid(config.kwargs, group)](**args, **group, **config.all_kwargs())


def _merge_groups(members: list[dict]) -> dict:
    """One launch for head groups tuned to the same tile: their key/value heads concatenated."""
    if len(members) == 1:
        return members[0]
    heads = torch.cat([m["KV_HEADS"] for m in members])
    return {**members[0], "KV_HEADS": heads, "G": heads.numel(), "W_TUNE": max(m["W_TUNE"] for m in members)}
