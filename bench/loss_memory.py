"""Peak memory and step time of the loss with and without the full-vocabulary float32 logits (issue 28, item 3).

    python bench/loss_memory.py configs/tiny.yml configs/attention/vanilla.yml --steps 10 --warmup 2 --repeats 2 \
        --out bench/results/loss_memory_cpu.json

Two ways to compute the same training loss on one micro-batch (``train_micro_batch_size_per_gpu`` x ``seq_length``
of random tokens) of the config's model, fp32 on the CPU, a plain PyTorch step (forward, loss, backward, AdamW):

* ``full``: what training did before: ``logits = model(x)`` (B, T, V), ``F.cross_entropy(logits.float(), y)``;
* ``chunked``: what it does now: ``model(x, y)`` (:mod:`neox_dar.loss`: chunks of the final hidden states through
  the output layer, fused with the cross-entropy and its gradient).

Each runs in a fresh process (``--repeats`` times, alternating, so a loaded machine slows both alike), first
``--warmup`` steps, then ``--steps`` timed steps and as many validation forwards (the loss under ``no_grad``).
Reported per phase: the peak resident memory of the process over those steps (Linux ``VmHWM``, reset through
``/proc/self/clear_refs`` just before them) and that peak above the resident memory just before them
(``step_peak_mb``: what the steps themselves add), minor page faults per step (``getrusage``), and the median wall
and process-CPU time per step. The losses of both ways at every step are compared (``max_loss_diff``).

The workers run with glibc's ``MALLOC_MMAP_THRESHOLD_`` fixed at 64 KiB (:data:`MALLOC_ENV`) and the allocator's
free pages returned before each measurement, so the resident memory follows what is allocated: with the default
(dynamic) threshold, freed tensors stay in the heap and later steps reuse them unseen, and the same run measured a
validation rise of 0 MB in one process and 122 MB in the next.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neox_dar.provenance import device_name, provenance, write_result  # noqa: E402

MODES = ("full", "chunked")


def _status_kb(field: str) -> int:
    """A ``VmHWM``/``VmRSS`` line of /proc/self/status, in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


# glibc: every allocation of 64 KiB or more mapped on its own and unmapped when freed (the default threshold grows
# with use, after which freed tensors stay in the heap and a later step reuses them unseen): the RSS then follows
# what is allocated, so a step's peak rise is what it holds at once
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 10)}


def _release_free_memory() -> bool:
    """Hand the C allocator's free pages back to the kernel (glibc ``malloc_trim(0)``); whether it could. Without
    it the RSS before a measurement may hold freed memory that the steps reuse unseen (a peak rise of 0, seen)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        return False
    return True


def _measure(step, count: int) -> dict:
    """Run ``step()`` ``count`` times: peak RSS over them (VmHWM reset first, after the allocator's free pages are
    returned), its rise over the RSS before them, minor faults per step, median wall and CPU seconds per step, and
    what the steps returned."""
    trimmed = _release_free_memory()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    rss_before = _status_kb("VmRSS")
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    wall, cpu, values = [], [], []
    for _ in range(count):
        w, c = time.perf_counter(), time.process_time()
        values.append(step())
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    peak = _status_kb("VmHWM")
    return {"peak_rss_mb": round(peak / 1024, 1), "rss_before_mb": round(rss_before / 1024, 1),
            "step_peak_mb": round((peak - rss_before) / 1024, 1),
            "minor_faults_per_step": round((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / count),
            "wall_s": round(statistics.median(wall), 4), "cpu_s": round(statistics.median(cpu), 4),
            "malloc_trim": trimmed, "losses": values}


def worker(mode: str, args: argparse.Namespace) -> dict:
    """In a fresh process: one mode's warm-up, training steps and validation forwards."""
    import torch
    import torch.nn.functional as F

    from neox_dar.config import load_config
    from neox_dar.loss import IGNORE
    from neox_dar.model import build_model

    torch.set_num_threads(args.threads)
    cfg = load_config(*args.configs, overrides=args.overrides)
    torch.manual_seed(0)
    model = build_model(cfg.model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    B, T, V = cfg.training.train_micro_batch_size_per_gpu, cfg.model.seq_length, cfg.model.padded_vocab_size
    batches = [torch.randint(0, cfg.model.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(i))
               for i in range(args.warmup + args.steps)]
    position = iter(range(len(batches)))

    def loss_of(x, y):
        if mode == "chunked":
            return model(x, y)
        logits = model(x)
        return F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1), ignore_index=IGNORE)

    def train_step() -> float:
        tokens = batches[next(position)]
        loss = loss_of(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    def eval_step() -> float:
        tokens = batches[0]
        with torch.no_grad():
            return loss_of(tokens[:, :-1], tokens[:, 1:]).item()

    for _ in range(args.warmup):
        train_step()
    train = _measure(train_step, args.steps)
    model.eval()
    evaluation = _measure(eval_step, args.steps)
    return {"mode": mode, "train": train, "eval": evaluation,
            "logits_fp32_mb": round(B * T * V * 4 / 2**20, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("args", nargs="+", help="config files and key=value overrides")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="fresh processes per mode, alternating")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--out", default="bench/results/loss_memory_cpu.json")
    args = p.parse_args()
    args.configs = [a for a in args.args if "=" not in a]
    args.overrides = [a for a in args.args if "=" in a]
    if args.steps < 1 or args.warmup < 0 or args.repeats < 1:
        p.error("--steps and --repeats must be >= 1 and --warmup >= 0")
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return
    load_before = [round(x, 2) for x in os.getloadavg()]

    import torch

    from neox_dar.config import load_config

    cfg = load_config(*args.configs, overrides=args.overrides)
    runs = []
    command = [sys.executable, str(Path(__file__).resolve()), *args.args, "--steps", str(args.steps), "--warmup",
               str(args.warmup), "--threads", str(args.threads)]
    for _ in range(args.repeats):
        for mode in MODES:
            res = subprocess.run([*command, "--worker", mode], cwd=ROOT, capture_output=True, text=True,
                                 env={**os.environ, "OMP_NUM_THREADS": str(args.threads), **MALLOC_ENV})
            if res.returncode != 0:
                sys.exit(f"the {mode} worker failed:\n{res.stderr[-3000:]}")
            runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"{mode}: train peak +{runs[-1]['train']['step_peak_mb']} MB, {runs[-1]['train']['cpu_s']} s CPU/step",
                  flush=True)

    def summary(mode: str, phase: str) -> dict:
        rows = [r[phase] for r in runs if r["mode"] == mode]
        return {key: round(statistics.median(r[key] for r in rows), 4)
                for key in ("peak_rss_mb", "step_peak_mb", "minor_faults_per_step", "wall_s", "cpu_s")}

    table = {mode: {phase: summary(mode, phase) for phase in ("train", "eval")} for mode in MODES}
    full, chunked = ([r for r in runs if r["mode"] == m] for m in MODES)
    loss_diff = max(abs(a - b) for f, c in zip(full, chunked) for phase in ("train", "eval")
                    for a, b in zip(f[phase]["losses"], c[phase]["losses"]))
    ratios = {phase: {"step_peak_full_over_chunked": round(table["full"][phase]["step_peak_mb"]
                                                           / max(table["chunked"][phase]["step_peak_mb"], 0.1), 2),
                      "cpu_time_chunked_over_full": round(table["chunked"][phase]["cpu_s"]
                                                          / table["full"][phase]["cpu_s"], 3)}
              for phase in ("train", "eval")}
    report = {
        "provenance": provenance(),
        "device": device_name(torch.device("cpu")).replace(f"({torch.get_num_threads()} threads)",
                                                             f"({args.threads} threads)"),
        "torch": torch.__version__,
        "config": {"micro_batch": cfg.training.train_micro_batch_size_per_gpu, "seq_length": cfg.model.seq_length,
                   "vocab": cfg.model.padded_vocab_size, "hidden_size": cfg.model.hidden_size,
                   "num_layers": cfg.model.num_layers, "dtype": "float32"},
        "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "threads": args.threads,
        "memory_measure": "Linux VmHWM of the process over the measured steps (reset via /proc/self/clear_refs "
                          "before them); step_peak_mb = that peak minus VmRSS just before them",
        "time_measure": "median per step of wall clock and of process CPU time (time.process_time)",
        "load_average": {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]},
        "summary": table, "ratios": ratios, "max_loss_diff": loss_diff,
        "logits_fp32_mb": runs[0]["logits_fp32_mb"], "runs": runs,
    }
    print(json.dumps({"summary": table, "ratios": ratios, "max_loss_diff": loss_diff}, indent=1))
    write_result(report, ROOT / args.out if not Path(args.out).is_absolute() else args.out)


if __name__ == "__main__":
    main()
