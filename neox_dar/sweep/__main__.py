"""Command line of the sweep tool.

    python -m neox_dar.sweep SWEEP.yml plan [--out DIR] [--world-size N] [--max-epochs E] [key=value ...]
                                           # list and check runs, write their configs, print what they cost
    python -m neox_dar.sweep SWEEP.yml run --local [--nproc N]             # train (and evaluate) runs one by one here
    python -m neox_dar.sweep SWEEP.yml submit [--dry-run] [--nodes 2 --gpus-per-node 8 --time 12:00:00 ...]
    python -m neox_dar.sweep SWEEP.yml status                              # each run's state, progress, jobs
    python -m neox_dar.sweep SWEEP.yml cancel                              # stop the sweep's SLURM jobs

SWEEP may also be a sweep's output directory (it holds a copy of the sweep file). The default output
directory is runs/<sweep name>. ``key=value`` words (plan, run, submit) override a config key in every run
(``data_path=/data/pile``); they are recorded in the output directory's copy of the sweep and reused by later
commands, which say so. Every run is checked as it will train (its world size, its data files) before anything is
written or queued; a micro-batch from the config files that does not fit the world size is replaced by one that does
(:func:`neox_dar.sweep.cost.fit_micro_batches`). `submit` and `run` skip runs that are done, resume runs that have a
checkpoint (the trainer continues from its run directory), train further runs whose ``train_iters`` was raised,
evaluate again runs trained past their evaluation, and `submit` skips runs already queued.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from .cost import budget_warnings, cost_columns, fit_micro_batches
from .errors import SweepError
from .local import run_local
from ..rundir import METRICS, RunFileError
from .planning import check_owner, check_report_settings, check_runs, plan, plan_row, write_plan
from .rundir import run_state
from .slurm import SlurmSettings, cancel_jobs, extra_corpora, queued_jobs, submit_runs
from .spec import SWEEP_COPY, load_sweep, override_key, with_overrides
from ..notices import one_line_notices


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
        flag, helptext = f"--{f.name.replace('_', '-')}", f.metadata.get("help", "").replace("%", "%%")  # argparse
        if f.name == "env":
            continue  # a mapping: the sweep file's slurm: env
        if f.name in ("extra_sbatch", "setup"):
            g.add_argument(flag, action="append", dest=f.name, default=None, help=helptext)
            continue
        if f.name == "exclusive":
            g.add_argument(flag, action="store_true", dest=f.name, default=None, help=helptext)
            continue
        kind = int if f.name in ("nodes", "gpus_per_node", "nproc_per_node", "cpus_per_task", "concurrency",
                                 "signal_seconds", "max_requeues", "master_port_base", "nccl_ib_disable",
                                 "nccl_ib_timeout") else str
        g.add_argument(flag, type=kind, dest=f.name, default=None, help=helptext,
                       choices=("array", "per-run") if f.name == "mode" else None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m neox_dar.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", help="sweep YAML file, or a sweep output directory")
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (("plan", "list and check the runs and write their resolved configs"),
                           ("run", "train the runs one after another on this machine"),
                           ("submit", "submit the runs to SLURM"),
                           ("status", "show each run's state from its run directory and the SLURM queue"),
                           ("cancel", "stop the sweep's live SLURM jobs (running ones checkpoint first)")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--out", help="output directory (default: runs/<sweep name>, or SWEEP if it is a directory)")
        s.add_argument("--only", nargs="+", metavar="RUN", help="restrict to these runs")
        if name in ("plan", "run", "submit"):
            s.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                           help="config keys for every run (e.g. data_path=/data/pile), recorded in the output "
                                "directory and reused by later commands")
            s.add_argument("--force", action="store_true",
                           help="rewrite configs of runs that have checkpoints (e.g. a raised train_iters extends "
                                "finished runs), or replace another sweep's copy in the output directory")
        if name == "plan":
            s.add_argument("--world-size", type=int, default=None,
                           help="check the runs for this many data-parallel ranks (default: the sweep's slurm: "
                                "nodes x processes per node when it has a slurm: mapping, else 1)")
            s.add_argument("--max-epochs", type=float, default=None,
                           help="warn only when a run reads its training data more often than this (default: the "
                                "sweep file's max_epochs, else 1)")
        if name == "run":
            s.add_argument("--local", action="store_true", required=True, help="run here (the only mode of `run`)")
            s.add_argument("--nproc", type=int, default=1, help="processes per run (torchrun --standalone when > 1)")
            s.add_argument("--keep-going", action="store_true", help="continue with the next run after a failure")
        if name == "submit":
            s.add_argument("--dry-run", action="store_true", help="write the job scripts, submit nothing")
            _slurm_args(s)
    return p


def _with_recorded_overrides(sweep, root: Path, given: list[str], command: str):
    """The sweep with the overrides its output directory recorded (by an earlier plan, run or submit), then the
    command line's ``given`` ones. The recorded ones this command reuses (those ``given`` does not replace) are
    announced on stderr: a `submit` after a `run --local key=value` trains with that value too. With the output
    directory's own copy as SWEEP they are the sweep's own ``overrides:``, announced the same way."""
    copy = root / SWEEP_COPY
    if not copy.is_file():
        return with_overrides(sweep, given)
    recorded = sweep if sweep.path is not None and sweep.path.resolve() == copy.resolve() else load_sweep(copy)
    if recorded.name != sweep.name or not recorded.overrides:
        return with_overrides(sweep, given)
    replaced = {override_key(g) for g in given}
    reused = [o for o in recorded.overrides if override_key(o) not in replaced]
    if reused:
        print(f"{command}: reusing the overrides recorded in {copy} by an earlier command: {' '.join(reused)} "
              "(key=value replaces one)", file=sys.stderr)
    return with_overrides(with_overrides(sweep, recorded.overrides), given)


def main(argv: list[str] | None = None) -> int:
    one_line_notices()  # this package's warnings as `warning: ...`, one line
    args = build_parser().parse_args(argv)
    if args.only and "overrides" in args:  # `--only a b key=value`: run names never hold '=', so these are overrides
        args.overrides += [o for o in args.only if "=" in o]
        args.only = [o for o in args.only if "=" not in o]
    hint = ""  # appended to an error of `run` or `submit` in a directory never planned
    try:
        if getattr(args, "max_epochs", None) is not None and not args.max_epochs > 0:
            raise SweepError(f"--max-epochs must be > 0, got {args.max_epochs:g}")
        for flag in ("world_size", "nproc"):
            if getattr(args, flag, None) is not None and getattr(args, flag) < 1:
                raise SweepError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
        sweep = load_sweep(args.sweep)
        root = Path(args.out or (args.sweep if Path(args.sweep, SWEEP_COPY).is_file() else sweep.default_out()))
        root = root.resolve()
        if not (args.command == "plan" and args.force):
            check_owner(sweep, root)
        planned_here = (root / SWEEP_COPY).is_file()
        if args.command in ("status", "cancel") and not planned_here:
            raise SweepError(f"{root} holds no plan of sweep '{sweep.name}' (no {SWEEP_COPY} there): plan, run or "
                             "submit it first, or pass the output directory it was planned in (--out DIR, or DIR "
                             "as SWEEP)")
        if args.command in ("plan", "run", "submit"):
            sweep = _with_recorded_overrides(sweep, root, args.overrides, args.command)
        if args.command in ("run", "submit") and not planned_here and args.out is None:
            hint = (f" ({root}, the default output directory, holds no plan of this sweep: the key=value overrides "
                    "an earlier `plan --out DIR` recorded are reused with that --out DIR)")
        planned = plan(sweep, root)
        check_report_settings(sweep, planned)
        if args.only:
            unknown = set(args.only) - {p.spec.name for p in planned}
            if unknown:
                raise SweepError(f"--only names unknown run(s): {', '.join(sorted(unknown))}")
            planned = [p for p in planned if p.spec.name in args.only]
        if args.command == "status":
            return _status(planned, sweep)
        if args.command == "cancel":
            return _cancel(planned)
        settings = None
        if args.command == "plan":
            world = args.world_size
            if world is None:
                world = SlurmSettings.from_dict(sweep.slurm).world_size if sweep.slurm else 1
        elif args.command == "run":
            world = args.nproc
        else:
            settings = _settings(sweep, args)
            world = settings.world_size
        for note in fit_micro_batches(planned, world, sweep.overrides):
            print(f"note: {note}", file=sys.stderr)
        check_runs(planned, world, here=args.command == "run")
        hint = ""  # the runs are checked: what fails from here is not the plan
        write_plan(sweep, planned, force=args.force)
        if args.command == "plan":
            return _plan(planned, sweep, root, world, args)
        if args.command == "run":
            return _run_local(planned, sweep, args)
        return _submit(planned, sweep, root, settings, args)
    except (SweepError, RunFileError) as e:
        print(f"sweep error: {e}{hint}", file=sys.stderr)
        return 2


def _plan(planned, sweep, root: Path, world: int, args) -> int:
    """Print the warnings, the plan with its cost columns (:mod:`neox_dar.sweep.cost`) and what the costs rest on."""
    max_epochs = args.max_epochs if args.max_epochs is not None else sweep.max_epochs
    rows, used, unmeasured = [], {}, []
    for p in planned:
        for w in p.warnings + budget_warnings(p.cfg, world, max_epochs):
            print(f"warning: {p.spec.name}: {w}", file=sys.stderr)
        row = plan_row(p, world)
        epochs = row.pop("epochs")
        costs, found = cost_columns(p, world)
        rows.append({**row, **costs, "epochs": epochs})  # the epochs last, where the warnings about them point
        if found is None:
            unmeasured.append(p.spec.name)
        else:
            used.setdefault(found.describe(), []).append(p.spec.name)
    print(f"sweep {sweep.name}: {len(planned)} runs -> {root} (checked for {world} rank(s) each)")
    print(format_rows(rows))
    # what the cost columns rest on: notes on stderr, so that stdout is the table alone
    for found, names in used.items():
        print(f"note: GPU-h and wall of {', '.join(names)}: tokens / the throughput measured in {found}",
              file=sys.stderr)
    if unmeasured:
        print(f"note: no measurement: {', '.join(unmeasured)} (no GPU result in bench/results/ has the model config, "
              "precision and torch_compile of these runs)", file=sys.stderr)
    print(f"note: wall = GPU-h / {world} rank(s), as if each GPU kept its measured one-GPU rate (communication "
          "between ranks, evaluations and restarts not counted); checkpoint: bytes on disk of one checkpoint (weights, "
          "fp32 master weights, Adam moments, fp32 model.safetensors); memory/rank: an estimate of the peak GPU "
          "memory (docs/cluster.md)", file=sys.stderr)
    return 0


def _age(path: Path) -> str:
    """How long ago ``path`` was last written (the trainer appends to metrics.jsonl every log step)."""
    if not path.is_file():
        return "-"
    s = max(0, int(time.time() - path.stat().st_mtime))
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def _state(run_dir: Path, sweep):
    """:func:`run_state` with the live SLURM states of the run's recorded jobs."""
    from ..rundir import job_ids

    return run_state(run_dir, want_eval=bool(sweep.eval), queue=queued_jobs(job_ids(run_dir)),
                     extra=list(extra_corpora(sweep.eval)))


def _eval_cell(st) -> str:
    if st.eval_step is None:
        return "no"
    return f"step {st.eval_step}" if st.evaluated else f"step {st.eval_step} (stale)"


def _status(planned, sweep) -> int:
    rows = []
    for p in planned:
        st = _state(p.run_dir, sweep)
        jobs = [f"{j} {s}" if s else j for j, s in st.jobs.items()][-3:]
        rows.append({
            "run": st.name, "state": st.state,
            "step": f"{st.step or 0}/{st.train_iters}" if st.train_iters else (st.step or "-"),
            "updated": _age(p.run_dir / METRICS),
            "loss": f"{st.loss:.4f}" if st.loss is not None else "-",
            "valid_loss": f"{st.valid_loss:.4f}" if st.valid_loss is not None else "-",
            "checkpoint": st.checkpoint if st.checkpoint is not None else "-",
            "eval": _eval_cell(st),
            "jobs": ", ".join(jobs) or "-",
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


def _cancel(planned) -> int:
    """Stop every live job of the runs; one line per job, then one summary line."""
    from ..rundir import job_ids

    live = {}
    idle = 0
    for p in planned:
        jobs = queued_jobs(job_ids(p.run_dir))
        live.update(jobs)
        idle += not jobs
    cancelled, stopped = cancel_jobs(live)
    for job in cancelled:
        print(f"{job}: cancelled (it had not started)")
    for job in stopped:
        print(f"{job}: asked to stop (TERM: the trainers checkpoint, the job ends without requeueing)")
    print(f"cancel: {len(cancelled)} waiting job(s) cancelled, {len(stopped)} running job(s) stopping; "
          f"{idle} of {len(planned)} run(s) had no live job")
    return 0


def _settings(sweep, args) -> SlurmSettings:
    """The sweep's ``slurm:`` settings with the command line's on top."""
    raw = dict(sweep.slurm)
    for f in dataclasses.fields(SlurmSettings):
        value = getattr(args, f.name, None)  # env has no option
        if value is not None:
            raw[f.name] = value
    return SlurmSettings.from_dict(raw)


def _submit(planned, sweep, root: Path, settings: SlurmSettings, args) -> int:
    todo = []
    for p in planned:
        st = _state(p.run_dir, sweep)
        live = {j: s for j, s in st.jobs.items() if s}
        if st.state == "done":
            print(f"{p.spec.name}: done, skipped")
        elif live:
            print(f"{p.spec.name}: already queued ({', '.join(f'{j} {s}' for j, s in live.items())}), skipped")
        elif st.holder is not None:
            print(f"{p.spec.name}: running here ({st.holder}), skipped")
        else:
            if st.trained:
                how = f"evaluates step {st.checkpoint}"
            elif st.checkpoint is not None:
                how = f"resumes from step {st.checkpoint}" + (f" to {st.train_iters}" if st.state == "extend" else "")
            else:
                how = "starts"
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
