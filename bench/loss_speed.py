"""Time and kernel launches of the training loss (output layer + cross-entropy, forward and backward) on the
device present, at a model's shape: :func:`neox_dar.loss.linear_cross_entropy_sum` at several chunk sizes, reduced
by PyTorch operators (``chunked``, the CPU's way) and, on CUDA, by the Triton kernel (``fused``, the GPU's way),
against the plain ``F.cross_entropy(F.linear(h, W).float(), y)``.

    python bench/loss_speed.py [--positions 32768] [--hidden 768] [--vocab 50304] [--dtype bfloat16]
        [--rows 166 2048] [--fused-rows 2048 8192] [--repeats 5] [--out bench/results/loss_speed_<device>.json]

Defaults: one Pythia-160M micro-batch (16 x 2048 positions, d = 768, the padded 50,304-token vocabulary), bf16 on a
GPU, float32 on the CPU. Each way runs ``--repeats`` timed forward+backward passes after one warm-up (synchronised
wall time, the median reported), then one more under torch.profiler to count the kernels it launches. The
loss and both gradients of every way are compared with the plain one (max abs difference).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neox_dar.loss import chunk_rows, linear_cross_entropy_sum  # noqa: E402
from neox_dar.provenance import device_name, device_report, provenance, synchronize, write_result  # noqa: E402


def plain(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(h, w).float(), y, reduction="sum")


def run(fn, h, w, y, repeats: int) -> dict:
    """Median seconds of ``fn`` forward+backward, its kernel launches, the loss and gradients."""
    device = h.device

    def once():
        h.grad = w.grad = None
        loss = fn(h, w, y)
        loss.backward()
        return loss

    once()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        loss = once()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        once()
        synchronize(device)
    if cuda:
        launches = sum(1 for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA)
    else:
        launches = sum(1 for ev in prof.events() if ev.name.startswith("aten::"))
    return {"seconds": statistics.median(times), "all_seconds": times, "launches": launches,
            "loss": loss.item(), "grad_hidden": h.grad.clone(), "grad_weight": w.grad.clone()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--positions", type=int, default=16 * 2048)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="default: bfloat16 on a GPU, float32 on the CPU")
    p.add_argument("--rows", type=int, nargs="+", default=None,
                   help="chunked: positions per chunk to time (default: the CPU's default chunk and 2048)")
    p.add_argument("--fused-rows", type=int, nargs="*", default=None,
                   help="fused (CUDA only): positions per chunk (default: the fused default chunk, 2048 and 8192)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-plain", action="store_true", help="leave out the plain (full logits) way")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    gen = torch.Generator().manual_seed(0)
    h = (torch.randn(args.positions, args.hidden, generator=gen)).to(device, dtype).requires_grad_()
    w = (torch.randn(args.vocab, args.hidden, generator=gen) * 0.02).to(device, dtype).requires_grad_()
    y = torch.randint(0, args.vocab, (args.positions,), generator=gen).to(device)
    def way(rows: int, fused: bool):
        return lambda h, w, y: linear_cross_entropy_sum(h, w, y, rows=rows, fused=fused)

    ways = {f"chunked rows={r}": way(r, False) for r in (args.rows or [chunk_rows(args.vocab), 2048])}
    if device.type == "cuda":
        default = chunk_rows(args.vocab, fused=True, itemsize=h.element_size())
        for r in (args.fused_rows if args.fused_rows is not None else [default, 2048, 8192]):
            ways[f"fused rows={r}"] = way(r, True)
    if not args.no_plain:
        ways = {"plain": plain, **ways}
    results, ref = {}, None
    for name, fn in ways.items():
        r = run(fn, h, w, y, args.repeats)
        ref = ref or r
        results[name] = {"seconds": r["seconds"], "all_seconds": r["all_seconds"], "launches": r["launches"],
                         "loss": r["loss"], "loss_diff": abs(r["loss"] - ref["loss"]),
                         "grad_hidden_max_diff": (r["grad_hidden"].float() - ref["grad_hidden"].float()).abs().max().item(),
                         "grad_weight_max_diff": (r["grad_weight"].float() - ref["grad_weight"].float()).abs().max().item()}
        print(f"{name:24s} {r['seconds'] * 1e3:9.2f} ms  {r['launches']:6d} launches  loss {r['loss']:.6g}")
    out = {**provenance(["bench/loss_speed.py", *(sys.argv[1:] if argv is None else argv)]), **device_report(),
           "device": device_name(device), "dtype": str(dtype).removeprefix("torch."),
           "shape": {"positions": args.positions, "hidden": args.hidden, "vocab": args.vocab},
           "reference": next(iter(ways)), "ways": results}
    tag = "cuda" if device.type == "cuda" else "cpu"
    write_result(out, args.out or ROOT / "bench" / "results" / f"loss_speed_{tag}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
