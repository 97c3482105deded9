"""Command line of the sweep tool.

    python -m neox_dar.sweep SWEEP.yml plan [--out DIR]        # list runs, write DIR/<run>/config.yml
    python -m neox_dar.sweep SWEEP.yml run --local [--nproc N]  # train (and evaluate) runs one by one here
    python -m neox_dar.sweep SWEEP.yml submit [--dry-run] [--nodes 2 --gpus-per-node 8 --time 12:00:00 ...]
    python -m neox_dar.sweep SWEEP.yml status                   # pending / running / done / failed per run

SWEEP may also be a sweep's output directory (it holds a copy of the sweep file). The default output
directory is runs/<sweep name>. `submit` and `run` skip runs that are done, resume runs that have a
checkpoint (the trainer continues from its run directory), and `submit` skips runs already queued.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import time
from pathlib import Path

from .local import run_local
from ..rundir import METRICS, RunFileError
from .rundir import run_state
from .slurm import SlurmSettings, queued_jobs, submit_runs
from .spec import SWEEP_COPY, SweepError, plan_row, load_sweep, plan, write_plan


def format_rows(rows: list[dict]) -> str:
    """Rows of equal keys as aligned plain-text columns."""
    if not rows:
        return ""
    keys = list(rows[0])
    cells = [[str(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _slurm_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("SLURM settings (override the sweep file's slurm: mapping)")
    for f in dataclasses.fields(SlurmSettings):
        flag, helptext = f"--{f.name.replace('_', '-')}", f.metadata.get("help")
        if f.name in ("extra_sbatch", "setup"):
            g.add_argument(flag, action="append", dest=f.name, default=None, help=helptext)
            continue
        kind = int if f.name in ("nodes", "gpus_per_node", "nproc_per_node", "cpus_per_task", "concurrency",
                                 "signal_seconds", "max_requeues") else str
        g.add_argument(flag, type=kind, dest=f.name, default=None, help=helptext,
                       choices=("array", "per-run") if f.name == "mode" else None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m neox_dar.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", help="sweep YAML file, or a sweep output directory")
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (("plan", "list the runs and write their resolved configs"),
                           ("run", "train the runs one after another on this machine"),
                           ("submit", "submit the runs to SLURM"),
                           ("status", "show each run's state from its run directory")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--out", help="output directory (default: runs/<sweep name>, or SWEEP if it is a directory)")
        s.add_argument("--only", nargs="+", metavar="RUN", help="restrict to these runs")
        if name in ("plan", "run", "submit"):
            s.add_argument("--force", action="store_true", help="overwrite configs of runs that have checkpoints")
        if name == "run":
            s.add_argument("--local", action="store_true", required=True, help="run here (the only mode of `run`)")
            s.add_argument("--nproc", type=int, default=1, help="processes per run (torchrun --standalone when > 1)")
            s.add_argument("--keep-going", action="store_true", help="continue with the next run after a failure")
        if name == "submit":
            s.add_argument("--dry-run", action="store_true", help="write the job scripts, submit nothing")
            _slurm_args(s)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        sweep = load_sweep(args.sweep)
        out = args.out or (args.sweep if Path(args.sweep, SWEEP_COPY).is_file() else None)
        planned = plan(sweep, out)
        if args.only:
            unknown = set(args.only) - {p.spec.name for p in planned}
            if unknown:
                raise SweepError(f"--only names unknown run(s): {', '.join(sorted(unknown))}")
            planned = [p for p in planned if p.spec.name in args.only]
        root = planned[0].run_dir.parent
        if args.command == "status":
            return _status(planned, sweep)
        write_plan(sweep, planned, force=args.force)
        if args.command == "plan":
            for p in planned:
                for w in p.warnings:
                    print(f"warning: {p.spec.name}: {w}", file=sys.stderr)
            print(f"sweep {sweep.name}: {len(planned)} runs -> {root}")
            print(format_rows([plan_row(p) for p in planned]))
            return 0
        if args.command == "run":
            return _run_local(planned, sweep, args)
        return _submit(planned, sweep, root, args)
    except (SweepError, RunFileError) as e:
        print(f"sweep error: {e}", file=sys.stderr)
        return 2


def _age(path: Path) -> str:
    """How long ago ``path`` was last written (the trainer appends to metrics.jsonl every log step)."""
    if not path.is_file():
        return "-"
    s = max(0, int(time.time() - path.stat().st_mtime))
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def _status(planned, sweep) -> int:
    rows = []
    for p in planned:
        st = run_state(p.run_dir, want_eval=bool(sweep.eval))
        state = st.state
        if state == "running" and st.jobs and shutil.which("squeue") and not queued_jobs(st.jobs):
            state = "stale"  # status.json says running but none of its SLURM jobs is alive
        rows.append({
            "run": st.name, "state": state, "updated": _age(p.run_dir / METRICS),
            "step": f"{st.step}/{st.train_iters}" if st.step is not None and st.train_iters else (st.step or "-"),
            "loss": f"{st.loss:.4f}" if st.loss is not None else "-",
            "valid_loss": f"{st.valid_loss:.4f}" if st.valid_loss is not None else "-",
            "checkpoint": st.checkpoint if st.checkpoint is not None else "-",
            "eval": "yes" if st.evaluated else "no",
            "jobs": ",".join(st.jobs[-3:]) or "-",
        })
    print(format_rows(rows))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return 0


def _run_local(planned, sweep, args) -> int:
    failed = []
    for p in planned:
        rc = run_local(p.run_dir, sweep.eval, nproc=args.nproc)
        if rc == 3:
            print(f"[sweep] {p.spec.name}: stopped at a checkpoint; re-run the same command to continue")
            return 3
        if rc != 0:
            failed.append(p.spec.name)
            if not args.keep_going:
                break
    if failed:
        print(f"[sweep] failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _submit(planned, sweep, root: Path, args) -> int:
    raw = dict(sweep.slurm)
    for f in dataclasses.fields(SlurmSettings):
        value = getattr(args, f.name)
        if value is not None:
            raw[f.name] = value
    settings = SlurmSettings.from_dict(raw)
    todo = []
    for p in planned:
        st = run_state(p.run_dir, want_eval=bool(sweep.eval))
        live = queued_jobs(st.jobs)
        if st.state == "done":
            print(f"{p.spec.name}: done, skipped")
        elif live:
            print(f"{p.spec.name}: already queued ({', '.join(f'{j} {s}' for j, s in live.items())}), skipped")
        else:
            how = f"resumes from step {st.checkpoint}" if st.checkpoint is not None else "starts"
            print(f"{p.spec.name}: {st.state}, {how}")
            todo.append(p.run_dir)
    if not todo:
        print("nothing to submit")
        return 0
    for script, job in submit_runs(settings, sweep.name, todo, root, sweep.eval, dry_run=args.dry_run):
        print(f"{'wrote' if args.dry_run else 'submitted'} {script}" + ("" if args.dry_run else f" as job {job}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
