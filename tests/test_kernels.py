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

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

import kernels  # noqa: E402  (TRITON_INTERPRET must be set before this import)
from kernels import aha_attention, dar_attention, mswa_attention  # noqa: E402
from kernels.aha import route_rows  # noqa: E402
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
# about 120 kernel specializations (dtype x head size x path, counted from the cases below), so over 1000
# compilations. Correctness does not depend on the tile, so on the GPU each kernel is pinned to one candidate that
# fits every head size here (d_h <= 128): 64 x 32 query-major and 64 x 32 (8 warps) key-major.
# KERNEL_TESTS_ALL_CONFIGS=1 tunes over every candidate instead (slow).
PINNED_TILES = {"query_major": (64, 32, 4, 2), "key_major": (64, 32, 8, 3)}


def tile_of(config) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of an autotune candidate."""
    return config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps, config.num_stages


@pytest.fixture(autouse=True, scope="module")
def one_tile_per_kernel_when_compiled():
    from kernels import banded

    if not ON_GPU or os.environ.get("KERNEL_TESTS_ALL_CONFIGS") == "1":
        yield
        return
    tuners = {"query_major": [banded._fwd_kernel, banded._dq_kernel, banded._far_fwd_gather_kernel,
                              banded._far_dq_gather_kernel],
              "key_major": [banded._dkdv_kernel, banded._far_dkdv_gather_kernel]}
    saved = {}
    for family, kernels_ in tuners.items():
        for tuner in kernels_:
            pinned = [c for c in tuner.configs if tile_of(c) == PINNED_TILES[family]]
            assert len(pinned) == 1, f"{tuner.base_fn.__name__}: no candidate {PINNED_TILES[family]}"
            saved[tuner], tuner.configs = tuner.configs, pinned
    yield
    for tuner, configs in saved.items():
        tuner.configs = configs


def test_pinned_gpu_tiles_are_real_candidates():
    """What the GPU run pins must be one of the candidates the kernels tune over (checked on any machine)."""
    from kernels import runtime

    assert PINNED_TILES["query_major"] in {tile_of(c) for c in runtime._GPU_CONFIGS}
    assert PINNED_TILES["key_major"] in {tile_of(c) for c in runtime._GPU_KEY_MAJOR_CONFIGS}


# ------------------------------------------------------------------------------------------------ reference
def two_path_reference(q, k_loc, v_loc, k_far, v_far, local, far):
    """float64 softmax attention: pair (i, j) uses the local k/v where ``local`` and the far k/v where ``far``.

    ``local``, ``far``: bool, broadcast to (B, H, T, T), disjoint. A row with no pair gives zeros.
    """
    q, k_loc, v_loc, k_far, v_far = (t.double() for t in (q, k_loc, v_loc, k_far, v_far))
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


DAR_CASES = [(2, 2, 37, 16, 0), (2, 3, 45, 32, 1), (1, 2, 70, 64, 5), (2, 2, 33, 128, 128), (2, 2, 50, 32, 50),
             (1, 2, 69, 16, 20), (1, 2, 64, 32, 16)]


@pytest.mark.parametrize("B,H,T,D,w,dtype", with_dtypes(DAR_CASES, half_cases=(1, 5)))
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
MSWA_CASES = [(2, 4, 53, 32, [1, 5, 17, 128]), (1, 4, 40, 16, [0, 2, 16, 64]), (2, 2, 29, 64, [29, 3]),
              (1, 3, 50, 128, [8, 33, 1]), (1, 2, 30, 24, [4, 30])]  # d_h = 24: padded, masked columns


@pytest.mark.parametrize("B,H,T,D,windows,dtype", with_dtypes(MSWA_CASES, half_cases=(0,)))
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
    delta = distances(T)
    local = (delta >= 0) & (delta < w)
    check_against_reference(out, [qkv], lambda x: two_path_reference(*x.chunk(3, -1), *x.chunk(3, -1)[1:],
                                                                     local, local & False),
                            torch.float32, "swa strided")


# ------------------------------------------------------------------------------------------------ AHA
# (B, H, T, d_h, w, fraction of rows routed to full attention)
AHA_CASES = [(2, 2, 45, 32, 5, 0.1), (1, 2, 70, 16, 20, 0.5), (2, 2, 37, 64, 1, 1.0), (1, 2, 40, 128, 128, 0.3),
             (2, 2, 33, 16, 4, 0.0)]


@pytest.mark.parametrize("B,H,T,D,w,frac,dtype", with_dtypes(AHA_CASES, half_cases=(0,)))
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


# ------------------------------------------------------------------------------------------------ errors
def small(dtype=torch.float32, shape=(1, 2, 8, 16)):
    return torch.randn(shape, device=DEVICE, dtype=dtype)


def test_bad_inputs_raise_clear_errors():
    q = small()
    with pytest.raises(ValueError, match=r"must be \(B, H, T, d_h\)"):
        mswa_attention(q[0], q[0], q[0], torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="k shape"):
        mswa_attention(q, small(shape=(1, 2, 9, 16)), q, torch.tensor([1, 2]))
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
    with pytest.raises(ValueError, match="gate must be a bool tensor"):
        aha_attention(q, q, q, torch.ones(1, 2, 8), 4)
    if not ON_GPU:
        with pytest.raises(TypeError, match="interpreter computes bfloat16"):
            mswa_attention(*(small(torch.bfloat16),) * 3, torch.tensor([1, 2]))


def test_row_deltas_kernel_matches_float64_rowsum():
    from kernels.banded import row_deltas

    for shape in [(2, 3, 70, 64), (1, 2, 5, 24)]:  # T beyond one 64-row program; d_h not a power of two
        for dtype in DTYPES:
            o, do = torch.randn(shape, device=DEVICE, dtype=dtype), torch.randn(shape, device=DEVICE, dtype=dtype)
            ref = (o.double() * do.double()).sum(-1).reshape(shape[0] * shape[1], shape[2])
            got = row_deltas(o, do)
            assert got.dtype == torch.float32 and got.shape == ref.shape
            assert torch.allclose(got.double(), ref, rtol=1e-5, atol=1e-5), (shape, dtype)


def test_head_windows_are_read_on_the_host_cached_on_the_device_and_grouped_by_tune_bucket():
    import triton

    from kernels import banded
    from kernels.runtime import head_windows, prune_for_window

    w = head_windows("f", torch.tensor([8, 512, 7, 64, 500]), 5, 2048, DEVICE)
    assert w.values.dtype == torch.int32 and w.values.device.type == DEVICE.type
    assert w.values.tolist() == [8, 512, 7, 64, 500]
    # one launch per tune bucket, largest first, each with its own heads: window 8 is not run with 512's tiles
    assert [(g.heads.tolist(), g.tune_bucket) for g in w.groups] == [([1, 4], 512), ([3], 64), ([0, 2], 8)]
    # built once per (windows, T, device): a later layer with the same windows neither copies nor synchronizes
    again = head_windows("f", torch.tensor([8, 512, 7, 64, 500]), 5, 2048, DEVICE)
    assert again.values is w.values and all(a.heads is b.heads for a, b in zip(again.groups, w.groups, strict=True))
    assert [g.tune_bucket for g in head_windows("f", 100, 4, 2048, DEVICE).groups] == [128]
    assert [g.tune_bucket for g in head_windows("f", 5000, 4, 2048, DEVICE).groups] == [2048]  # >= T acts as T
    assert head_windows("f", 2**40, 4, 3000, DEVICE).values.tolist() == [2**30] * 4
    assert [g.tune_bucket for g in head_windows("f", torch.zeros(4, dtype=torch.long), 4, 64, DEVICE).groups] == [0]
    # every banded kernel keys its autotuning on the bucket; small tiles are offered only to small windows
    for kernel in (banded._fwd_kernel, banded._dq_kernel, banded._dkdv_kernel):
        assert "W_TUNE" in kernel.keys and "W_TUNE" in kernel.fn.arg_names
    cfg = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}) for m, n in [(128, 64), (16, 64), (64, 32), (16, 16), (32, 32)]]
    shapes = lambda cs: [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in cs]  # noqa: E731
    assert shapes(prune_for_window(cfg, {"W_TUNE": 8}, HAS_FAR=False)) == shapes(cfg)
    assert shapes(prune_for_window(cfg, {"W_TUNE": 128}, HAS_FAR=False)) == [(128, 64), (16, 64), (64, 32)]
    assert shapes(prune_for_window(cfg, {"W_TUNE": 8}, HAS_FAR=True)) == [(128, 64), (16, 64), (64, 32)]


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


def test_kernels_compile_for_hopper_without_a_gpu(tmp_path):
    """What the interpreter cannot check: the kernels compile for sm_90a (Triton's bundled ptxas), the matrix
    products become wgmma, tile loads 16-byte cp.async, and the chosen configurations do not spill."""
    out = tmp_path / "compile.json"
    res = run_bench("--compile-only", "--compile-configs", "1", "--compile-filter", "_dq_kernel", "_far_fwd",
                    "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(out.read_text())["results"]
    assert {r["kernel"] for r in rows} == {"_dq_kernel", "_far_fwd_gather_kernel"} and len(rows) == 3
    for r in rows:
        assert r["wgmma"] > 0 and r["mma_sync"] == 0 and r["cp_async_16B"] > 0, r
        assert r["spill_store_bytes"] == 0 and r["registers"] <= 255, r


# ------------------------------------------------------------------------------------------------ the model
# configs/tiny.yml with attention_impl triton vs reference, same weights, float32: the kernels as training calls
# them (through neox_dar/attention). Relative errors: logits 1e-5, every parameter gradient 1e-4.
TINY = ROOT / "configs" / "tiny.yml"


def run_model(model, ids):
    """Logits and the gradients of the LM loss plus the variant's aux loss (AHA's router term)."""
    model.zero_grad(set_to_none=True)
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    aux = model.aux_loss()
    (loss + (aux if aux is not None else 0.0)).backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.filterwarnings("ignore:MSWA. num_layers")
@pytest.mark.parametrize("attention_type,window", [("dar", 5), ("mswa", 8), ("aha", 6)])
def test_tiny_model_triton_matches_reference(attention_type, window):
    torch.manual_seed(0)
    overrides = (f"attention_type={attention_type}", f"window_size={window}", "precision=fp32")
    ref_cfg = load_config(TINY, overrides=(*overrides, "attention_impl=reference"))
    tri_cfg = load_config(TINY, overrides=(*overrides, "attention_impl=triton"))
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
