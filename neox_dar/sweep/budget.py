"""Does a sweep's plan fit the machine? From throughput measured there (scripts/replicate.sh), how many
fixed-length commands ("parts") the plan's runs need, each part stopping at its deadline and the next one resuming.

    python -m neox_dar.sweep.budget MEASURE_DIR --train-iters 1526 --runs 8 --part-seconds 510 \\
        --setup-seconds S --measure-seconds M --eval-seconds E [--parts 3] --out budget.json

The plan is fixed (the sweep file's ``train_iters``, the same for every run, stated in the docs before any run):
this module checks it and says how it fits; it never changes the budget and never fails for lack of time (a plan
that needs more parts than ``--parts`` gets a note saying how many it needs).

MEASURE_DIR holds one short training run per variant (``train.py`` of the run's config into
``MEASURE_DIR/<variant>``, with ``log_interval`` steps per metrics row) and its ``wall_seconds`` file (the
command's wall time). Per variant: tokens/s = the median of the metrics rows' ``tokens_per_sec`` after the first
(warm-up: kernel compilation, allocator); start-up = wall time - logged steps / steps per second. Then, with the
slowest variant's tokens/s and the largest start-up,

    train_seconds = train_iters * train_batch_size * seq_length / (safety * tokens/s)     (per run)
    part p's time = part_seconds - setup_seconds (- measure_seconds in part 1)

and the runs are laid out in order over parts: a run (re)started in a part pays the start-up there, trains until
the part's time is spent (its checkpoint carries the rest to the next part) and pays ``eval_seconds`` once trained.
The number of parts used is ``parts_needed``; ``None`` when a part's time does not even cover one start-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ..config import load_config
from ..rundir import CONFIG, read_metrics, write_text_atomic

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


def lay_out(runs: int, train_seconds: float, startup: float, eval_seconds: float, first_part: float,
            later_part: float) -> tuple[int | None, list[int]]:
    """(parts used, the runs finished in each part) when ``runs`` runs of ``train_seconds`` each go through parts in
    order (module docstring): ``first_part`` usable seconds in the first part, ``later_part`` in each later one.
    ``None`` parts when a part makes no progress at all."""
    left = [train_seconds] * runs
    finished: list[int] = []
    while left:
        t = later_part if finished else first_part
        done, progress = 0, False
        while left and t > startup:
            t -= startup
            step = min(left[0], t)
            left[0] -= step
            t -= step
            progress = progress or step > 0
            if left[0] > 0:
                break  # the deadline: the run checkpoints and continues in the next part
            if t < eval_seconds:  # trained; its evaluation waits for the next part (a start-up there)
                break
            t -= eval_seconds
            left.pop(0)
            done += 1
            progress = True
        if not progress:
            return None, finished
        finished.append(done)
    return len(finished), finished


def check(measure_dir: Path, train_iters: int, runs: int, part_seconds: float, setup_seconds: float,
          measure_seconds: float, eval_seconds: float, parts: int | None = None, safety: float = 0.9) -> dict:
    """How the plan fits the measured machine (module docstring), with every input and intermediate number and a
    ``note`` that says it in words."""
    if train_iters < 1 or runs < 1:
        raise ValueError(f"the plan needs at least one run and one step (got {runs} runs of {train_iters} steps)")
    variants = {d.name: measured(d) for d in sorted(Path(measure_dir).iterdir()) if (d / WALL).is_file()}
    if not variants:
        raise ValueError(f"{measure_dir} holds no measured runs (<variant>/{WALL})")
    tokens_per_step = {v["tokens_per_step"] for v in variants.values()}
    if len(tokens_per_step) != 1:
        raise ValueError(f"the measured runs differ in batch x seq_length: {sorted(tokens_per_step)}")
    step_tokens = tokens_per_step.pop()
    tps = min(v["tokens_per_sec"] for v in variants.values())
    startup = max(v["startup_seconds"] for v in variants.values())
    train_seconds = train_iters * step_tokens / (safety * tps)
    first = part_seconds - setup_seconds - measure_seconds
    later = part_seconds - setup_seconds
    needed, per_part = lay_out(runs, train_seconds, startup, eval_seconds, first, later)
    total = runs * (startup + train_seconds + eval_seconds)
    head = (f"the plan ({runs} runs x {train_iters * step_tokens:,} tokens = {train_iters} steps of {step_tokens:,}) "
            f"at {tps:,.0f} tokens/s (slowest variant, x{safety} margin) is {train_seconds:,.0f} s of training and "
            f"{startup + eval_seconds:,.0f} s of start-up and evaluation per run")
    if needed is None:
        note = (f"{head}; a part of {part_seconds:.0f} s leaves {later:.0f} s after setup, not more than one "
                f"start-up ({startup:.0f} s): no part can train; raise PART_SECONDS")
    else:
        note = f"{head}: about {needed} part(s) of {part_seconds:.0f} s, finishing {per_part} run(s) each"
        if parts is not None:
            note += (f"; fits the {parts} part(s) planned" if needed <= parts else
                     f"; more than the {parts} part(s) planned: run the next part until it reports the runs done")
    return {"fits": needed is not None and (parts is None or needed <= parts), "parts_needed": needed,
            "parts_planned": parts, "runs_finished_per_part": per_part, "train_iters": train_iters, "runs": runs,
            "tokens_per_run": train_iters * step_tokens, "tokens_per_step": step_tokens,
            "train_seconds_per_run": train_seconds, "tokens_per_sec": tps, "startup_seconds": startup,
            "seconds_per_run": startup + train_seconds + eval_seconds, "total_seconds": total,
            "part_seconds": part_seconds, "setup_seconds": setup_seconds, "measure_seconds": measure_seconds,
            "eval_seconds": eval_seconds, "safety": safety, "variants": variants, "note": note,
            "formula": "train_seconds = train_iters * train_batch_size * seq_length / (safety * min tokens/s); runs "
                       "laid out in order over parts of part_seconds - setup_seconds (- measure_seconds in the "
                       "first), each (re)start paying the start-up and each trained run eval_seconds"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m neox_dar.sweep.budget", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("measure_dir", type=Path)
    ap.add_argument("--train-iters", type=int, required=True, help="the plan's steps per run")
    ap.add_argument("--runs", type=int, required=True, help="the plan's number of runs")
    ap.add_argument("--part-seconds", type=float, required=True)
    ap.add_argument("--setup-seconds", type=float, required=True)
    ap.add_argument("--measure-seconds", type=float, required=True)
    ap.add_argument("--eval-seconds", type=float, required=True)
    ap.add_argument("--parts", type=int, default=None, help="the parts planned (the note says whether it fits)")
    ap.add_argument("--safety", type=float, default=0.9)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        b = check(args.measure_dir, args.train_iters, args.runs, args.part_seconds, args.setup_seconds,
                  args.measure_seconds, args.eval_seconds, args.parts, args.safety)
        write_text_atomic(args.out, json.dumps(b, indent=1) + "\n")  # replicate.sh reads it at each part's start
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"budget: {b['note']} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
