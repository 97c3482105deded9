"""One token budget for every run of a sweep that must fit in fixed-length commands (scripts/replicate.sh): from
throughput measured on the machine, the runs each command trains and its time limit.

    python -m neox_dar.sweep.budget MEASURE_DIR --runs-per-part 3 5 5 --part-seconds 510 --setup-seconds S \\
        --measure-seconds M --eval-seconds E --out budget.json

MEASURE_DIR holds one short training run per variant (``train.py`` of the run's config into
``MEASURE_DIR/<variant>``, with ``log_interval`` steps per metrics row) and its ``wall_seconds`` file (the
command's wall time). Per variant: tokens/s = the median of the metrics rows' ``tokens_per_sec`` after the first
(warm-up: kernel compilation, allocator); start-up = wall time - logged steps / steps per second. Then

    overhead  = max start-up + eval_seconds                          (per run)
    available = part_seconds - setup_seconds (- measure_seconds in part 1)
    seconds   = min over parts p of (available_p - runs_p * overhead) / runs_p
    train_iters = floor(safety * seconds * min tokens/s / (train_batch_size * seq_length))

so the slowest variant still ends inside every part, and every run trains the same number of tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from ..config import load_config
from ..rundir import CONFIG, read_metrics

WALL = "wall_seconds"


def measured(run_dir: Path) -> dict:
    """tokens/s and start-up seconds of one short measured run (module docstring)."""
    rows = [r for r in read_metrics(run_dir) if "tokens_per_sec" in r]
    if len(rows) < 2:
        raise ValueError(f"{run_dir}: fewer than two metrics rows with tokens_per_sec (train longer, or log more "
                         "often)")
    cfg = load_config(run_dir / CONFIG)
    tokens_per_step = cfg.training.train_batch_size * cfg.model.seq_length
    tps = statistics.median(r["tokens_per_sec"] for r in rows[1:])
    wall = float((run_dir / WALL).read_text())
    steps = rows[-1]["step"]
    return {"tokens_per_sec": tps, "startup_seconds": max(0.0, wall - steps * tokens_per_step / tps),
            "wall_seconds": wall, "steps": steps, "tokens_per_step": tokens_per_step}


def budget(measure_dir: Path, runs_per_part: list[int], part_seconds: float, setup_seconds: float,
           measure_seconds: float, eval_seconds: float, safety: float = 0.9, max_iters: int | None = None) -> dict:
    """The budget (module docstring) with every input and intermediate number; ``max_iters`` caps it (toy runs)."""
    variants = {d.name: measured(d) for d in sorted(measure_dir.iterdir()) if (d / WALL).is_file()}
    if not variants:
        raise ValueError(f"{measure_dir} holds no measured runs (<variant>/{WALL})")
    tps = min(v["tokens_per_sec"] for v in variants.values())
    tokens_per_step = {v["tokens_per_step"] for v in variants.values()}
    if len(tokens_per_step) != 1:
        raise ValueError(f"the measured runs differ in batch x seq_length: {sorted(tokens_per_step)}")
    overhead = max(v["startup_seconds"] for v in variants.values()) + eval_seconds
    available = [part_seconds - setup_seconds - (measure_seconds if p == 0 else 0.0)
                 for p in range(len(runs_per_part))]
    per_part = [(a - n * overhead) / n for a, n in zip(available, runs_per_part)]
    seconds = min(per_part)
    step_tokens = tokens_per_step.pop()
    fitted = math.floor(safety * seconds * tps / step_tokens)
    train_iters = min(fitted, max_iters) if max_iters is not None else fitted
    if train_iters < 1:
        raise ValueError(f"no time left to train: {seconds:.0f} s per run after {overhead:.0f} s of overhead per run "
                         f"(parts of {part_seconds:.0f} s running {runs_per_part} runs)")
    return {"train_iters": train_iters, "fitted_train_iters": fitted, "max_iters": max_iters,
            "tokens_per_run": train_iters * step_tokens, "tokens_per_step": step_tokens,
            "train_seconds_per_run": seconds, "tokens_per_sec": tps, "overhead_seconds_per_run": overhead,
            "available_seconds_per_part": available, "runs_per_part": runs_per_part, "part_seconds": part_seconds,
            "setup_seconds": setup_seconds, "measure_seconds": measure_seconds, "eval_seconds": eval_seconds,
            "safety": safety, "variants": variants,
            "formula": "train_iters = floor(safety * min_p((available_p - runs_p * overhead) / runs_p) * "
                       "min tokens/s / (train_batch_size * seq_length))"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m neox_dar.sweep.budget", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("measure_dir", type=Path)
    ap.add_argument("--runs-per-part", type=int, nargs="+", required=True)
    ap.add_argument("--part-seconds", type=float, required=True)
    ap.add_argument("--setup-seconds", type=float, required=True)
    ap.add_argument("--measure-seconds", type=float, required=True)
    ap.add_argument("--eval-seconds", type=float, required=True)
    ap.add_argument("--safety", type=float, default=0.9)
    ap.add_argument("--max-iters", type=int, default=None, help="cap train_iters (toy runs)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        b = budget(args.measure_dir, args.runs_per_part, args.part_seconds, args.setup_seconds, args.measure_seconds,
                   args.eval_seconds, args.safety, args.max_iters)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(b, indent=1) + "\n")
    print(f"budget: train_iters={b['train_iters']} ({b['tokens_per_run']:,} tokens per run) from "
          f"{b['tokens_per_sec']:,.0f} tokens/s (slowest variant), {b['train_seconds_per_run']:.0f} s of training "
          f"and {b['overhead_seconds_per_run']:.0f} s of start-up and evaluation per run -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
