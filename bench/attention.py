"""Benchmark the Triton kernels (kernels/) against PyTorch paths: forward and forward+backward time, peak memory.

Per kernel and sequence length it times: ``triton`` (this project's kernel; for MSWA also ``triton_one_launch``,
every head in one launch instead of one per window group; for DAR, SWA and MSWA also ``triton_dq_atomic`` and
``triton_dq_rows``, the backward's dq pass fixed, while ``triton`` records the pass its backward chose by timing
both, ``dq_choices``), ``reference`` (the model's explicit-mask path, float32
math), ``sdpa_path`` (the model's SDPA path for the variant), ``sdpa_causal`` (plain causal
``scaled_dot_product_attention`` forced to the flash backend, same q/k/v shapes: the speed of light for dense causal
attention) and ``flex`` (``flex_attention`` compiled, with the variant's mask; block-mask build not timed; DAR
over its two key sets concatenated, ``2T`` keys, the concatenation timed as part of the method; compiled once for
the whole run, and reaching dynamo's recompile limit is an error, not a silent fall back to uncompiled flex). SWA is
the MSWA kernel with every head's window ``w``, one call. MSWA is timed over the four layer groups of the SPEC's
window table (base ``w``: windows ``w/16 .. 4w``), every other method likewise four times, and summed.

Fairness: every method gets q/k/v as the model makes them (strided views of a fused projection) and ends as the
model's attention does (``o.transpose(1, 2).reshape(B, T, H * d_h)``, whose backward hands a strided ``do``); each
method's output is checked against the reference (batch row 0) before it is timed, on the full batch (so the
autotuner tunes for the timed shapes); a wrong or failing method is recorded, not timed, and the exit status is 1.
``sdpa_causal`` computes another attention (plain causal) and is not compared. The JSON is rewritten after each
(kernel, T) with ``"complete": false`` until the run ends, and flex (compiled by inductor per shape and grad mode,
the slowest part on a GPU) runs last, in a pass of its own: a run stopped by a time limit keeps the rest.
The JSON records which flash kernels SDPA ran (profiler names) and PyTorch's active flash implementation.
``--profile`` runs the ``triton`` and ``sdpa_causal`` forward+backward once more under torch's profiler and records,
per row, each CUDA kernel's launches and device microseconds beside the call's wall microseconds (``profile``): where
a kernel's time goes, and how much of the call the device spends waiting for the host; and, outside the profiler,
the host's milliseconds to issue one forward+backward (``host_fwd_bwd_ms``), against the device-timed ones.

Modes:
  python bench/attention.py                      # CUDA (the target). Defaults: bf16, B=8, H=12, d_h=64,
                                                 #   T in {2048, 8192}, w=128, DAR, SWA, MSWA, AHA (10% of
                                                 #   rows routed global)
  python bench/attention.py --interpret          # CPU smoke run under TRITON_INTERPRET=1, tiny shapes;
                                                 #   timings are the interpreter's, NOT GPU performance
  python bench/attention.py --compile-only       # no GPU needed: compile every kernel for sm_90a and report
                                                 #   registers, spills, shared memory and wgmma use

Writes JSON (device, torch/triton versions, git commit, command, UTC date, every number) to ``bench/results/``
(or ``--out``) and prints a table of time ratios with the issue's targets (bench/gpu_targets.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--interpret", action="store_true",
                   help="CPU smoke run under TRITON_INTERPRET=1 with tiny shapes (interpreter timings, not GPU)")
    p.add_argument("--compile-only", action="store_true",
                   help="compile every kernel for sm_90a without a GPU and report registers/spills/shared/wgmma")
    p.add_argument("--compile-filter", nargs="+", default=[""],
                   help="--compile-only: only kernels whose name contains one of these")
    p.add_argument("--compile-configs", type=int, default=2, help="--compile-only: autotune configs per kernel")
    p.add_argument("--kernels", nargs="+", default=["dar", "swa", "mswa", "aha"], choices=["dar", "swa", "mswa", "aha"],
                   help="swa: the MSWA kernel with every head at --window, one layer")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--seqlens", type=int, nargs="+", default=[2048, 8192])
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--aha-frac", type=float, default=0.1, help="fraction of (token, head) rows routed global")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--methods", nargs="+",
                   default=["triton", "triton_one_launch", "triton_dq_atomic", "triton_dq_rows", "reference",
                            "sdpa_path", "sdpa_causal", "flex"],
                   help="triton_one_launch: MSWA only, all heads in one launch (group_by_window=False); "
                        "triton_dq_atomic / triton_dq_rows: DAR, SWA, MSWA with the backward's dq pass fixed "
                        "(kernels.backward.DQ_PASS; triton: the pass the backward chose by timing both)")
    p.add_argument("--flex-kernels", nargs="+", default=None, choices=["dar", "swa", "mswa", "aha"],
                   help="time flex only for these kernels (default: every kernel of --kernels; inductor compiles "
                        "each mask, the slowest part of a run)")
    p.add_argument("--warmup-ms", type=float, default=50.0,
                   help="warm-up time per measurement (GPU: do_bench's; CPU: calls until it is spent, none at 0)")
    p.add_argument("--rep-ms", type=float, default=300.0,
                   help="timed calls per measurement until this is spent (at least one on the CPU)")
    p.add_argument("--profile", action="store_true",
                   help="also run the triton and sdpa_causal methods' forward+backward once under torch's profiler: "
                        "each kernel's launches and device microseconds against the call's wall microseconds "
                        "(on CPU: aten ops and CPU microseconds); time the host's issuing of one forward+backward; "
                        "on a GPU, time it replayed from a CUDA graph (the device's time without the host's)")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/attention-<tag>.json)")
    args = p.parse_args(argv)
    if args.interpret:
        args.batch, args.heads, args.head_dim, args.seqlens, args.window = 1, 4, 16, [32], 8
        args.dtype = "fp32"
        # flex_attention compiles through inductor's C++ backend on the CPU: minutes on 2 cores (tests/test_kernels.py
        # checks the flex baselines there); SDPA's flash backend has a CPU kernel
        args.methods = [m for m in args.methods if m != "flex"]
    return args


# ---------------------------------------------------------------------------------------------- environment
def environment(args, torch, triton) -> dict:
    from neox_dar.provenance import device_report, provenance

    gpu = torch.cuda.is_available() and not args.interpret
    return {
        "label": ("GPU timings" if gpu else
                  "Triton CPU interpreter smoke timings: correctness plumbing only, NOT GPU performance"),
        **device_report(),
        "device": torch.cuda.get_device_name() if gpu else "cpu (TRITON_INTERPRET=1)",
        **provenance(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }


def sdpa_flash_kernels(torch) -> dict:
    """Which flash implementation ``sdpa_causal`` runs: PyTorch's active implementation (None: its bundled
    FlashAttention-2) and the CUDA kernels one bf16 forward+backward launched (profiler names)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        torch.cuda.synchronize()
    names = sorted({e.name for e in prof.events() if "flash" in e.name.lower() or "fmha" in e.name.lower()})
    current = getattr(torch.nn.attention, "current_flash_attention_impl", lambda: "unknown")()
    return {"active_impl": current, "kernels": names}


# ---------------------------------------------------------------------------------------------- timing
class Timer:
    """Median milliseconds of a callable: CUDA events via ``triton.testing.do_bench`` on GPU; on CPU wall clock,
    likewise calls for ``--warmup-ms`` (none at 0) and then timed calls for ``--rep-ms`` (at least one)."""

    def __init__(self, torch, triton, args, gpu: bool):
        self.torch, self.triton, self.args, self.gpu = torch, triton, args, gpu

    def ms(self, fn) -> float:
        if self.gpu:
            return float(self.triton.testing.do_bench(fn, warmup=self.args.warmup_ms, rep=self.args.rep_ms,
                                                      return_mode="median"))
        start = time.perf_counter()
        while (time.perf_counter() - start) * 1e3 < self.args.warmup_ms:
            fn()
        times = []
        while not times or sum(times) < self.args.rep_ms:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def peak_mb(self, fn) -> float | None:
        if not self.gpu:
            return None
        torch = self.torch
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20


# ---------------------------------------------------------------------------------------------- cases
_FLEX = None


# Compiled flex entries per (kernel, T): dynamo specializes on the batch and the grad mode, and each mask function
# is a new entry (per-layer closures of one function are not): the outputs' check and the timed forward (full
# batch, no grad), ``timed``'s batch-1 shape probe (no grad), forward+backward (full batch), and the batch-1 calls
# of an out-of-memory retry.
FLEX_COMPILES_PER_CASE = 4


def compiled_flex(torch, cases: int):
    """``flex_attention`` compiled once for the whole run of ``cases`` (kernel, T) pairs. Dynamo recompiles it for a
    new shape, grad mode or mask function, at most :data:`FLEX_COMPILES_PER_CASE` times per case; past its
    recompile limit it would run flex uncompiled, materializing T x T scores, so the limit is set to that count
    and reaching it is an error instead of a silently slow (and vacuously beaten) baseline."""
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        torch._dynamo.config.fail_on_recompile_limit_hit = True
        torch._dynamo.config.recompile_limit = FLEX_COMPILES_PER_CASE * cases
        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


def build_cases(name: str, T: int, args, torch, device, dtype):
    """``(inputs, {method: callable(*inputs) -> (B, T, H * d_h)})`` for one kernel at length ``T``.

    Inputs are laid out as the model makes them: ``q, k, v`` strided views of one fused projection (B, T, H, 3 d_h)
    (DAR's ``k_glob, v_glob`` of a second one), and every method ends as the model's attention does,
    ``o.transpose(1, 2).reshape(B, T, H * d_h)``, so its backward receives the strided ``do`` the model produces.
    """
    import torch.nn.functional as F

    import kernels
    from neox_dar.attention.aha import aha_reference, aha_sdpa
    from neox_dar.attention.dar import dar_reference, dar_sdpa
    from neox_dar.attention.masks import masked_attention, window_mask
    from neox_dar.attention.mswa import mswa_window_table
    from neox_dar.attention.windowed import windowed_sdpa
    from neox_dar.config import Config

    B, H, D, w = args.batch, args.heads, args.head_dim, args.window
    gen = torch.Generator(device="cpu").manual_seed(0)

    def fused(n):
        """A leaf (B, T, H, n d_h): n tensors' heads in one projection's output, as the model computes them."""
        return torch.randn(B, T, H, n * D, generator=gen).to(device=device, dtype=dtype).requires_grad_()

    def heads(x, n):
        """The n strided per-head views (B, H, T, d_h) of a fused leaf (the model's ``split_heads``)."""
        return x.transpose(1, 2).chunk(n, dim=-1)

    def merged(o):
        return o.transpose(1, 2).reshape(o.shape[0], T, H * D)

    def fixed_dq(fn):
        """The triton method again under each fixed dq pass (check_and_time sets it for the timed calls)."""
        return {method: fn for method in FIXED_DQ}

    def sdpa_causal(q, k, v):
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def flex_fn(mask_mod, bsz, kv_len=T):
        from torch.nn.attention.flex_attention import create_block_mask

        # _compile: build the block mask chunk-wise instead of materializing (B, H, T, kv_len) booleans
        block_mask = create_block_mask(mask_mod, bsz, H, T, kv_len, device=device, _compile=True)
        flex = compiled_flex(torch, len(args.kernels) * len(args.seqlens))
        return lambda q, k, v: flex(q, k, v, block_mask=block_mask)

    qkv = fused(3)
    if name == "dar":
        kv_glob = fused(2)
        inputs = [qkv, kv_glob]
        qkv_of = lambda a, b: (*heads(a, 3), *heads(b, 2))  # noqa: E731
        methods = {"triton": lambda *x: kernels.dar_attention(*qkv_of(*x), w),
                   **fixed_dq(lambda *x: kernels.dar_attention(*qkv_of(*x), w)),
                   "reference": lambda *x: dar_reference(*qkv_of(*x), w),
                   "sdpa_path": lambda *x: dar_sdpa(*qkv_of(*x), w),
                   "sdpa_causal": lambda a, b: sdpa_causal(*heads(a, 3))}
        if "flex" in args.methods:
            # keys 0..T-1 the local set (pair (i, j) inside the window), T..2T-1 the far set (beyond it)
            def dar_mask(b, h, qi, ki):
                far = ki >= T
                j = torch.where(far, ki - T, ki)
                return (qi >= j) & ((qi - j < w) != far)

            flex = flex_fn(dar_mask, None, kv_len=2 * T)

            def dar_flex(q, k_loc, v_loc, k_glob, v_glob):
                return flex(q, torch.cat([k_loc, k_glob], 2), torch.cat([v_loc, v_glob], 2))

            methods["flex"] = lambda *x: dar_flex(*qkv_of(*x))
        methods = {m: (lambda f: lambda *x: merged(f(*x)))(f) for m, f in methods.items()}
    elif name == "mswa":
        inputs = [qkv]
        table = mswa_window_table(Config.from_flat(dict(attention_type="mswa", num_layers=4, num_attention_heads=H,
                                                        hidden_size=H * D, window_size=w)).model)
        host_wins = [torch.tensor(row) for row in table]  # as the model passes them: read on the host
        masks = [torch.stack([window_mask(T, x, device) for x in row]) for row in table] \
            if "reference" in args.methods else []

        def sdpa_path(q, k, v, row):
            out = torch.empty_like(q)
            for x in sorted(set(row)):
                idx = torch.tensor([h for h, hw in enumerate(row) if hw == x], device=device)
                out[:, idx] = windowed_sdpa(q[:, idx], k[:, idx], v[:, idx], x)
            return out

        def layers(f):
            """The four layer groups' windows on the same inputs, outputs summed."""
            return lambda x: sum(merged(f(*heads(x, 3), n)) for n in range(len(table)))

        methods = {"triton": layers(lambda q, k, v, n: kernels.mswa_attention(q, k, v, host_wins[n])),
                   **fixed_dq(layers(lambda q, k, v, n: kernels.mswa_attention(q, k, v, host_wins[n]))),
                   "triton_one_launch": layers(lambda q, k, v, n: kernels.mswa_attention(
                       q, k, v, host_wins[n], group_by_window=False)),
                   "reference": layers(lambda q, k, v, n: masked_attention(q, k, v, masks[n])),
                   "sdpa_path": layers(lambda q, k, v, n: sdpa_path(q, k, v, table[n])),
                   "sdpa_causal": layers(lambda q, k, v, n: sdpa_causal(q, k, v))}
        if "flex" in args.methods:
            def window_mask_mod(windows):
                """The layer's mask: one closure per layer over its own window tensor, all of one function, so
                dynamo compiles flex once for every layer; no buffer shared by the layers is rewritten between a
                layer's forward and the backward that reads it again."""
                return lambda b, h, qi, ki: (qi >= ki) & (qi - ki < windows[h])

            flex = [flex_fn(window_mask_mod(torch.tensor(row, device=device)), None) for row in table]
            methods["flex"] = layers(lambda q, k, v, n: flex[n](q, k, v))
    elif name == "swa":
        inputs = [qkv]
        methods = {"triton": lambda q, k, v: kernels.mswa_attention(q, k, v, w),
                   **fixed_dq(lambda q, k, v: kernels.mswa_attention(q, k, v, w)),
                   "reference": lambda q, k, v: masked_attention(q, k, v, window_mask(T, w, device)),
                   "sdpa_path": lambda q, k, v: windowed_sdpa(q, k, v, w),
                   "sdpa_causal": sdpa_causal}
        if "flex" in args.methods:
            flex = flex_fn(lambda b, h, qi, ki: (qi >= ki) & (qi - ki < w), None)
            methods["flex"] = lambda q, k, v: flex(q, k, v)
        methods = {m: (lambda f: lambda x: merged(f(*heads(x, 3))))(f) for m, f in methods.items()}
    else:  # aha
        gate = (torch.rand(B, H, T, generator=gen) < args.aha_frac).to(device)
        inputs = [qkv, gate]  # the gate rides along so batch chunks slice it
        methods = {"triton": lambda q, k, v, g: kernels.aha_attention(q, k, v, g, w),
                   "reference": lambda q, k, v, g: aha_reference(q, k, v, g, w),
                   "sdpa_path": lambda q, k, v, g: aha_sdpa(q, k, v, g, w),
                   "sdpa_causal": lambda q, k, v, g: sdpa_causal(q, k, v)}
        if "flex" in args.methods:
            flex = flex_fn(lambda b, h, qi, ki: (qi >= ki) & (gate[b, h, qi] | (qi - ki < w)), B)
            methods["flex"] = lambda q, k, v, g: flex(q, k, v)
        methods = {m: (lambda f: lambda x, g: merged(f(*heads(x, 3), g)))(f) for m, f in methods.items()}
    return inputs, {m: f for m, f in methods.items() if m in args.methods}


def error_line(e: Exception) -> str:
    """An exception as one line for a result record: its type and its message's first line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


# Largest relative (Frobenius) error of a method's output against the reference (float32 math) on batch row 0.
CHECK_TOL = {"bf16": 3e-2, "fp16": 1e-2, "fp32": 1e-3}
# Not compared with the variant's reference: the reference itself, and plain causal SDPA (another mask: the speed
# baseline of the targets, PyTorch's own kernel)
UNCHECKED = ("reference", "sdpa_causal")


def check_outputs(methods: dict, inputs, args, torch) -> dict:
    """Each method's output on the full inputs, batch row 0, against the reference's on that row alone: ``{method:
    relative error}`` (or the error message of a method that raised). Runs before any timing (so a wrong method is
    never timed) and on the full batch (so the autotuner tunes for the shapes that are timed)."""
    with torch.no_grad():
        ref = methods["reference"](*(x[:1] for x in inputs)).double()
        errs = {}
        for m, fn in methods.items():
            if m in UNCHECKED:
                continue
            try:
                out = fn(*inputs)[:1].double()
                errs[m] = ((out - ref).norm() / ref.norm()).item()
            except Exception as e:  # noqa: BLE001  (a method that cannot run, e.g. flex past its recompile limit)
                errs[m] = error_line(e)
            if torch.cuda.is_available() and not args.interpret:
                torch.cuda.empty_cache()
    return errs


def measure(fn, inputs, timer, torch, profile: bool = False) -> dict:
    """Forward and forward+backward median ms and forward+backward peak MiB.

    Every method maps inputs of batch B to an output of batch B. When the full batch runs out of memory (the
    explicit-mask reference at T = 8192), it is timed again as B sequential batch-1 calls, and the record says so;
    a second out-of-memory is recorded, not fatal.
    """
    B = inputs[0].shape[0]
    try:
        return timed(fn, inputs, timer, torch, chunk=B, profile=profile)
    except torch.cuda.OutOfMemoryError:
        pass
    torch.cuda.empty_cache()
    try:
        return {**timed(fn, inputs, timer, torch, chunk=1), "batch_chunks": B,
                "note": "full batch out of memory: timed as B sequential batch-1 calls"}
    except torch.cuda.OutOfMemoryError:
        return {"fwd_ms": None, "fwd_bwd_ms": None, "peak_mib": None, "error": "out of memory"}


def timed(fn, inputs, timer, torch, chunk: int, profile: bool = False) -> dict:
    with torch.no_grad():
        out = fn(*(x[:1] for x in inputs))
    grad = torch.randn((inputs[0].shape[0], *out.shape[1:]), dtype=out.dtype, device=out.device)  # contiguous
    del out
    parts = [slice(i, i + chunk) for i in range(0, inputs[0].shape[0], chunk)]
    leaves = [x for x in inputs if x.requires_grad]

    def fwd():
        with torch.no_grad():
            for sl in parts:
                fn(*(x[sl] for x in inputs))

    def fwd_bwd():
        for x in leaves:
            x.grad = None
        for sl in parts:
            fn(*(x[sl] for x in inputs)).backward(grad[sl])

    r = {"fwd_ms": timer.ms(fwd), "fwd_bwd_ms": timer.ms(fwd_bwd), "peak_mib": timer.peak_mb(fwd_bwd)}
    if profile:
        from neox_dar import timing

        # the median of 10 calls on a GPU; 2 under the interpreter (a second per call, and nothing judged there)
        r["host_fwd_bwd_ms"] = timing.host_ms(fwd_bwd, inputs[0].device, calls=10 if timer.gpu else 2)
        if timer.gpu:
            try:
                r["graph_fwd_bwd_ms"] = graph_ms(fwd_bwd, timer, torch)
            except Exception as e:  # noqa: BLE001  (the eager timings stand; the record says why this one is missing)
                r["graph_error"] = error_line(e)
        try:
            r["profile"] = timing.launch_profile(fwd_bwd, inputs[0].device)
        except Exception as e:  # noqa: BLE001  (the timings above stand; the record says why the profile is missing)
            r["profile"] = {"error": error_line(e)}
    return r


def graph_ms(fn, timer, torch) -> float:
    """Median milliseconds of ``fn()`` (a forward+backward that has run already: tuned, its ``dq`` pass chosen)
    captured once into a CUDA graph and replayed: the device's time for the call's work with the host's cost of
    issuing it (Python, autograd, the launches) taken out, as torch.compile's CUDA graphs would. The eager
    ``fwd_bwd_ms`` is the larger of this and the host's time (``host_fwd_bwd_ms``)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on the capture's stream, as torch.cuda.graph's documentation asks
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    try:
        return timer.ms(graph.replay)
    finally:
        del graph
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_benchmarks(args, torch, triton, save=None) -> dict:
    """Check and time every method for each kernel and T; ``save(report)`` after each (kernel, T), so that a run
    stopped by a time limit keeps what it measured (``"complete": False`` until the end). Flex runs last, in a pass
    of its own: inductor compiles it per shape and grad mode, the slowest part of a run on the GPU."""
    gpu = not args.interpret
    device = torch.device("cuda" if gpu else "cpu")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    timer = Timer(torch, triton, args, gpu)
    from bench.gpu_targets import attention_targets

    results = []
    report = {"complete": False, "results": results, "targets": []}
    if gpu and "sdpa_causal" in args.methods:  # first: a run stopped by its time limit still records it
        report["sdpa_flash"] = sdpa_flash_kernels(torch)
    passes = [[m for m in args.methods if m != "flex"], [m for m in args.methods if m == "flex"]]
    for timed_methods in filter(None, passes):
        # the reference is built in every pass (the outputs' check needs it), timed only where asked for
        pass_args = argparse.Namespace(**{**vars(args), "methods": [*timed_methods, "reference"]})
        flex_pass = timed_methods == ["flex"]
        for name in [k for k in args.kernels if not flex_pass or k in (args.flex_kernels or args.kernels)]:
            for T in args.seqlens:
                inputs, methods = build_cases(name, T, pass_args, torch, device, dtype)
                errs = check_outputs(methods, inputs, args, torch)
                for method in [m for m in timed_methods if m in methods]:  # (triton_one_launch: MSWA only)
                    results.append(check_and_time(name, T, method, methods[method], errs.get(method), inputs, args,
                                                  timer, torch))
                    if gpu:
                        torch.cuda.empty_cache()
                report["targets"] = attention_targets(results, judged=gpu)
                if save is not None:
                    save(report)
    if _FLEX is not None:
        report["flex"] = {"compiled_once": True, "recompile_limit": torch._dynamo.config.recompile_limit,
                          "fail_on_recompile_limit_hit": torch._dynamo.config.fail_on_recompile_limit_hit}
    report["complete"] = True
    return report


PROFILED = ("triton", "sdpa_causal")  # the methods --profile runs once more under torch's profiler

# methods that run the triton kernels with the backward's dq pass fixed (kernels.backward.DQ_PASS)
FIXED_DQ = {"triton_dq_atomic": "atomic", "triton_dq_rows": "rows"}


def check_and_time(name: str, T: int, method: str, fn, err, inputs, args, timer, torch) -> dict:
    """One result row: timed unless the method raised or its output differs from the reference (``err``). The
    ``triton`` row records the dq pass its backward chose (``dq_choices``, timed on CUDA only)."""
    from kernels import backward

    r = {"kernel": name, "T": T, "method": method, "rel_err_vs_reference": err,
         "fwd_ms": None, "fwd_bwd_ms": None, "peak_mib": None}
    chosen_before = len(backward.DQ_CHOICES)
    if isinstance(err, str):
        r["error"] = f"{err}: not timed"
    elif err is not None and not err <= CHECK_TOL[args.dtype]:
        r["error"] = (f"output differs from the reference (relative error {err:.3g} > "
                      f"{CHECK_TOL[args.dtype]:g}): not timed")
    else:
        backward.DQ_PASS = FIXED_DQ.get(method)
        try:
            r.update(measure(fn, inputs, timer, torch, profile=args.profile and method in PROFILED))
        except Exception as e:  # noqa: BLE001  (recorded, printed, and the exit status says so)
            r["error"] = error_line(e)
        finally:
            backward.DQ_PASS = None
    if len(backward.DQ_CHOICES) > chosen_before:
        r["dq_choices"] = backward.DQ_CHOICES[chosen_before:]
    shown = f"{err:.2e}" if isinstance(err, float) else "-"
    print(f"{name:5s} T={T:6d} {method:17s} fwd {fmt(r['fwd_ms'])} ms  fwd+bwd {fmt(r['fwd_bwd_ms'])} ms"
          f"  peak {fmt(r['peak_mib'])} MiB  err {shown} {r.get('error', '')}{r.get('note', '')}", flush=True)
    if "profile" in r and "error" in r["profile"]:
        print(f"      profile failed: {r['profile']['error']}", flush=True)
    elif "profile" in r:
        prof = r["profile"]
        print(f"      profiled fwd+bwd: {prof['launches']} {prof['what']}, {prof['kernel_us']:.1f} us of them in "
              f"{prof['wall_us']:.1f} us wall; host {fmt(r['host_fwd_bwd_ms'])} ms to issue, replayed from a CUDA "
              f"graph {fmt(r.get('graph_fwd_bwd_ms'))} ms {r.get('graph_error', '')}", flush=True)
    return r


def fmt(x) -> str:
    return "-" if x is None else f"{x:9.3f}"


def print_table(report: dict) -> None:
    by = {}
    for r in report["results"]:
        by.setdefault((r["kernel"], r["T"]), {})[r["method"]] = r
    print(f"\n{report['label']} on {report['device']}\n")
    print("| kernel | T | method | fwd ms | fwd+bwd ms | peak MiB | fwd+bwd / sdpa_causal | fwd+bwd / triton "
          "| rel. error vs reference |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (k, T), rows in by.items():
        base = rows.get("sdpa_causal", {}).get("fwd_bwd_ms")
        tri = rows.get("triton", {}).get("fwd_bwd_ms")
        for m, r in rows.items():
            fb = r["fwd_bwd_ms"]
            ratio = lambda d: f"{fb / d:.2f}" if fb and d else "-"  # noqa: E731
            err = r.get("rel_err_vs_reference")
            shown = f"{err:.2e}" if isinstance(err, float) else "-"
            print(f"| {k} | {T} | {m} | {fmt(r['fwd_ms'])} | {fmt(fb)} | {fmt(r['peak_mib'])} | {ratio(base)} "
                  f"| {ratio(tri)} | {shown} |")
    for t in report["targets"]:
        value = "not timed" if t["value"] is None else f"{t['value']:.3f}"
        state = {True: "PASS", False: "FAIL", None: "n/a" if t["judged"] else "not judged (not a GPU)"}[t["met"]]
        print(f"target {t['target']}: {value}: {state}")


# ---------------------------------------------------------------------------------------------- compile report
def compile_report(args) -> dict:
    """Compile every kernel specialization for sm_90a (no GPU needed) and read ptxas's resource report."""
    import re
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    from kernels import backward, banded, dar_decode, decode
    from kernels.runtime import is_wide_key_tile

    pointer_dtype = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}[args.dtype]
    int_ptrs = {"WIN", "KV_HEADS", "ROWS", "COUNTS", "LO", "HI"}
    fp32_ptrs = {"LSE", "DELTA", "DQ", "M", "L", "ACC", "QB", "NS"}
    scalars = {"H", "R", "G", "T", "T_TUNE", "W_TUNE", "D", "NC", "DC", "WIDTH", "W"}
    specs = [("_fwd_kernel", dict(HAS_LOCAL=True, HAS_FAR=True)), ("_fwd_kernel", dict(HAS_LOCAL=True, HAS_FAR=False)),
             ("_bwd_kernel", dict(HAS_FAR=True, ROUTED=False, ATOMIC_DQ=True)),
             ("_bwd_kernel", dict(HAS_FAR=False, ROUTED=False, ATOMIC_DQ=True)),
             ("_bwd_kernel", dict(HAS_FAR=False, ROUTED=True, ATOMIC_DQ=True)),
             ("_bwd_kernel", dict(HAS_FAR=True, ROUTED=False, ATOMIC_DQ=False)),
             ("_bwd_kernel", dict(HAS_FAR=False, ROUTED=False, ATOMIC_DQ=False)),
             ("_bwd_kernel", dict(HAS_FAR=False, ROUTED=True, ATOMIC_DQ=False)),
             ("_dq_kernel", dict(HAS_LOCAL=True, HAS_FAR=True)), ("_dq_kernel", dict(HAS_LOCAL=True, HAS_FAR=False)),
             ("_routed_fwd_kernel", {}), ("_routed_dq_kernel", {}),
             ("_range_partial_kernel", {}), ("_range_merge_kernel", {}), ("_far_kernel", {}), ("_finish_kernel", {})]
    # the decode kernels are not autotuned: their module and one launch configuration (kernels/decode.py; DAR's far
    # columns at Pythia-160M's shape: 12 heads, d_down 192 and 12 x 16 rotated dims, kernels/dar_decode.py)
    fixed = {"_range_partial_kernel": (decode, triton.Config(dict(CHUNK_=decode.CHUNK, BLOCK=decode.BLOCK_N),
                                                             num_warps=decode.PARTIAL_WARPS, num_stages=3)),
             "_range_merge_kernel": (decode, triton.Config(dict(BLOCK_C=32), num_warps=4, num_stages=3)),
             "_far_kernel": (dar_decode, triton.Config(
                 dict(HAS_QC=True, HAS_KR=True, BLOCK_H=16, BLOCK_DC=256, BLOCK_DK=256, CHUNK_=dar_decode.CHUNK,
                      BLOCK=dar_decode.BLOCK_N, PRECISION="tf32" if args.dtype != "fp32" else "ieee"),
                 num_warps=dar_decode.WARPS, num_stages=3)),
             "_finish_kernel": (dar_decode, triton.Config(  # 64 chunks (32k columns), a window of 128, d_h 64
                 dict(HAS_NEAR=True, HAS_BV=True, BLOCK_H=16, BLOCK_C=64, BLOCK_W=128, BLOCK_DC=256,
                      STEP=dar_decode.STEP, BLOCK_D=64), num_warps=dar_decode.FINISH_WARPS, num_stages=3))}
    rows = []
    for kname, flags in [(k, f) for k, f in specs if any(sub in k for sub in args.compile_filter)]:
        module = fixed[kname][0] if kname in fixed else backward if hasattr(backward, kname) else banded
        kernel = getattr(module, kname)
        jf = kernel if kname in fixed else kernel.fn  # the decode kernels are not autotuned
        # the candidates a launch with these flags is offered (wide key tiles only without atomic dq)
        configs = [fixed[kname][1]] if kname in fixed else [
            c for c in kernel.configs
            if not (flags.get("ATOMIC_DQ") and is_wide_key_tile(c))][:args.compile_configs]
        for cfg in configs:
            consts = dict(flags, **cfg.kwargs)
            if "BLOCK_D" in jf.arg_names:
                consts["BLOCK_D"] = max(16, triton.next_power_of_2(args.head_dim))
            if kname not in fixed:  # the decode kernels take d_h at run time
                consts.update(D=args.head_dim, PRECISION="tf32" if args.dtype != "fp32" else "ieee")
            sig = {}
            for a in jf.arg_names:
                if a in consts:
                    sig[a] = "constexpr"
                elif a in int_ptrs:
                    sig[a] = "*i32"
                elif a in fp32_ptrs and (a != "DQ" or flags.get("ATOMIC_DQ")):  # dq: a float32 accumulator
                    sig[a] = "*fp32"                                              # only for atomic adds
                elif a.isupper() and a not in scalars:
                    sig[a] = "*" + pointer_dtype
                else:
                    sig[a] = "fp32" if a.endswith("scale") else "i32"
            # what a launch specializes on: 16-byte aligned pointers and strides divisible by 16
            aligned = {(n,): [["tt.divisibility", 16]] for n, a in enumerate(jf.arg_names)
                       if sig[a].startswith("*") or (a.startswith("s_") and args.head_dim % 16 == 0)}
            src = ASTSource(fn=jf, signature=sig, constexprs={(jf.arg_names.index(k),): v for k, v in consts.items()},
                            attrs=aligned)
            t0 = time.perf_counter()
            compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                      options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
            ptx = compiled.asm["ptx"]
            with tempfile.TemporaryDirectory() as tmp:
                Path(tmp, "k.ptx").write_text(ptx)
                info = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", f"{tmp}/k.ptx", "-o",
                                       f"{tmp}/k.cubin"], capture_output=True, text=True)
            text = info.stdout + info.stderr
            regs = re.search(r"Used (\d+) registers", text)
            spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
            row = {"kernel": kname, **flags, "BLOCK_M": cfg.kwargs.get("BLOCK_M"),
                   "BLOCK_N": cfg.kwargs.get("BLOCK_N", cfg.kwargs.get("BLOCK")),
                   "num_warps": cfg.num_warps, "num_stages": cfg.num_stages, "shared_bytes": compiled.metadata.shared,
                   "registers": int(regs.group(1)) if regs else None,
                   "spill_store_bytes": int(spill.group(1)) if spill else None,
                   "spill_load_bytes": int(spill.group(2)) if spill else None,
                   "wgmma": ptx.count("wgmma.mma_async"), "mma_sync": ptx.count("mma.sync"),
                   "cp_async_16B": ptx.count("cp.async.cg.shared.global"),
                   "compile_s": round(time.perf_counter() - t0, 1)}
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return {"label": "sm_90a compile report (ptxas resource usage; no GPU run, no timings)", "results": rows,
            "targets": []}


# ---------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(ROOT))
    import torch
    import triton

    from neox_dar.provenance import write_result

    def out_path(report: dict, tag: str) -> Path:
        return args.out or ROOT / "bench" / "results" / f"attention-{tag}-{report['date_utc'].replace(':', '')}.json"

    if args.compile_only:
        report = {**environment(args, torch, triton), **compile_report(args)}
        report["device"] = "none (compiled for sm_90a)"
        tag = "compile-sm90a"
    else:
        if not args.interpret and not torch.cuda.is_available():
            print("bench/attention.py: no CUDA GPU here; the kernels' target is CUDA. Use --interpret for a CPU "
                  "smoke run (interpreter timings, not GPU performance) or --compile-only.", file=sys.stderr)
            return 2
        report = environment(args, torch, triton)
        tag = "interpreter-smoke" if args.interpret else report["device"].replace(" ", "_")
        path = out_path(report, tag)

        def save(partial: dict) -> None:  # after each (kernel, T): a stopped run keeps what it measured
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps({**report, **partial}, indent=1) + "\n")
            tmp.replace(path)

        report.update(run_benchmarks(args, torch, triton, save))
        print_table(report)
    write_result(report, out_path(report, tag))
    failed = [f"{r['kernel']} T={r['T']} {r['method']}" for r in report["results"] if r.get("error")
              and r["error"] != "out of memory"]
    if failed:
        print(f"bench/attention.py: {len(failed)} method(s) failed their check or raised: {', '.join(failed)}",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
