"""Where a training step's time goes: torch.profiler over train.py's DeepSpeed engine (1 rank, random tokens).

    python bench/profile_step.py configs/tiny.yml configs/attention/vanilla.yml [key=value ...]
        [--steps 2] [--warmup 2] [--top 25] [--aha-mu-f F] [--out bench/results/x.json]

After ``--warmup`` optimizer steps, ``--steps`` are profiled (CPU and CUDA activities). Reported per optimizer
step: the wall time, the device time of all kernels (on CUDA, GPU kernels; on CPU, the top-level operators' CPU
time), the kernel launches, the device-busy fraction (kernel time / wall: well below 1 means the host, not the GPU,
sets the pace), the time per category (matrix products, attention, the loss, optimizer, element-wise, other; from
the kernel and operator names, see :data:`CATEGORIES`) and the ``--top`` kernels by time with their counts.
``--aha-mu-f F`` opens about that share of AHA's gates, as ``bench/train_throughput.py`` does. Writes JSON with
provenance (see ``bench/train_throughput.py``) to ``--out``.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.train_throughput import ATTENTION_KERNEL, add_aha_mu_f, aha_share, bench_config, engine_step  # noqa: E402
from neox_dar.provenance import device_name, device_report, provenance, synchronize, write_result  # noqa: E402

# (category, regular expression on the kernel's or operator's name); the first match wins
CATEGORIES = (
    ("attention", ATTENTION_KERNEL.pattern),
    ("loss", r"cross_entropy|log_softmax|nll|_lce|logsumexp"),
    ("optimizer", r"adam|multi_tensor|foreach|optim"),
    ("matmul", r"gemm|cutlass|sm90|xmma|nvjet|cublas|addmm|^aten::mm$|^aten::bmm$|linear"),
    ("communication", r"nccl|gloo|all_reduce|allreduce"),
    ("elementwise", r"elementwise|vectorized|reduce|softmax|norm|gelu|copy|fill|cat|index|where|mul|add"),
)


def category(name: str) -> str:
    low = name.lower()
    for cat, pattern in CATEGORIES:
        if re.search(pattern, low):
            return cat
    return "other"


def profile(cfg, steps: int, warmup: int, top: int, aha_mu_f: float | None = None) -> dict:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    info, step, grad_accum, micro, _, model = engine_step(cfg, aha_mu_f)
    for _ in range(warmup):
        step()
    synchronize(info.device)
    cuda = info.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(info.device)
        wall = (time.perf_counter() - t0) / steps
    kernels = {}
    if cuda:  # GPU kernels: the device-side events
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                k = kernels.setdefault(ev.name, [0, 0.0])
                k[0] += 1
                k[1] += ev.time_range.elapsed_us()
    else:  # CPU: top-level operators' own CPU time (no double counting of nested calls)
        for ev in prof.key_averages():
            k = kernels.setdefault(ev.key, [0, 0.0])
            k[0] += ev.count
            k[1] += ev.self_cpu_time_total
    per_step = {name: (n / steps, us / steps / 1e3) for name, (n, us) in kernels.items()}
    busy_ms = sum(ms for _, ms in per_step.values())
    cats: dict[str, float] = {}
    for name, (_, ms) in per_step.items():
        cats[category(name)] = cats.get(category(name), 0.0) + ms
    ranked = sorted(per_step.items(), key=lambda kv: -kv[1][1])
    tokens_per_step = grad_accum * micro * cfg.model.seq_length
    routed = {"aha_mu_f": aha_share(model, aha_mu_f)} if aha_mu_f is not None else {}
    return {**routed, "step_wall_ms": wall * 1e3, "tokens_per_step": tokens_per_step,
            "tokens_per_sec": tokens_per_step / wall,
            "kernel_ms": busy_ms, "busy_fraction": busy_ms / (wall * 1e3),
            "launches": sum(n for n, _ in per_step.values()),
            "categories_ms": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
            "top": [{"name": name[:160], "per_step": n, "ms": ms, "category": category(name)}
                    for name, (n, ms) in ranked[:top]],
            "kernel_time": "GPU kernel time" if cuda else "operators' own CPU time"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="+", help="YAML files and key=value overrides, as for train.py")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--top", type=int, default=25)
    add_aha_mu_f(p)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    cfg = bench_config(args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = {**provenance(["bench/profile_step.py", *(sys.argv[1:] if argv is None else argv)]),
              **device_report(), "device": device_name(device), "precision": cfg.training.dtype,
              "config": {"num_layers": cfg.model.num_layers, "hidden_size": cfg.model.hidden_size,
                         "seq_length": cfg.model.seq_length, "attention_type": cfg.model.attention.attention_type,
                         "attention_impl": cfg.model.attention.attention_impl,
                         "torch_compile": cfg.training.torch_compile,
                         "micro_batch": cfg.training.train_micro_batch_size_per_gpu,
                         "train_batch_size": cfg.training.train_batch_size}}
    result["profile"] = r = profile(cfg, args.steps, args.warmup, args.top, args.aha_mu_f)
    print(f"{result['device']}: {r['step_wall_ms']:.1f} ms per step ({r['tokens_per_sec']:,.0f} tokens/s), "
          f"{r['kernel_ms']:.1f} ms of {r['kernel_time']} ({100 * r['busy_fraction']:.0f}% busy), "
          f"{r['launches']:.0f} launches")
    print("  " + ", ".join(f"{c} {ms:.1f} ms" for c, ms in r["categories_ms"].items()))
    for k in r["top"]:
        print(f"  {k['ms']:8.2f} ms {k['per_step']:6.0f}x  [{k['category']}] {k['name'][:110]}")
    tag = "cuda" if device.type == "cuda" else "cpu"
    write_result(result, args.out or ROOT / "bench" / "results" / f"profile_step_{tag}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
