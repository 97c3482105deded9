"""Triton kernels (kernels/) against a float64 PyTorch reference with explicit masks: outputs and every gradient.

Device-aware: on a machine with CUDA (and ``TRITON_INTERPRET`` unset) the kernels run compiled on the GPU in
float32, float16 and bfloat16; elsewhere this module sets ``TRITON_INTERPRET=1`` before importing the kernels and
runs them in Triton's CPU interpreter in float32 and float16 (the interpreter's bfloat16 ``tl.dot`` is wrong).
Shapes are tiny with T not a multiple of the 16-row interpreter tile, so every loop segment (pure far, boundary
straddling, pure local, diagonal) runs.

The last test runs the tiny model (configs/tiny.yml) through the attention variants with
``attention_impl: triton`` against ``reference``.

Tolerances (relative Frobenius error ``|x - ref| / |ref|`` against float64 on the same rounded inputs):
float32 1e-5 (exact fp32 products, ``input_precision="ieee"``), float16 1e-2, bfloat16 3e-2.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

import kernels  # noqa: E402  (TRITON_INTERPRET must be set before this import)
from kernels import aha_attention, dar_attention, mswa_attention  # noqa: E402
from kernels.aha import route_rows  # noqa: E402
from kernels.runtime import tile_of  # noqa: E402
from neox_dar.config import load_config  # noqa: E402
from neox_dar.model import build_model  # noqa: E402

assert kernels.INTERPRET != ON_GPU, "kernels was imported before this module chose the device; run it alone"

DEVICE = torch.device("cuda" if ON_GPU else "cpu")
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True, scope="module")
def one_intra_op_thread():
    """Tiny tensors: one intra-op thread is faster than many on a loaded CPU; restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1 if not ON_GPU else before)
    yield
    torch.set_num_threads(before)


# Compiled, the autotuner would compile every candidate (8 to 12) for every dtype, head size and path the tests use:
# about 100 kernel specializations (dtype x head size x path, counted from the cases below), so over 1000
# compilations. Correctness does not depend on the tile, so on the GPU each kernel is pinned to one candidate that
# fits every head size here (d_h <= 128) and compiles to the Hopper wgmma products the tuned tiles use: 64 x 64 for
# both families (8 warps for the key-major one). The long-sequence identity checks at the end tune over every
# candidate; so does every test with KERNEL_TESTS_ALL_CONFIGS=1 (slow).
PINNED_TILES = {"query_major": (64, 64, 4, 3), "key_major": (64, 64, 8, 3)}


def tuners():
    """The autotuned kernels by family."""
    from kernels import backward, banded

    return {"query_major": [banded._fwd_kernel, banded._routed_fwd_kernel, backward._dq_kernel],
            "key_major": [backward._bwd_kernel]}


@pytest.fixture(autouse=True)
def one_tile_per_kernel_when_compiled(request):
    from kernels.runtime import _grouped_windows

    if not ON_GPU or os.environ.get("KERNEL_TESTS_ALL_CONFIGS") == "1" or getattr(request.function, "tuned", False):
        yield
        return
    saved = {}
    for family, kernels_ in tuners().items():
        for tuner in kernels_:
            pinned = [c for c in tuner.configs if tile_of(c) == PINNED_TILES[family]]
            assert len(pinned) == 1, f"{tuner.base_fn.__name__}: no candidate {PINNED_TILES[family]}"
            saved[tuner], tuner.configs = tuner.configs, pinned
    _grouped_windows.cache_clear()  # the tuned launch plans live with the cached windows
    yield
    for tuner, configs in saved.items():
        tuner.configs = configs
    _grouped_windows.cache_clear()


def test_pinned_gpu_tiles_are_real_candidates():
    """What the GPU run pins must be one of the candidates the kernels tune over (checked on any machine)."""
    from kernels import runtime

    assert PINNED_TILES["query_major"] in {tile_of(c) for c in runtime._GPU_CONFIGS}
    assert PINNED_TILES["query_major"] in {tile_of(c) for c in runtime._GPU_DQ_CONFIGS}
    assert PINNED_TILES["key_major"] in {tile_of(c) for c in runtime._GPU_KEY_MAJOR_CONFIGS}


# ------------------------------------------------------------------------------------------------ reference
def two_path_reference(q, k_loc, v_loc, k_far, v_far, local, far):
    """float64 softmax attention: pair (i, j) uses the local k/v where ``local`` and the far k/v where ``far``.

    ``local``, ``far``: bool, broadcast to (B, H, T, T), disjoint. A row with no pair gives zeros. Key/value
    tensors with fewer heads than ``q`` (grouped-query attention) serve ``H // H_kv`` consecutive query heads each.
    """
    group = q.shape[1] // k_loc.shape[1]
    q = q.double()
    k_loc, v_loc, k_far, v_far = (t.double().repeat_interleave(group, dim=1) for t in (k_loc, v_loc, k_far, v_far))
    s = torch.where(local, q @ k_loc.transpose(-1, -2), q @ k_far.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    p = torch.softmax(s.masked_fill(~(local | far), float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.where(local, p, 0.0) @ v_loc + torch.where(far, p, 0.0) @ v_far


def distances(T: int) -> torch.Tensor:
    """(T, T) ``i - j``; negative above the diagonal."""
    pos = torch.arange(T, device=DEVICE)
    return pos[:, None] - pos[None, :]


def leaves(n: int, shape, dtype) -> list[torch.Tensor]:
    """``n`` random leaf tensors (never zeros), rounded to ``dtype``."""
    return [torch.randn(shape, device=DEVICE).to(dtype).requires_grad_() for _ in range(n)]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_against_reference(out, inputs, ref_fn, dtype, label):
    """Compare ``out`` and the gradients of ``inputs`` with ``ref_fn(*float64 copies)`` under one upstream grad."""
    assert torch.isfinite(out).all(), f"{label}: non-finite output"
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    ref = ref_fn(*ref_inputs)
    ref.backward(grad_out.double())
    errs = {"out": rel_err(out, ref)}
    for n, (t, r) in enumerate(zip(inputs, ref_inputs)):
        errs[f"grad{n}"] = rel_err(t.grad, r.grad) if r.grad.norm() > 0 else t.grad.double().abs().max().item()
    bad = {k: v for k, v in errs.items() if not v <= TOL[dtype]}
    assert not bad, f"{label} {dtype}: relative errors over {TOL[dtype]:g}: {bad}"


# ------------------------------------------------------------------------------------------------ DAR
# (B, H, T, d_h, w): w in {0, 1, 5, 128, >= T}, plus a window that is not a tile multiple over several tiles.
def with_dtypes(cases, half_cases):
    """Every case in float32; the ``half_cases`` indices also in the half dtypes (every case on the GPU)."""
    return [(*c, dt) for n, c in enumerate(cases) for dt in DTYPES
            if dt == torch.float32 or ON_GPU or n in half_cases]


def dtype_id(value):
    """Test ids name the dtype (``float32``), so that a run can select by dtype with -k; other values as pytest's."""
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else None


DAR_CASES = [(2, 2, 37, 16, 0), (2, 3, 45, 32, 1), (1, 2, 70, 64, 5), (2, 2, 33, 128, 128), (2, 2, 50, 32, 50),
             (1, 2, 69, 16, 20), (1, 2, 64, 32, 16)]


@pytest.mark.parametrize("B,H,T,D,w,dtype", with_dtypes(DAR_CASES, half_cases=(1, 5)), ids=dtype_id)
def test_dar_matches_reference(B, H, T, D, w, dtype):
    torch.manual_seed(T * 1000 + w)
    inputs = leaves(5, (B, H, T, D), dtype)
    delta = distances(T)
    local = (delta >= 0) & (delta < w)
    far = (delta >= 0) & (delta >= w)
    out = dar_attention(*inputs, w)
    assert out.shape == (B, H, T, D) and out.dtype == dtype
    check_against_reference(out, inputs, lambda *x: two_path_reference(*x, local, far), dtype, f"dar w={w}")


# ------------------------------------------------------------------------------------------------ MSWA
MSWA_CASES = [(1, 4, 53, 32, [1, 5, 17, 128]), (1, 4, 40, 16, [0, 2, 16, 64]), (2, 2, 29, 64, [29, 3]),
              (1, 3, 50, 128, [8, 33, 1]), (1, 2, 30, 24, [4, 30])]  # d_h = 24: padded, masked columns


@pytest.mark.parametrize("B,H,T,D,windows,dtype", with_dtypes(MSWA_CASES, half_cases=(0,)), ids=dtype_id)
def test_mswa_matches_reference(B, H, T, D, windows, dtype):
    torch.manual_seed(T)
    win = torch.tensor(windows, device=DEVICE)
    delta = distances(T)
    local = (delta >= 0) & (delta < win[:, None, None])  # (H, T, T)
    for grouped in (True, False):  # one launch per window group (default), or every head in one launch
        q, k, v = leaves(3, (B, H, T, D), dtype)
        out = mswa_attention(q, k, v, win, group_by_window=grouped)
        check_against_reference(out, [q, k, v],
                                lambda q, k, v: two_path_reference(q, k, v, k, v, local, local & False),
                                dtype, f"mswa windows={windows} group_by_window={grouped}")


def test_mswa_equal_windows_is_swa_and_accepts_strided_inputs():
    """q, k, v as the model makes them (chunks of one fused projection: non-contiguous, strided heads)."""
    torch.manual_seed(3)
    B, H, T, D, w = 2, 2, 35, 16, 7
    qkv = torch.randn(B, T, H, 3 * D, device=DEVICE).transpose(1, 2).requires_grad_()
    q, k, v = qkv.chunk(3, dim=-1)
    assert not q.is_contiguous()
    out = mswa_attention(q, k, v, torch.full((H,), w, dtype=torch.long))
    # stored as (B, T, H, d_h): the model's out.transpose(1, 2).reshape(B, T, H * d_h) is a view, and the upstream
    # gradient (randn_like keeps that layout) reaches the kernel as a strided view, not a copy
    assert out.transpose(1, 2).is_contiguous()
    delta = distances(T)
    local = (delta >= 0) & (delta < w)
    check_against_reference(out, [qkv], lambda x: two_path_reference(*x.chunk(3, -1), *x.chunk(3, -1)[1:],
                                                                     local, local & False),
                            torch.float32, "swa strided")


# ------------------------------------------------------------------------------------------------ AHA
# (B, H, T, d_h, w, fraction of rows routed to full attention)
AHA_CASES = [(2, 2, 45, 32, 5, 0.1), (1, 2, 70, 16, 20, 0.5), (2, 2, 37, 64, 1, 1.0), (1, 2, 40, 128, 128, 0.3),
             (2, 2, 33, 16, 4, 0.0)]


@pytest.mark.parametrize("B,H,T,D,w,frac,dtype", with_dtypes(AHA_CASES, half_cases=(0,)), ids=dtype_id)
def test_aha_matches_reference(B, H, T, D, w, frac, dtype):
    torch.manual_seed(T + w)
    q, k, v = leaves(3, (B, H, T, D), dtype)
    gate = torch.rand(B, H, T, device=DEVICE) < frac
    delta = distances(T)
    causal = delta >= 0
    allowed = torch.where(gate[..., None], causal, causal & (delta < w))  # (B, H, T, T)
    out = aha_attention(q, k, v, gate, w)
    check_against_reference(out, [q, k, v], lambda q, k, v: two_path_reference(q, k, v, k, v, allowed, allowed & False),
                            dtype, f"aha w={w} frac={frac}")


def test_route_rows_compacts_each_heads_routed_positions_in_order():
    gate = torch.zeros(2, 2, 40, dtype=torch.bool, device=DEVICE)
    gate[0, 1, [3, 9, 17, 18, 39]] = True
    gate[1, 0, torch.arange(0, 40, 2)] = True
    rows, counts = route_rows(gate)
    assert rows.shape == (4, 40) and rows.dtype == torch.int32
    assert counts.tolist() == [0, 5, 20, 0]
    assert rows[1, :5].tolist() == [3, 9, 17, 18, 39] and rows[2, :20].tolist() == list(range(0, 40, 2))
    assert all(sorted(r.tolist()) == list(range(40)) for r in rows)  # a permutation of the positions per head


# ------------------------------------------------------------------------------------------------ GQA
# (B, H, H_kv, T, d_h): key/value heads shared by 2 and by all 6 query heads (multi-query); windows, gates per
# query head, differing inside a group
GQA_CASES = [(2, 4, 2, 41, 32), (1, 6, 1, 37, 16)]


@pytest.mark.parametrize("B,H,Hkv,T,D", GQA_CASES)
@pytest.mark.parametrize("variant", ["dar", "mswa", "aha"])
def test_grouped_query_attention_matches_reference(variant, B, H, Hkv, T, D):
    """k/v with fewer heads than q, read in place (query head h -> key/value head h // (H / H_kv)): outputs and
    every gradient against float64, a key/value head's gradient summing over its query group."""
    torch.manual_seed(T + H)
    delta = distances(T)
    causal = delta >= 0
    q = leaves(1, (B, H, T, D), torch.float32)[0]
    if variant == "dar":
        kv = leaves(4, (B, Hkv, T, D), torch.float32)
        out = dar_attention(q, *kv, 7)
        ref = lambda *x: two_path_reference(*x, causal & (delta < 7), delta >= 7)  # noqa: E731
    elif variant == "mswa":
        kv = leaves(2, (B, Hkv, T, D), torch.float32)
        windows = torch.tensor([3, 20, 9, 64, 1, 5][:H])
        out = mswa_attention(q, *kv, windows)
        local = causal & (delta < windows.to(DEVICE)[:, None, None])
        ref = lambda q, k, v: two_path_reference(q, k, v, k, v, local, local & False)  # noqa: E731
    else:
        kv = leaves(2, (B, Hkv, T, D), torch.float32)
        gate = torch.rand(B, H, T, device=DEVICE) < 0.3
        out = aha_attention(q, *kv, gate, 5)
        allowed = torch.where(gate[..., None], causal, causal & (delta < 5))
        ref = lambda q, k, v: two_path_reference(q, k, v, k, v, allowed, allowed & False)  # noqa: E731
    assert out.shape == (B, H, T, D)
    check_against_reference(out, [q, *kv], ref, torch.float32, f"{variant} gqa H={H} H_kv={Hkv}")


# ------------------------------------------------------------------------------------------------ dq passes
@pytest.fixture
def rows_dq_pass(monkeypatch):
    """Every backward through autograd computes dq by the query-major pass (kernels.backward.DQ_PASS = "rows")."""
    from kernels import backward

    monkeypatch.setattr(backward, "DQ_PASS", "rows")


# DAR at w = 0 (every pair far), a window inside one tile, w = T and a window spanning tiles; half inputs once
ROWS_DAR_CASES = [(*DAR_CASES[0], torch.float32), (*DAR_CASES[2], torch.float32), (*DAR_CASES[4], torch.float32),
                  (*DAR_CASES[5], torch.float32), (*DAR_CASES[1], torch.float16)]


@pytest.mark.parametrize("B,H,T,D,w,dtype", ROWS_DAR_CASES, ids=dtype_id)
def test_dar_with_the_query_major_dq_pass_matches_reference(B, H, T, D, w, dtype, rows_dq_pass):
    """banded_backward's "rows" pass (no atomics: dk/dv key-major with four products, dq query-major) gives the
    same gradients as the float64 reference."""
    test_dar_matches_reference(B, H, T, D, w, dtype)


@pytest.mark.parametrize("B,H,T,D,windows,dtype", [(*MSWA_CASES[1], torch.float32), (*MSWA_CASES[4], torch.float32)],
                         ids=dtype_id)
def test_mswa_with_the_query_major_dq_pass_matches_reference(B, H, T, D, windows, dtype, rows_dq_pass):
    """Windows of 0 keys, inside a tile, across tiles and past T; a padded d_h (24)."""
    test_mswa_matches_reference(B, H, T, D, windows, dtype)


# AHA: some rows routed over tiles, every row routed (the routed dq kernel writes over all of them), w = T, none
@pytest.mark.parametrize("B,H,T,D,w,frac,dtype", [(*AHA_CASES[0], torch.float32), (*AHA_CASES[2], torch.float32),
                                                  (*AHA_CASES[3], torch.float32), (*AHA_CASES[4], torch.float32),
                                                  (*AHA_CASES[1], torch.float16)], ids=dtype_id)
def test_aha_with_the_query_major_dq_pass_matches_reference(B, H, T, D, w, frac, dtype, rows_dq_pass):
    """AHA's "rows" pass: the key-major kernel's routed far pairs without atomic dq, then the local dq of every
    row and the routed rows' full dq written over it."""
    test_aha_matches_reference(B, H, T, D, w, frac, dtype)


@pytest.mark.parametrize("variant", ["dar", "mswa", "aha"])
def test_grouped_query_attention_with_the_query_major_dq_pass_matches_reference(variant, rows_dq_pass):
    """Grouped key/value heads (AHA's routed rows read their key/value head's every causal key)."""
    test_grouped_query_attention_matches_reference(variant, *GQA_CASES[0])


def test_the_dq_passes_agree_and_the_query_major_one_is_repeatable():
    """Both passes of banded_backward give the same five gradients (float32: to rounding); the query-major pass
    writes each dq element once, so two runs are bitwise equal (the atomic pass adds in arrival order on a GPU);
    a pass outside DQ_PASSES is a clear error."""
    from kernels import backward, banded
    from kernels.runtime import head_windows

    torch.manual_seed(11)
    q, kl, vl, kf, vf = (torch.randn(2, 2, 45, 32, device=DEVICE) for _ in range(5))
    win = head_windows("t", 9, 2, 45, DEVICE)
    o, lse = banded.banded_forward(q, kl, vl, kf, vf, win, True, True)
    do = torch.randn_like(o)
    atomic = backward.banded_backward(q, kl, vl, kf, vf, o, lse, do, win, True, dq_pass="atomic")
    rows = backward.banded_backward(q, kl, vl, kf, vf, o, lse, do, win, True, dq_pass="rows")
    again = backward.banded_backward(q, kl, vl, kf, vf, o, lse, do, win, True, dq_pass="rows")
    for a, r, r2 in zip(atomic, rows, again):
        assert r.dtype == q.dtype and rel_err(r, a.double()) < 1e-6
        assert torch.equal(r, r2)
    # AHA's routed rows (a third of them): the same agreement, the rows pass repeatable
    routed = route_rows(torch.rand(2, 2, 45, device=DEVICE) < 0.3)
    o, lse = banded.banded_forward(q, kl, vl, kl, vl, win, True, False)
    banded.routed_forward(q, kl, vl, o, lse, win, *routed)
    atomic, rows, again = (backward.banded_backward(q, kl, vl, kl, vl, o, lse, do, win, False, routed, dq_pass=p)
                           for p in ("atomic", "rows", "rows"))
    for a, r, r2 in zip(atomic[:3], rows[:3], again[:3]):
        assert rel_err(r, a.double()) < 1e-6 and torch.equal(r, r2)
    with pytest.raises(ValueError, match="dq_pass must be one of"):
        backward.banded_backward(q, kl, vl, kf, vf, o, lse, do, win, True, dq_pass="fast")


def kernel_ops():
    """Each kernel's forward and backward custom op with arguments (small, random; the gate routes ~40%), and the
    decode step's range attention (inference only)."""
    from kernels.aha import aha_backward, aha_forward
    from kernels.dar import dar_backward, dar_forward
    from kernels.decode import range_attention_op
    from kernels.mswa import mswa_backward, mswa_forward

    torch.manual_seed(6)
    x = lambda: torch.randn(1, 2, 20, 16, device=DEVICE)  # noqa: E731
    q, k, v, kg, vg, do = (x() for _ in range(6))
    gate = torch.rand(1, 2, 20, device=DEVICE) < 0.4
    mswa_o, mswa_lse = mswa_forward(q, k, v, [4, 9], True)
    dar_o, dar_lse = dar_forward(q, k, v, kg, vg, 5)
    aha_out = aha_forward(q, k, v, gate, 5)
    hi = torch.tensor([[[7, 19], [0, 12]]], dtype=torch.int32, device=DEVICE)
    ranges = (hi - torch.tensor([[[3, 19], [0, 4]]], dtype=torch.int32, device=DEVICE), hi)
    return {"mswa_forward": (mswa_forward, (q, k, v, [4, 9], True)),
            "mswa_backward": (mswa_backward, (q, k, v, mswa_o, mswa_lse, do, [4, 9], True)),
            "dar_forward": (dar_forward, (q, k, v, kg, vg, 5)),
            "dar_backward": (dar_backward, (q, k, v, kg, vg, dar_o, dar_lse, do, 5)),
            "aha_forward": (aha_forward, (q, k, v, gate, 5)),
            "aha_backward": (aha_backward, (q, k, v, aha_out[0], aha_out[1], aha_out[2], aha_out[3], do, 5)),
            "range_attention": (range_attention_op, (q[:, :, :2], k, v, *ranges))}


def test_kernels_are_custom_ops_whose_fakes_pass_opcheck():
    """torch.library.opcheck: schema, the fake implementation's shapes, strides and dtypes against the real
    outputs, and AOT dispatch with dynamic shapes (what torch.compile relies on). The ops carry no autograd: each
    kernel's autograd function calls its forward and backward op under torch.compile
    (test_tiny_model_triton_matches_reference_and_compiles_in_one_graph)."""
    for name, (op, args) in kernel_ops().items():
        inputs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        result = torch.library.opcheck(op, inputs)
        assert set(result.values()) == {"SUCCESS"}, (name, result)


# ------------------------------------------------------------------------------------------------ launches
class Launches:
    """Counts what a call launches: Triton kernels by name (every ``run`` of a kernel, the autotuner's direct
    launches included) and PyTorch operators that run a kernel (views and allocations left out), by name."""

    def __init__(self, monkeypatch):
        from torch.utils._python_dispatch import TorchDispatchMode

        from kernels import backward, banded, cross_entropy

        self.triton: list[str] = []
        self.torch: list[str] = []
        self.in_triton = False  # the interpreter moves a kernel's tensors with PyTorch operators: not launches
        outer = self
        for cls in {type(backward._delta_kernel), type(banded._fwd_kernel.fn), type(cross_entropy._cross_entropy_kernel)}:
            def run(kernel, *args, _run=cls.run, **kwargs):
                outer.triton.append(kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__)
                outer.in_triton = True
                try:
                    return _run(kernel, *args, **kwargs)
                finally:
                    outer.in_triton = False
            monkeypatch.setattr(cls, "run", run)

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not (outer.in_triton or func.is_view or func.__name__.startswith(("empty", "new_empty"))):
                    outer.torch.append(func.overloadpacket.__name__)
                return func(*args, **(kwargs or {}))

        self.mode = Ops

    def __call__(self, fn):
        """``fn()``'s launches: (Triton kernel names, PyTorch operator names)."""
        self.triton.clear()
        self.torch.clear()
        with self.mode():
            out = fn()
        return out, list(self.triton), list(self.torch)


def test_each_kernel_pass_launches_what_it_must_and_nothing_more(monkeypatch):
    """Launches per call once tuned (the interpreter offers one tile, so a call's head groups share one launch; the
    merge on the GPU: test_tuned_launch_tunes_each_group_once_then_launches_directly_merged_by_tile). Forward:
    one banded kernel (AHA: and the routed rows' kernel, after compacting the rows: five small PyTorch operators).
    Backward (the atomic dq pass, the interpreter's default): the row deltas (which also zero the float32 dq
    accumulator) and the key-major kernel (then, for half inputs, dq's cast); with the query-major dq pass, the row
    deltas, the key-major kernel and the dq kernel (AHA: and the routed rows' dq kernel). Autograd makes no zero
    gradient for the LSE (or AHA's rows)."""
    from kernels import backward, banded
    from kernels.aha import route_rows

    monkeypatch.setattr(backward, "DQ_PASS", "atomic")  # on CUDA the pass is otherwise chosen by timing
    count = Launches(monkeypatch)
    torch.manual_seed(7)
    q, k, v, kg, vg = (torch.randn(1, 24, 2, 16, device=DEVICE).transpose(1, 2).requires_grad_() for _ in range(5))
    gate = torch.rand(1, 2, 24, device=DEVICE) < 0.4
    do = torch.randn(1, 24, 2, 16, device=DEVICE).transpose(1, 2)  # the model's strided output gradient
    calls = {"mswa": lambda: mswa_attention(q, k, v, [4, 9]), "dar": lambda: dar_attention(q, k, v, kg, vg, 5),
             "aha": lambda: aha_attention(q, k, v, gate, 5)}
    for name, call in calls.items():
        call().backward(do)  # tunes
        out, triton_fwd, torch_fwd = count(call)
        _, triton_bwd, torch_bwd = count(lambda: out.backward(do))
        assert triton_fwd == (["_fwd_kernel", "_routed_fwd_kernel"] if name == "aha" else ["_fwd_kernel"]), name
        # the kernels and nothing around them (AHA: the rows' compaction, route_rows); in eager mode no custom op
        assert torch_fwd == (["bitwise_not", "_to_copy", "sort", "_to_copy", "sum"] if name == "aha" else []), name
        assert triton_bwd == ["_delta_kernel", "_bwd_kernel"], name
        assert torch_bwd == ["add_"] * (5 if name == "dar" else 3), name  # the gradients' accumulation
    # inside the ops: what PyTorch itself launches
    from kernels.runtime import head_windows

    win = head_windows("t", 5, 2, 24, DEVICE)
    (o, lse), triton_fwd, torch_fwd = count(lambda: banded.banded_forward(q, k, v, k, v, win, True, False))
    assert torch_fwd == [] and triton_fwd == ["_fwd_kernel"]
    backward.banded_backward(q, k, v, k, v, o, lse, do, win, False)  # tunes (AHA's backward tuned the routed one)
    _, triton_bwd, torch_bwd = count(lambda: backward.banded_backward(q, k, v, k, v, o, lse, do, win, False))
    assert triton_bwd == ["_delta_kernel", "_bwd_kernel"] and torch_bwd == []  # half inputs: + dq's cast
    # the query-major dq pass: the dq kernel instead of a cast (dq is written once, in the input dtype)
    backward.banded_backward(q, k, v, k, v, o, lse, do, win, False, dq_pass="rows")  # tunes
    _, triton_bwd, torch_bwd = count(lambda: backward.banded_backward(q, k, v, k, v, o, lse, do, win, False,
                                                                    dq_pass="rows"))
    assert triton_bwd == ["_delta_kernel", "_bwd_kernel", "_dq_kernel"] and torch_bwd == []
    # AHA's query-major pass: and the routed rows' dq kernel
    rows, counts = route_rows(gate)
    backward.banded_backward(q, k, v, k, v, o, lse, do, win, False, (rows, counts), dq_pass="rows")  # tunes
    _, triton_bwd, torch_bwd = count(lambda: backward.banded_backward(q, k, v, k, v, o, lse, do, win, False,
                                                                    (rows, counts), dq_pass="rows"))
    assert triton_bwd == ["_delta_kernel", "_bwd_kernel", "_dq_kernel", "_routed_dq_kernel"] and torch_bwd == []
    _, _, torch_rows = count(lambda: route_rows(gate))
    assert torch_rows == ["bitwise_not", "_to_copy", "sort", "_to_copy", "sum"]


def test_the_fused_loss_launches_a_fixed_few_kernels_per_chunk(monkeypatch):
    from neox_dar.loss import linear_cross_entropy_sum

    count = Launches(monkeypatch)
    torch.manual_seed(8)
    hidden = torch.randn(48, 16, device=DEVICE, requires_grad=True)
    weight = torch.randn(loss_vocab(), 16, device=DEVICE, requires_grad=True)
    targets = torch.randint(0, weight.shape[0], (48,), device=DEVICE)
    per_chunks = {}
    for rows in (48, 16):
        hidden.grad = weight.grad = None
        loss, triton_fwd, _ = count(lambda: linear_cross_entropy_sum(hidden, weight, targets, rows=rows, fused=True))
        _, _, torch_bwd = count(loss.backward)
        chunks = 48 // rows
        assert triton_fwd == ["_cross_entropy_kernel"] * chunks
        per_chunks[chunks] = torch_bwd
    assert per_chunks[1] == per_chunks[3]  # the backward only scales the gradients made in the forward


# ------------------------------------------------------------------------------------------------ the loss
# kernels/cross_entropy.py and neox_dar.loss's fused path (the one CUDA training takes): vocabularies of two whole
# blocks of the row loop plus a ragged tail, ignored targets, several chunks.
LOSS_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def loss_vocab() -> int:
    from kernels.cross_entropy import BLOCK_V

    return 2 * BLOCK_V + 37


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cross_entropy_rows_gives_the_nll_and_writes_the_logits_gradient_in_place(dtype):
    from kernels.cross_entropy import cross_entropy_rows

    torch.manual_seed(2)
    n, V = 11, loss_vocab()
    logits = (torch.randn(n, V, device=DEVICE) * 4).to(dtype)
    targets = torch.randint(0, V, (n,), device=DEVICE)
    targets[[1, 6]] = -100
    targets[3] = V - 1  # the last logit, in the ragged tail
    ref = logits.float().requires_grad_()
    ref_nll = F.cross_entropy(ref, targets, ignore_index=-100, reduction="none")
    ref_nll.sum().backward()
    out = logits.clone()
    nll = cross_entropy_rows(out, targets, grad=True)
    assert nll.dtype == torch.float32 and nll[[1, 6]].eq(0).all()
    torch.testing.assert_close(nll, ref_nll, rtol=1e-5, atol=1e-5)
    # the gradient as autograd casts it back: float32 softmax - onehot, rounded once to the logits' dtype (the same
    # rounding on the CPU; on a GPU the kernel's exp2 and torch's exp differ in the last float32 bits, which moves a
    # few elements by one unit in the last place of a half dtype: 5 of 90,519 on the H200, 2026-11-28)
    fin = torch.finfo(dtype)
    ulp = dict(rtol=fin.eps, atol=fin.smallest_normal * fin.eps) if ON_GPU else dict(rtol=0, atol=0)
    torch.testing.assert_close(out, ref.grad.to(dtype), **(dict(rtol=0, atol=1e-6) if dtype == torch.float32 else ulp))
    # a target outside the vocabulary: NaN (it read a logit out of bounds and gave a plausible number)
    wrong = targets.clone()
    wrong[[0, 2]] = torch.tensor([V, -5], device=DEVICE)
    bad = cross_entropy_rows(logits.clone(), wrong)
    keep = [i for i in range(n) if i not in (0, 2)]
    assert bad[[0, 2]].isnan().all()
    torch.testing.assert_close(bad[keep], nll[keep], rtol=0, atol=0)
    assert out[[1, 6]].eq(0).all()
    untouched = logits.clone()
    torch.testing.assert_close(cross_entropy_rows(untouched, targets), ref_nll, rtol=1e-5, atol=1e-5)
    assert torch.equal(untouched, logits)  # without grad the logits are left as they were


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("rows", [16, None], ids=["rows16", "default_rows"])
def test_fused_linear_cross_entropy_matches_the_full_logits_loss(dtype, rows):
    """neox_dar.loss with ``fused=True``: the summed loss and both gradients of F.cross_entropy over the full
    logits (the weight's gradient accumulated in float32, so in half precision closer to float64 than autograd's
    half product), and linear_token_nll's per-position values."""
    from neox_dar.loss import linear_cross_entropy_sum, linear_token_nll

    torch.manual_seed(3)
    N, d, V = 53, 32, loss_vocab()
    hidden = torch.randn(N, d, device=DEVICE).to(dtype).requires_grad_()
    weight = (torch.randn(V, d, device=DEVICE) * 0.3).to(dtype).requires_grad_()
    targets = torch.randint(0, V, (N,), device=DEVICE)
    targets[::7] = -100
    exact = [t.detach().double().requires_grad_() for t in (hidden, weight)]
    ref = F.cross_entropy(F.linear(*exact), targets, ignore_index=-100, reduction="sum")
    ref.backward()
    out = linear_cross_entropy_sum(hidden, weight, targets, rows=rows, fused=True)
    out.backward()
    assert out.dtype == torch.float32 and hidden.grad.dtype == dtype and weight.grad.dtype == dtype
    tol = LOSS_TOL[dtype]
    assert rel_err(out, ref) < tol
    assert rel_err(hidden.grad, exact[0].grad) < tol and rel_err(weight.grad, exact[1].grad) < tol
    per = linear_token_nll(hidden.detach(), weight.detach(), targets, rows=rows, fused=True)
    ref_per = F.cross_entropy(F.linear(*[t.detach() for t in exact]), targets, ignore_index=-100, reduction="none")
    assert per.dtype == torch.float32 and rel_err(per, ref_per) < tol and per[::7].eq(0).all()


def test_fused_loss_is_a_custom_op_that_compiles_in_one_graph():
    from neox_dar.loss import _fused_sum_and_grads, linear_cross_entropy_sum

    torch.manual_seed(4)
    N, d, V = 40, 16, loss_vocab()
    hidden = torch.randn(N, d, device=DEVICE, requires_grad=True)
    weight = torch.randn(V, d, device=DEVICE, requires_grad=True)
    targets = torch.randint(0, V, (N,), device=DEVICE)
    targets[::5] = -100
    for need in [(True, True), (True, False), (False, False)]:
        result = torch.library.opcheck(_fused_sum_and_grads, (hidden.detach(), weight.detach(), targets, 16, *need),
                                       test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
        assert set(result.values()) == {"SUCCESS"}, (need, result)
    eager = linear_cross_entropy_sum(hidden, weight, targets, rows=16, fused=True)
    eager.backward()
    expected = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    torch._dynamo.reset()
    loss = torch.compile(lambda h, w: linear_cross_entropy_sum(h, w, targets, rows=16, fused=True),
                         backend="aot_eager", fullgraph=True)(hidden, weight)
    loss.backward()
    torch.testing.assert_close(loss, eager)
    torch.testing.assert_close((hidden.grad, weight.grad), expected)


# ------------------------------------------------------------------------------------------------ errors
def small(dtype=torch.float32, shape=(1, 2, 8, 16)):
    return torch.randn(shape, device=DEVICE, dtype=dtype)


def test_bad_inputs_raise_clear_errors():
    q = small()
    with pytest.raises(ValueError, match=r"must be \(B, H, T, d_h\)"):
        mswa_attention(q[0], q[0], q[0], torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="k shape"):
        mswa_attention(q, small(shape=(1, 2, 9, 16)), q, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"key/value heads \(3\) must divide query heads \(2\)"):
        mswa_attention(q, *(small(shape=(1, 3, 8, 16)),) * 2, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="the same H_kv for every key/value tensor"):
        dar_attention(q, q, q, small(shape=(1, 1, 8, 16)), small(shape=(1, 1, 8, 16)), 4)
    with pytest.raises(TypeError, match="dtype"):
        dar_attention(q, q, q, q, q.double(), 4)
    with pytest.raises(TypeError, match="unsupported"):
        mswa_attention(q.double(), q.double(), q.double(), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="window must be an integer >= 0"):
        dar_attention(q, q, q, q, q, -1)
    with pytest.raises(ValueError, match=r"windows must have shape \(2,\)"):
        mswa_attention(q, q, q, torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="integer tensor"):
        mswa_attention(q, q, q, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="every window must be >= 0"):
        mswa_attention(q, q, q, torch.tensor([1, -2]))
    with pytest.raises(ValueError, match=r"one window per query head \(2\), got 3"):
        mswa_attention(q, q, q, [1, 2, 3])
    with pytest.raises(ValueError, match="window must be an integer >= 0, got -2"):
        mswa_attention(q, q, q, [1, -2])
    with pytest.raises(ValueError, match="gate must be a bool tensor"):
        aha_attention(q, q, q, torch.ones(1, 2, 8), 4)
    from kernels import range_attention

    r = torch.zeros(1, 2, 8, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"lo must be int32 \(1, 2, 8\)"):
        range_attention(q, q, q, r.long(), r)
    with pytest.raises(ValueError, match=r"k, v \(B, H_kv, S, d_h\) expected"):
        range_attention(q, q, small(shape=(1, 2, 9, 16)), r, r)
    with pytest.raises(TypeError, match="share one dtype"):
        range_attention(q, q, q.double(), r, r)
    with pytest.raises(TypeError, match="unsupported"):
        range_attention(q.double(), q.double(), q.double(), r, r)
    with pytest.raises(ValueError, match="window must be an integer >= 0, got None"):
        dar_attention(q, q, q, q, q, None)
    empty = small(shape=(1, 2, 8, 0))  # d_h = 0: a ZeroDivisionError in the scale before
    with pytest.raises(ValueError, match=r"need 1 <= T and 1 <= d_h <= 256"):
        mswa_attention(empty, empty, empty, 3)
    with pytest.raises(ValueError, match=r"k and v must be on q's device"):  # were read from any device
        range_attention(q, q.to("meta"), q.to("meta"), r, r)
    with pytest.raises(RuntimeError, match="range_attention is for decoding and has no backward"):
        range_attention(q.requires_grad_(), q, q, r, r)  # it returned a tensor without a gradient
    q.requires_grad_(False)
    if not ON_GPU:
        with pytest.raises(TypeError, match="interpreter computes bfloat16"):
            mswa_attention(*(small(torch.bfloat16),) * 3, torch.tensor([1, 2]))
        with pytest.raises(TypeError, match="interpreter computes bfloat16"):
            range_attention(*(small(torch.bfloat16),) * 3, r, r)


def test_the_package_names_the_kernels_limits_as_the_kernels_do():
    """neox_dar reads the kernels' widest head and their dq-pass switch without importing Triton: its copies must
    be the kernels' own values, or a config check would pass a run the kernels refuse (or refuse a valid one)."""
    from neox_dar.attention import triton_bridge
    from neox_dar.variants.spec import KERNEL_MAX_HEAD_DIM

    assert KERNEL_MAX_HEAD_DIM == kernels.runtime.MAX_HEAD_DIM
    assert (triton_bridge.DQ_PASS_ENV, triton_bridge.DQ_PASSES) == (kernels.backward.DQ_PASS_ENV,
                                                                    kernels.backward.DQ_PASSES)


@pytest.mark.parametrize("kernel", ["mswa", "dar", "aha"])
def test_a_double_backward_through_a_kernel_raises(kernel):
    """The kernels' backward builds no graph: asked for a gradient of a gradient (create_graph=True) it raises, as
    SDPA's flash backward does (the returned dq had no grad_fn, so a gradient penalty lost its term silently)."""
    q, k, v = (small().requires_grad_() for _ in range(3))
    calls = {"mswa": lambda: mswa_attention(q, k, v, 4), "dar": lambda: dar_attention(q, k, v, k, v, 4),
             "aha": lambda: aha_attention(q, k, v, torch.zeros(1, 2, 8, dtype=torch.bool, device=DEVICE), 4)}
    with pytest.raises(RuntimeError, match="the Triton attention kernels have no double backward"):
        torch.autograd.grad((calls[kernel]() ** 2).sum(), q, create_graph=True)
    (gq,) = torch.autograd.grad((calls[kernel]() ** 2).sum(), q)  # a plain backward is unchanged
    assert gq.shape == q.shape and not gq.requires_grad


def test_dar_decode_attention_refuses_what_it_would_read_wrong():
    """Each argument of the DAR decode kernels checked before a launch: a ``c`` without unit stride on d_c, ``lo``
    or ``hi`` not int32 (B, T), a ``b_v`` not (H_kv, 1, d_h), a ``qr`` or ``qb`` of other heads or batch, a dtype
    the kernels do not compute in (bfloat16 under the interpreter). (Before: the first three read out of bounds or
    gave wrong values, the others a reshape error.)"""
    from kernels import dar_decode_attention

    B, T, H, Hk, S, DC, D, W = 1, 2, 4, 2, 8, 16, 8, 4

    def args(**change):
        a = dict(qc=torch.zeros(B, T, H, DC, device=DEVICE), qr=torch.zeros(B, T, H, W, device=DEVICE),
                 qb=torch.zeros(B, T, H, device=DEVICE), c=torch.zeros(B, S, DC, device=DEVICE),
                 kr=torch.zeros(B, Hk, S, W, device=DEVICE), lo=torch.zeros(B, T, dtype=torch.int32, device=DEVICE),
                 hi=torch.full((B, T), S, dtype=torch.int32, device=DEVICE), near=None, near_v=None,
                 a_v=torch.zeros(Hk, DC, D, device=DEVICE), b_v=torch.zeros(Hk, 1, D, device=DEVICE), scale=1.0)
        return {**a, **change}

    assert dar_decode_attention(**args()).shape == (B, H, T, D)
    cases = [
        (dict(c=torch.zeros(B, DC, S, device=DEVICE).transpose(1, 2)), r"c must be \(B, S, d_c\) with unit stride"),
        (dict(lo=torch.zeros(B, dtype=torch.int32, device=DEVICE)), r"lo must be int32 \(1, 2\)"),
        (dict(hi=torch.full((B, T), S, device=DEVICE)), r"hi must be int32 \(1, 2\)"),
        (dict(b_v=torch.zeros(1, 1, D, device=DEVICE)), r"b_v must be \(H_kv, 1, d_h\) = \(2, 1, 8\)"),
        (dict(qr=torch.zeros(B, T, 2, W, device=DEVICE)), r"qr must be \(B, T, H, width\)"),
        (dict(qb=torch.zeros(2, T, H, device=DEVICE)), "qb must be float32"),
        (dict(qb=torch.zeros(B, T, H, device=DEVICE).half()), "qb must be float32"),
        (dict(c=torch.zeros(B, S, DC, device=DEVICE).double()), "unsupported"),
    ]
    if not ON_GPU:
        bf16 = {k: v.bfloat16() for k, v in args().items() if k in ("qc", "qr", "c", "kr", "a_v", "b_v")}
        cases.append((bf16, "interpreter computes bfloat16"))
    for change, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            dar_decode_attention(**args(**change))


def test_row_deltas_kernel_matches_float64_rowsum_and_zeroes_the_dq_accumulator():
    from kernels.backward import row_deltas

    for shape in [(2, 3, 70, 64), (1, 2, 5, 24)]:  # T beyond one 64-row program; d_h not a power of two
        for dtype in DTYPES:
            o, do = torch.randn(shape, device=DEVICE, dtype=dtype), torch.randn(shape, device=DEVICE, dtype=dtype)
            dq = torch.randn(shape, device=DEVICE).transpose(1, 2).contiguous().transpose(1, 2)  # (B, T, H, d) storage
            ref = (o.double() * do.double()).sum(-1).reshape(shape[0] * shape[1], shape[2])
            got = row_deltas(o, do.transpose(1, 2).contiguous().transpose(1, 2), dq)  # a strided do, as the model's
            assert got.dtype == torch.float32 and got.shape == ref.shape
            assert torch.allclose(got.double(), ref, rtol=1e-5, atol=1e-5), (shape, dtype)
            assert dq.abs().max() == 0
            assert torch.equal(row_deltas(o, do, None), got)  # the query-major dq pass has no accumulator to zero


def test_head_windows_are_read_on_the_host_cached_on_the_device_and_grouped_by_tune_bucket():
    from kernels.runtime import head_windows

    w = head_windows("f", torch.tensor([8, 512, 7, 64, 500]), 5, 2048, DEVICE)
    assert w.values.dtype == torch.int32 and w.values.device.type == DEVICE.type
    assert w.values.tolist() == [8, 512, 7, 64, 500]
    # one launch per tune bucket, largest first, each with its own heads: window 8 is not run with 512's tiles
    assert [(g.kv_heads.tolist(), g.tune_bucket) for g in w.groups] == [([1, 4], 512), ([3], 64), ([0, 2], 8)]
    # built once per (windows, T bucket, device): a later layer with the same windows neither copies nor
    # synchronizes, and a longer batch in the same power-of-two bucket reuses it (and its tuned launches)
    again = head_windows("f", torch.tensor([8, 512, 7, 64, 500]), 5, 1500, DEVICE)
    assert again is w
    assert [g.tune_bucket for g in head_windows("f", 100, 4, 2048, DEVICE).groups] == [128]
    assert [g.tune_bucket for g in head_windows("f", 5000, 4, 2048, DEVICE).groups] == [2048]  # >= T acts as T
    assert head_windows("f", 2**40, 4, 3000, DEVICE).values.tolist() == [2**30] * 4
    assert [g.tune_bucket for g in head_windows("f", torch.zeros(4, dtype=torch.long), 4, 64, DEVICE).groups] == [0]
    # grouped-query attention: windows stay per query head; a key/value head launches with its query heads, in
    # the bucket of the largest of their windows
    gqa = head_windows("f", torch.tensor([8, 512, 7, 7]), 4, 2048, DEVICE, kv_group=2)
    assert gqa.values.tolist() == [8, 512, 7, 7]
    assert [(g.kv_heads.tolist(), g.tune_bucket) for g in gqa.groups] == [([0], 512), ([1], 8)]


def test_autotuning_is_keyed_on_buckets_and_launch_size_not_the_exact_length():
    """A new T re-tunes only past a power of two (evaluation's padded widths, generation's T + 1); the group size
    is in the key, so one launch of every head does not reuse the tile tuned for one window group."""
    import triton

    from kernels import backward, banded, runtime
    from kernels.runtime import prune_for_window, seq_bucket

    for kernel in (banded._fwd_kernel, backward._bwd_kernel, banded._routed_fwd_kernel):
        assert "T" not in kernel.keys and "T_TUNE" in kernel.keys
    for kernel in (banded._fwd_kernel, backward._bwd_kernel):
        assert {"W_TUNE", "G", "R"} <= set(kernel.keys)
    assert [seq_bucket(t) for t in (1, 70, 2047, 2048, 2049, 8192)] == [1, 128, 2048, 2048, 4096, 8192]
    # small tiles are offered only to small sliding windows, whether the autotuner passes arguments by position
    # or (as the launchers do) by name
    cfg = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}) for m, n in [(128, 64), (16, 64), (64, 32), (16, 16), (32, 32)]]
    shapes = lambda cs: [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in cs]  # noqa: E731
    assert shapes(prune_for_window(cfg, {"W_TUNE": 8}, HAS_FAR=False)) == shapes(cfg)
    assert shapes(prune_for_window(cfg, {}, W_TUNE=8, HAS_FAR=False, ROUTED=False)) == shapes(cfg)
    standard = [(128, 64), (16, 64), (64, 32)]
    assert shapes(prune_for_window(cfg, {"W_TUNE": 128}, HAS_FAR=False)) == standard
    assert shapes(prune_for_window(cfg, {}, W_TUNE=8, HAS_FAR=True)) == standard
    assert shapes(prune_for_window(cfg, {}, W_TUNE=8, HAS_FAR=False, ROUTED=True)) == standard
    # the wide key tiles only to a backward without atomic dq (its "rows" pass)
    wide = runtime._GPU_KEY_MAJOR_WIDE_CONFIGS
    assert shapes(prune_for_window(cfg + wide, {}, W_TUNE=128, HAS_FAR=True, ATOMIC_DQ=False)) == standard + shapes(wide)
    assert shapes(prune_for_window(cfg + wide, {}, W_TUNE=128, HAS_FAR=True, ATOMIC_DQ=True)) == standard


class FakeAutotuner:
    """Stands in for a Triton ``Autotuner``: records launches; "tunes" each group to ``tile_for(G)``."""

    def __init__(self, tile_for):
        import triton

        self.tile_for, self.launches = tile_for, []
        self.config = lambda m, n: triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=4, num_stages=2)
        outer = self

        class Fn:
            def __getitem__(self, grid):
                return lambda **kw: outer.launches.append(("direct", grid, kw))

        self.fn = Fn()

    def __getitem__(self, grid):
        def run(**kw):
            self.best_config = self.config(*self.tile_for(kw["G"]))
            self.launches.append(("tune", grid({**kw, **self.best_config.kwargs}), kw))
        return run


def test_tuned_launch_tunes_each_group_once_then_launches_directly_merged_by_tile():
    from kernels.runtime import tuned_launch

    heads = [torch.tensor([0, 3]), torch.tensor([1]), torch.tensor([2])]
    groups = [{"KV_HEADS": h, "G": h.numel(), "W_TUNE": b} for h, b in zip(heads, (512, 64, 8))]
    fake = FakeAutotuner(lambda G: (64, 64) if G == 1 else (128, 64))  # groups 2 and 3 tune to the same tile
    grid = lambda meta, g: (meta["BLOCK_M"], g["G"])  # noqa: E731
    plans = {}
    for _ in range(2):
        tuned_launch(fake, plans, ("fwd",), groups, grid, {"X": "x", "DQ": "real"}, scratch=lambda: {"DQ": "scratch"})
    kinds = [k for k, _, _ in fake.launches]
    assert kinds == ["tune"] * 3 + ["direct"] * 2 + ["direct"] * 2  # tuning happens on the first call only
    assert all(kw["DQ"] == "scratch" for k, _, kw in fake.launches if k == "tune")  # tuning never adds to outputs
    direct = [(grid, kw) for k, grid, kw in fake.launches if k == "direct"][:2]
    assert [(g, kw["KV_HEADS"].tolist(), kw["G"], kw["DQ"], kw["BLOCK_M"], kw["num_warps"]) for g, kw in direct] == [
        ((128, 2), [0, 3], 2, "real", 128, 4), ((64, 2), [1, 2], 2, "real", 64, 4)]


def test_fp32_products_follow_torch_matmul_precision_and_warn_on_cuda():
    """float32 inputs on CUDA must not silently take the exact (no tensor core) path."""
    from kernels.runtime import _warn_exact_fp32, dot_precision

    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # only the device type is read: no GPU needed
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert dot_precision(torch.bfloat16, cuda) == "tf32" and dot_precision(torch.float32, cpu) == "ieee"
        _warn_exact_fp32.cache_clear()
        with pytest.warns(UserWarning, match=r"set_float32_matmul_precision\('high'\) selects TF32"):
            assert dot_precision(torch.float32, cuda) == "ieee"
        torch.set_float32_matmul_precision("high")
        assert dot_precision(torch.float32, cuda) == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.skipif(ON_GPU, reason="checks the CPU error without the interpreter")
def test_cpu_tensor_without_interpreter_is_a_clear_error():
    code = ("import torch, kernels\n"
            "x = torch.randn(1, 1, 4, 16)\n"
            "try:\n    kernels.mswa_attention(x, x, x, torch.tensor([2]))\n"
            "except RuntimeError as e:\n    print('ERR', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parent.parent)
    assert "ERR" in res.stdout and "TRITON_INTERPRET=1" in res.stdout, res.stdout + res.stderr


# ------------------------------------------------------------------------------------------------ long sequences
# On the GPU: bf16 at T = 8192 (pipelines in steady state, the tuned tiles the H100 picks: the autotuner runs over
# every candidate at d_h = 64, the small-window tiles included) against SDPA on the same inputs: the causal
# identities that must hold (DAR with k_glob = k_loc, DAR with w = 0, MSWA with every window >= T, AHA with every
# row routed, GQA) and each variant as it trains (DAR's two key sets, MSWA windows w/16 .. 4w, AHA with 10% of rows
# routed) as SDPA with an explicit boolean mask (DAR over its two key sets concatenated). Criterion per tensor
# (output and every gradient): the kernel's relative error against an exact float32 reference (SDPA in float32 on
# EXACT_BACKEND, same rounded inputs) is at most twice SDPA's own error in the input dtype (flash when causal; with a
# mask the GPU's flash takes none, so memory-efficient) plus 1e-3; an input the reference does not read gets no
# gradient. KERNEL_TESTS_LONG_T=<T> sets T (w = min(128, T / 4)); under the interpreter (where only that runs them:
# `scripts/gpu_check.sh --rehearse` sets 32) the inputs are float16 (the interpreter refuses bf16), the exact
# reference is SDPA's math backend and the yardstick its CPU flash kernel, which takes masks.
LONG_T = int(os.environ.get("KERNEL_TESTS_LONG_T", "8192"))
LONG = dict(B=2 if ON_GPU else 1, H=4, T=LONG_T, D=64, w=min(128, LONG_T // 4))
LONG_DTYPE = torch.bfloat16 if ON_GPU else torch.float16
EXACT_BACKEND = "EFFICIENT_ATTENTION" if ON_GPU else "MATH"
MSWA_LONG_WINDOWS = [max(1, LONG["w"] // 16), LONG["w"] // 4, LONG["w"], 4 * LONG["w"]]  # one per head: 8 .. 512


def tuned(test):
    """Mark a test to run with the full autotuner on the GPU (no pinned tile)."""
    test.tuned = True
    return test


def sdpa(q, k, v, mask, backend):
    """SDPA on one backend: causal when ``mask`` is None, else the boolean ``mask`` (True: attend; broadcast to
    (B, H, T, S)); key/value heads repeated for grouped queries (their gradients sum back)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]
    with sdpa_kernel([getattr(SDPBackend, backend)]):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), attn_mask=mask, is_causal=mask is None)


def band(lo: float, hi: float) -> torch.Tensor:
    """(T, T) bool at the long length: ``lo <= i - j < hi``."""
    delta = distances(LONG["T"])
    return (delta >= lo) & (delta < hi)


def one_key_set(k, v, k2, v2):
    return k, v


def both_key_sets(k, v, k2, v2):
    """DAR's two key sets as one of 2T keys (local, then far), for SDPA with a (T, 2T) mask."""
    return torch.cat([k, k2], 2), torch.cat([v, v2], 2)


def causal(gate):
    return None  # SDPA's is_causal


W = LONG["w"]
LONG_CHECKS = {
    # name: (key/value heads, the kernel on (q, k, v, k2, v2, gate), SDPA's keys and values from (k, v, k2, v2),
    #        SDPA's mask from the gate)
    "dar_equal_key_sets": (LONG["H"], lambda q, k, v, k2, v2, g: dar_attention(q, k, v, k, v, W), one_key_set,
                           causal),
    "dar_window_0": (LONG["H"], lambda q, k, v, k2, v2, g: dar_attention(q, k2, v2, k, v, 0), one_key_set, causal),
    "dar_equal_key_sets_gqa": (LONG["H"] // 2, lambda q, k, v, k2, v2, g: dar_attention(q, k, v, k, v, W),
                               one_key_set, causal),
    "dar_two_key_sets": (LONG["H"], lambda q, k, v, k2, v2, g: dar_attention(q, k, v, k2, v2, W), both_key_sets,
                         lambda g: torch.cat([band(0, W), band(W, math.inf)], 1)),
    "mswa_windows_beyond_T": (LONG["H"], lambda q, k, v, k2, v2, g: mswa_attention(
        q, k, v, torch.tensor([LONG["T"], LONG["T"] + 1, 2 * LONG["T"], 2**20])), one_key_set, causal),
    "mswa_windows_w16_to_4w": (LONG["H"], lambda q, k, v, k2, v2, g: mswa_attention(
        q, k, v, torch.tensor(MSWA_LONG_WINDOWS)), one_key_set,
        lambda g: torch.stack([band(0, x) for x in MSWA_LONG_WINDOWS])[None]),  # (1, H, T, T)
    "aha_every_row_routed": (LONG["H"], lambda q, k, v, k2, v2, g: aha_attention(q, k, v, torch.ones_like(g), W),
                             one_key_set, causal),
    "aha_10pct_routed": (LONG["H"], lambda q, k, v, k2, v2, g: aha_attention(q, k, v, g, W), one_key_set,
                         lambda g: band(0, math.inf) & (g[..., None] | band(0, W))),
}


@tuned
@pytest.mark.skipif(not ON_GPU and "KERNEL_TESTS_LONG_T" not in os.environ,
                    reason="bf16 at T=8192 with the tuned tiles: GPU only (KERNEL_TESTS_LONG_T=32: interpreter, fp16)")
@pytest.mark.parametrize("check", list(LONG_CHECKS))
def test_long_sequence_matches_sdpa(check):
    h_kv, kernel, key_sets, mask_of = LONG_CHECKS[check]
    B, H, T, D = LONG["B"], LONG["H"], LONG["T"], LONG["D"]
    torch.manual_seed(0)
    q = torch.randn(B, H, T, D, device=DEVICE, dtype=LONG_DTYPE).requires_grad_()
    kv = [torch.randn(B, h_kv, T, D, device=DEVICE, dtype=LONG_DTYPE).requires_grad_() for _ in range(4)]
    gate = torch.rand(B, H, T, device=DEVICE) < 0.1
    grad = torch.randn(B, H, T, D, device=DEVICE, dtype=LONG_DTYPE)
    mask = mask_of(gate)
    yardstick = "FLASH_ATTENTION" if mask is None or not ON_GPU else "EFFICIENT_ATTENTION"

    def run(fn, inputs):
        """Output and the inputs' gradients (None: not read), in float32."""
        out = fn(*inputs)
        out.backward(grad.to(out.dtype))
        return [out.detach().float()] + [None if x.grad is None else x.grad.float() for x in inputs]

    def reference(backend, float32=False):
        inputs = [x.detach().to(torch.float32 if float32 else x.dtype).requires_grad_() for x in (q, *kv)]
        return run(lambda q, *kv: sdpa(q, *key_sets(*kv), mask, backend), inputs)

    ours = run(lambda *x: kernel(*x, gate), [q, *kv])
    rounded, exact = reference(yardstick), reference(EXACT_BACKEND, float32=True)
    for name, a, r, e in zip(["out", "dq", "dk", "dv", "dk2", "dv2"], ours, rounded, exact):
        if e is None:  # an input the reference does not read
            assert a is None or a.abs().max() == 0, f"{check} {name}: a gradient for an input that is not read"
            continue
        err, sdpa_err = rel_err(a, e.double()), rel_err(r, e.double())
        assert err <= 2 * sdpa_err + 1e-3, f"{check} {name}: relative error {err:.2e}, SDPA {yardstick} {sdpa_err:.2e}"


# ------------------------------------------------------------------------------------------------ bench script
ROOT = Path(__file__).resolve().parent.parent


def run_bench(*args: str, interpret: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, str(ROOT / "bench" / "attention.py"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(ON_GPU, reason="checks the refusal on a machine without CUDA")
def test_bench_refuses_cpu_without_interpret_flag():
    res = run_bench("--kernels", "mswa")
    assert res.returncode == 2 and "no CUDA GPU" in res.stderr, res.stdout + res.stderr


@pytest.mark.skipif(ON_GPU, reason="the GPU runs flex compiled by inductor, in gpu_check's bench-attention step")
def test_bench_flex_baselines_run_forward_and_backward_within_their_compile_budget(monkeypatch):
    """bench/attention.py's flex baselines (DAR over its two key sets, MSWA's four layers, AHA) through the bench's
    own run (the output check, then the timed forward and forward+backward; flex in a last pass of its own, the
    report saved after each case so that a stopped run keeps the rest): right outputs, a backward that runs
    (a window buffer shared by MSWA's layers and rewritten before the backward once broke it), and dynamo's compiles
    within the budget the bench sets (past it the bench fails rather than time flex uncompiled). On the CPU:
    dynamo's eager backend (it compiles, and so counts, the same), a dense block-mask build, flex's refusal of a CPU
    backward lifted (its math backward runs)."""
    import importlib.util

    import torch.nn.attention.flex_attention as fa

    spec = importlib.util.spec_from_file_location("bench_attention", ROOT / "bench" / "attention.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    compile_, create = torch.compile, fa.create_block_mask
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_(fn, **{**kw, "backend": "eager"}))
    monkeypatch.setattr(fa, "create_block_mask", lambda *a, **kw: create(*a, **{**kw, "_compile": False}))
    monkeypatch.setattr(fa, "_validate_device", lambda *a: None)
    dynamo = torch._dynamo.config
    limits = {"recompile_limit": dynamo.recompile_limit,
              "fail_on_recompile_limit_hit": dynamo.fail_on_recompile_limit_hit}
    torch._dynamo.reset()
    args = bench.parse_args(["--interpret", "--warmup-ms", "0", "--rep-ms", "0"])
    args.methods = ["sdpa_causal", "reference", "flex"]  # --interpret leaves flex out (inductor: minutes on 2 cores)
    saved = []
    try:
        # run_benchmarks sets both limits; dynamo's patch() restores them (monkeypatch cannot: pytest >= 9.2 undoes a
        # module attribute missing from the module's __dict__ by deleting it, and a deleted dynamo config key is
        # hidden from every later torch.compile in the process)
        with dynamo.patch(**limits):
            report = bench.run_benchmarks(args, torch, None, save=lambda r: saved.append(json.loads(json.dumps(r))))
            assert dynamo.recompile_limit == bench.FLEX_COMPILES_PER_CASE * len(args.kernels)
        assert {key: getattr(dynamo, key) for key in limits} == limits
        # flex in a pass of its own, after every other method; the report saved after each (kernel, T)
        assert [(r["kernel"], r["method"]) for r in report["results"]] == [
            *((k, m) for k in args.kernels for m in ("sdpa_causal", "reference")), *((k, "flex") for k in args.kernels)]
        n = len(args.kernels)
        assert [len(r["results"]) for r in saved] == [*range(2, 2 * n + 1, 2), *range(2 * n + 1, 3 * n + 1)]
        assert not any(r["complete"] for r in saved)
        assert report["complete"] and all(r["fwd_bwd_ms"] > 0 and "error" not in r for r in report["results"])
        flex = [r["rel_err_vs_reference"] for r in report["results"] if r["method"] == "flex"]
        assert all(isinstance(e, float) and e < 1e-5 for e in flex), flex
    finally:
        torch._dynamo.reset()


# Register spills allowed in a kernel's first candidate: Triton 3.6 (the GPU machine's) spills a few words in the
# 64 x 64 backward at d_h = 64 (4 bytes for DAR, 44 for AHA; 3.9 none, bench/results' compile reports); more is a
# regression to look at.
SPILL_BYTES_ALLOWED = 64


def test_kernels_compile_for_hopper_without_a_gpu(tmp_path):
    """What the interpreter cannot check: every kernel compiles for sm_90a (Triton's bundled ptxas), the matrix
    products become Hopper wgmma, tile loads 16-byte cp.async, and each kernel's first candidate spills at most
    ``SPILL_BYTES_ALLOWED``; the decode kernels spill nothing (registers: 128 for the partial kernel under Triton
    3.9, 180 under 3.6, whose loop pipelining keeps more loads in flight; both leave 8 warps a program), and DAR's
    far-column kernel, 16 head rows a product, takes mma.sync; its finishing kernel spills nothing either."""
    out = tmp_path / "compile.json"
    res = run_bench("--compile-only", "--compile-configs", "1", "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(out.read_text())["results"]
    assert [r["kernel"] for r in rows] == (["_fwd_kernel"] * 2 + ["_bwd_kernel"] * 6 + ["_dq_kernel"] * 2
                                           + ["_routed_fwd_kernel", "_routed_dq_kernel", "_range_partial_kernel",
                                              "_range_merge_kernel", "_far_kernel", "_finish_kernel"])
    for r in rows[:-4]:
        assert r["wgmma"] > 0 and r["mma_sync"] == 0 and r["cp_async_16B"] > 0, r
        assert r["spill_store_bytes"] <= SPILL_BYTES_ALLOWED and r["registers"] <= 255, r
    for r in rows[-4:]:  # the decode steps' kernels (AHA's: one query row against blocks of keys)
        assert r["spill_store_bytes"] == 0 and r["registers"] <= 192, r
    assert rows[-2]["mma_sync"] > 0  # DAR's far columns: 16 head rows a product


# ------------------------------------------------------------------------------------------------ the model
# configs/tiny.yml (one of its layers: each runs the same kernels) with attention_impl triton vs reference, same
# weights, float32: the kernels as training calls them (through neox_dar/attention). Relative errors: logits 1e-5,
# every parameter gradient 1e-4.
TINY = ROOT / "configs" / "tiny.yml"


def run_model(model, ids):
    """Logits and the gradients of the LM loss plus the variant's aux loss (AHA's router term)."""
    model.zero_grad(set_to_none=True)
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    aux = model.aux_loss()
    (loss + (aux if aux is not None else 0.0)).backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.filterwarnings("ignore:MSWA")
@pytest.mark.parametrize("attention_type,window", [("dar", 5), ("mswa", 8), ("aha", 6)])
def test_tiny_model_triton_matches_reference_and_compiles_in_one_graph(attention_type, window):
    """The model on ``attention_impl: triton`` against ``reference`` (same weights): logits and every gradient; then
    the triton model under torch.compile(fullgraph=True) (no graph break at the kernels: their custom ops) against
    its own eager run, to float32 rounding. (SWA calls MSWA's op with equal windows.)"""
    torch.manual_seed(0)
    overrides = (f"attention_type={attention_type}", f"window_size={window}", "precision=fp32", "num_layers=1")
    ref_cfg = load_config(TINY, overrides=(*overrides, "attention_impl=reference")).model
    tri_cfg = load_config(TINY, overrides=(*overrides, "attention_impl=triton")).model
    ref_model = build_model(ref_cfg).to(DEVICE)
    tri_model = build_model(tri_cfg).to(DEVICE)
    tri_model.load_state_dict(ref_model.state_dict())
    ids = torch.randint(0, ref_cfg.vocab_size, (2, 35), device=DEVICE)
    ref_logits, ref_grads = run_model(ref_model, ids)
    tri_logits, tri_grads = run_model(tri_model, ids)
    assert rel_err(tri_logits, ref_logits) < 1e-5
    assert ref_grads.keys() == tri_grads.keys() and len(ref_grads) > 0
    if attention_type == "aha":
        router = [n for n in ref_grads if "router" in n]
        assert router and all(ref_grads[n].abs().sum() > 0 for n in router)
    bad = {n: rel_err(tri_grads[n], g) for n, g in ref_grads.items() if not rel_err(tri_grads[n], g) < 1e-4}
    assert not bad, f"{attention_type}: gradients differ: {bad}"
    torch._dynamo.reset()
    logits, grads = run_model(torch.compile(tri_model, backend="aot_eager", fullgraph=True), ids)
    grads = {n.removeprefix("_orig_mod."): g for n, g in grads.items()}  # the compiled wrapper's parameter names
    torch.testing.assert_close(logits, tri_logits, rtol=1e-5, atol=1e-6)
    assert grads.keys() == tri_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, tri_grads[name], rtol=1e-4, atol=1e-6, msg=name)


# ------------------------------------------------------------------------------------------------ decode
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("H,Hkv,T,S,D", [(4, 2, 1, 70, 16), (2, 2, 3, 97, 24), (3, 1, 2, 5, 64)])
def test_range_attention_reads_each_rows_key_range(H, Hkv, T, S, D, dtype):
    """Random inclusive ranges (single keys, whole caches, ranges across the kernel's chunks) against float64
    softmax attention over each row's slice; strided keys (a view of a longer cache, as the decode reads it)."""
    from kernels import range_attention

    torch.manual_seed(11)
    B = 2
    q = torch.randn(B, H, T, D, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(B, Hkv, S + 9, D, device=DEVICE, dtype=dtype)[:, :, :S] for _ in range(2))
    hi = torch.randint(0, S, (B, H, T), device=DEVICE)
    lo = (hi - torch.randint(0, S, (B, H, T), device=DEVICE)).clamp(min=0)
    lo[0, 0, 0], hi[0, 0, 0] = 0, S - 1
    lo[-1, -1, -1] = hi[-1, -1, -1]
    out = range_attention(q, k, v, lo.int(), hi.int())
    ref = torch.empty(B, H, T, D, dtype=torch.float64)
    for b, h, t in [(b, h, t) for b in range(B) for h in range(H) for t in range(T)]:
        keys = slice(int(lo[b, h, t]), int(hi[b, h, t]) + 1)
        kk, vv = k[b, h // (H // Hkv), keys].double().cpu(), v[b, h // (H // Hkv), keys].double().cpu()
        ref[b, h, t] = torch.softmax(kk @ q[b, h, t].double().cpu() / math.sqrt(D), 0) @ vv
    assert out.dtype == dtype and rel_err(out.cpu(), ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("H,Hkv,T,S,DC,W,NW", [(4, 2, 1, 70, 24, 4, 5), (3, 3, 2, 33, 16, 0, 0), (2, 1, 1, 9, 0, 16, 20)])
def test_dar_decode_attention_is_one_softmax_over_window_and_far_columns(H, Hkv, T, S, DC, W, NW, dtype):
    """DAR's decode kernels against float64: one softmax over each query row's window scores (NW columns, some
    masked) and far columns ``lo .. hi - 1`` (absorbed and rotated dims together, absorbed only (W = 0), rotated only
    (DC = 0: c still carries the values), grouped heads, ranges across the kernel's chunks, a row with no far column,
    a strided cache), the values through ``A_v``, ``b_v``; without a window (NW = 0, every row with far columns)."""
    from kernels import dar_decode_attention

    torch.manual_seed(12)
    B, scale, R, D = 2, 0.3, H // Hkv, 8
    dc = max(DC, 8)
    c = torch.randn(B, S + 5, dc, device=DEVICE, dtype=dtype)[:, :S]
    qc = torch.randn(B, T, H, DC, device=DEVICE, dtype=dtype) if DC else None
    qr = torch.randn(B, T, H, W, device=DEVICE, dtype=dtype) if W else None
    kr = torch.randn(B, Hkv, S, W, device=DEVICE, dtype=dtype) if W else None
    qb = torch.randn(B, T, H, device=DEVICE)
    a_v = torch.randn(Hkv, dc, D, device=DEVICE, dtype=dtype) / dc ** 0.5
    b_v = torch.randn(Hkv, 1, D, device=DEVICE, dtype=dtype)
    near = near_v = None
    if NW:
        near = torch.randn(B, Hkv, R * T, NW, device=DEVICE) * 3
        near[..., 1::3] = float("-inf")  # columns outside a query's window
        near_v = torch.randn(B, Hkv, NW, D, device=DEVICE, dtype=dtype)
    hi = torch.randint(1, S + 1, (B, T), device=DEVICE)
    lo = (hi - torch.randint(1, S + 1, (B, T), device=DEVICE)).clamp(min=0)
    lo[0, 0], hi[0, 0] = 0, S
    if NW:
        lo[-1, -1] = hi[-1, -1]  # no far column
    out = dar_decode_attention(qc, qr, qb, c, kr, lo.int(), hi.int(), near, near_v, a_v, b_v, scale)
    assert out.shape == (B, H, T, D) and out.dtype == dtype
    ref = torch.empty(B, H, T, D, dtype=torch.float64)
    f64 = lambda x: x.double().cpu()  # noqa: E731
    for b, t, h in [(b, t, h) for b in range(B) for t in range(T) for h in range(H)]:
        kv, r = h // R, h % R
        cols = slice(int(lo[b, t]), int(hi[b, t]))
        cc = f64(c[b, cols])
        s = torch.full((cc.shape[0],), float(qb[b, t, h]), dtype=torch.float64)
        if DC:
            s += cc[:, :DC] @ f64(qc[b, t, h])
        if W:
            s += f64(kr[b, kv, cols]) @ f64(qr[b, t, h])
        logits = s * scale
        if NW:
            logits = torch.cat([f64(near[b, kv, r * T + t]) * scale, logits])
        p = torch.softmax(logits, 0)
        p_far = p[p.shape[0] - cc.shape[0]:]
        o = (p_far @ cc) @ f64(a_v[kv]) + p_far.sum() * f64(b_v[kv, 0])
        if NW:
            o += p[:NW] @ f64(near_v[b, kv])
        ref[b, h, t] = o
    assert rel_err(out.cpu(), ref) < TOL[dtype]


class HostSyncs:
    """The PyTorch operators a call runs that make the host wait for the device (a value read back, or an output
    whose shape depends on the values); Triton launches (whose interpreter moves tensors with PyTorch) left out."""

    SYNCING = {"nonzero", "nonzero_numpy", "_local_scalar_dense", "is_nonzero", "equal", "masked_select", "unique", "_unique2",
               "unique_consecutive", "repeat_interleave", "argwhere"}

    def __init__(self, monkeypatch):
        self.count = Launches(monkeypatch)

    def __call__(self, fn) -> list[str]:
        _, _, ops = self.count(fn)
        return [op for op in ops if op in self.SYNCING]


def kernel_and_reference_models(family: str, seed: int, prepare=lambda model: None, **keys) -> dict:
    """A tiny ``family`` model (tests/builders.py's preset; seq_length 64, window 4, fp32, then ``keys``) on
    ``attention_impl: triton`` and the same weights on ``reference``, by impl, in eval mode; ``prepare(model)``
    edits the triton one's weights (no grad) before they are copied."""
    from builders import FAMILY_PRESETS, TINY_FAMILY_KEYS, config

    keys = {**TINY_FAMILY_KEYS, "seq_length": 64, "window_size": 4, "precision": "fp32", **keys}
    torch.manual_seed(seed)
    models = {impl: build_model(config(FAMILY_PRESETS[family], **keys, attention_impl=impl).model).to(DEVICE).eval()
              for impl in ("triton", "reference")}
    with torch.no_grad():
        prepare(models["triton"])
    models["reference"].load_state_dict(models["triton"].state_dict())
    return models


def decode_on_the_kernel(models: dict, lengths: list[int], N: int, launches: list[str], monkeypatch,
                         after_step=lambda: None) -> None:
    """Prefill prompts of ``lengths`` into ``models["triton"]``'s cache, decode ``N - 1`` steps and check: the first
    step launches exactly ``launches`` (Triton kernels, in order), no step runs a host-synchronising PyTorch operator
    (on a GPU also under CUDA's sync debug mode), and the logits equal ``models["reference"]``'s full forward.
    ``after_step`` runs after each counted step."""
    model = models["triton"]
    seqs = [torch.randint(0, model.cfg.vocab_size, (n + N,), device=DEVICE) for n in lengths]
    syncs, count = HostSyncs(monkeypatch), Launches(monkeypatch)
    steps = []
    with torch.inference_mode():
        cache = model.new_cache(lengths, N)
        steps.append(model.prefill([s[:n] for s, n in zip(seqs, lengths)], cache)[:, None])
        for t in range(N - 1):
            ids = torch.stack([s[n + t] for s, n in zip(seqs, lengths)])[:, None]
            if t == 0:
                _, triton_ops, _ = count(lambda: model.decode(ids, cache))
                assert triton_ops == launches
                cache.layout.length -= 1  # the step again, counted for host syncs
            if ON_GPU:
                torch.cuda.set_sync_debug_mode("error")
            try:
                found = syncs(lambda: steps.append(model.decode(ids, cache)))
            finally:
                if ON_GPU:
                    torch.cuda.set_sync_debug_mode("default")
            assert found == [], f"step {t}: host-synchronising operators {found}"
            after_step()
        got = torch.cat(steps, 1)
        for b, (s, n) in enumerate(zip(seqs, lengths)):
            full = models["reference"](s[None])[0, n - 1:n + N - 1]
            torch.testing.assert_close(got[b], full, rtol=1e-4, atol=1e-4 * full.abs().max().item())


@pytest.mark.parametrize("family,attention_type,cache", [("gpt_neox", "dar", "keys"), ("gpt_neox", "uniform", "keys"),
                                                         ("gpt_neox", "dar", "latent"), ("llama", "dar", "keys")])
def test_dar_decode_on_the_kernel_equals_the_full_forward(family, attention_type, cache, monkeypatch):
    """DAR's decode step on ``attention_impl: triton`` (``dar_decode_attention``'s two kernels): logits equal
    the full forward's for prompts of different lengths in one batch (padding columns), contexts longer than the
    window and the kernel's chunks; the cache of c and rotated key dims or ``latent``; the uniform baseline (w = 0:
    a query's own column is far); GPT-NeoX's partial rotary (absorbed and rotated dims) and Llama's full rotary
    with grouped heads (rotated dims only). Each layer launches the far kernel once a step, nothing else of Triton,
    and no PyTorch operator waits for the device."""
    models = kernel_and_reference_models(family, 5, attention_type=attention_type, dar_inference_cache=cache,
                                         **({"num_kv_heads": 4} if family == "gpt_neox" else {}))
    # the longest row's context (35) spans two of the interpreter's chunks (32)
    launches = ["_far_kernel", "_finish_kernel"] * models["triton"].cfg.num_layers
    decode_on_the_kernel(models, [5, 2, 30], 6, launches, monkeypatch)


def test_dar_decode_wider_than_the_far_kernel_runs_the_pytorch_path_with_a_warning(monkeypatch):
    """A layer whose far columns are wider than one launch takes (here Llama's full rotary, 4 key/value heads of 80
    dims: 320 rotated dims a column) decodes through the standalone PyTorch step, says so once, launches no Triton
    kernel and still equals the full forward; the kernel itself refuses such widths with a one-line error."""
    from kernels import dar_decode_attention

    models = kernel_and_reference_models("llama", 6, attention_type="dar", num_kv_heads=4, head_dim=80)
    with pytest.warns(UserWarning, match="more than the far-column kernel's 256 dims or 16 heads; the decode step"):
        decode_on_the_kernel(models, [5, 9], 3, [], monkeypatch)
    c = torch.zeros(1, 8, 300, device=DEVICE)
    with pytest.raises(ValueError, match="d_c = 300 and H_kv x width = 0 must each be at most 256, the query"):
        dar_decode_attention(torch.zeros(1, 1, 2, 300, device=DEVICE), None, torch.zeros(1, 1, 2, device=DEVICE), c,
                             None, *(torch.zeros(1, 1, dtype=torch.int32, device=DEVICE),) * 2, None, None,
                             torch.zeros(1, 300, 4, device=DEVICE), None, 1.0)


@pytest.mark.parametrize("family", ["llama"])
def test_aha_decode_on_the_kernel_equals_the_full_forward_without_host_syncs(family, monkeypatch):
    """AHA's decode step on ``attention_impl: triton`` (the kernels' ``range_attention`` with each row's key range):
    logits equal the full forward's, prompts of different lengths in one batch (padding columns), gates both open
    and closed, contexts longer than the window and the kernel's chunks; no PyTorch operator of a step waits for
    the device (on a GPU also checked by CUDA's sync debug mode), and each layer launches the range kernel's two
    passes, nothing else of Triton."""
    def open_some_gates(model):  # gates open and closed (the router starts at 0: s = 0.5, closed)
        for m in model.attention_modules():
            m.router.weight.normal_(0.0, 1.0)

    models = kernel_and_reference_models(family, 3, open_some_gates, attention_type="aha",
                                         # GPT-NeoX: one key/value head per query head
                                         **({"num_kv_heads": 4} if family == "gpt_neox" else {}))
    model = models["triton"]
    gates = []
    # the longest row's context (34) spans two of the interpreter's chunks (32)
    launches = ["_range_partial_kernel", "_range_merge_kernel"] * model.cfg.num_layers
    decode_on_the_kernel(models, [5, 2, 24], 10, launches, monkeypatch,
                         lambda: gates.extend(m.token_stats["mu_f"] for m in model.attention_modules()))
    opened = torch.cat([g.flatten() for g in gates]).float().mean().item()
    assert 0.1 < opened < 0.9, opened  # both paths are exercised
