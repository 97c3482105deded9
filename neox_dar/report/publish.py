"""Publishing a sweep's results into the repository: the run files every number rests on (no checkpoints), where and
how they were made, the report rebuilt from them, and a document's table regenerated from that report.

    python -m neox_dar.report.publish RUNS_DIR OUT [--sweep SWEEP.yml] [--command CMD] [--docs DOC.md --marker NAME]
                                      [--only RUN ...]

``RUNS_DIR`` is a sweep's output directory. ``OUT`` receives ``runs/<run>/`` (``config.yml``, ``run.json``,
``status.json``, ``metrics.jsonl``, ``eval/*.json``) and ``runs/sweep.yml`` (``--sweep``: a newer copy of the sweep
file, for its report settings; the runs' configs stay as trained), ``provenance.json`` (the machine, the date, the
command that produced the runs, each run's training code version from its newest checkpoint, and the code version
that published them) and ``report/`` (``python -m neox_dar.report OUT/runs``: tables and figures). With ``--docs``,
the Markdown table between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` in ``DOC.md`` is replaced by the
report's, so the document never holds a typed number (a test compares them). ``--only RUN ...`` adds or replaces
just those runs in an existing ``OUT`` (a run trained later than the others): the other runs' files and provenance
records stay, and each replaced run's record keeps the ``--command`` that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
from pathlib import Path

from ..provenance import provenance
from ..rundir import (CONFIG, EVAL_DIR, METRICS, RUN_META, STATUS, RunFileError, newest_checkpoint, read_state,
                      write_text_atomic)
from ..sweep.spec import SWEEP_COPY, SweepError

RUN_FILES = (CONFIG, RUN_META, STATUS, METRICS)
PROVENANCE = "provenance.json"


def cpu_name() -> str:
    """This machine's CPU model and the cores this process may use."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {len(os.sched_getaffinity(0))} cores (CPU only)"


def copy_runs(src: Path, out: Path, sweep_file: Path | None, only: list[str] | None = None) -> dict[str, dict]:
    """The run files of every run under ``src`` (``only``: of those runs, beside the ones ``out/runs`` holds) into
    ``out/runs``; returns each copied run's record for the provenance (its state, step and the code version its
    newest checkpoint was trained with)."""
    runs = out / "runs"
    names = sorted(d.name for d in src.iterdir() if (d / CONFIG).is_file()) if src.is_dir() else []
    if only is not None:
        missing = [n for n in only if n not in names]
        if missing:
            raise SweepError(f"--only: no run {', '.join(missing)} under {src} (runs there: {', '.join(names)})")
        if not (runs / SWEEP_COPY).is_file():
            raise SweepError(f"--only adds runs to a published folder: {runs / SWEEP_COPY} not found")
        names = list(only)
    elif runs.exists():
        shutil.rmtree(runs)
    runs.mkdir(parents=True, exist_ok=True)
    copy = sweep_file or (src / SWEEP_COPY if only is None else None)
    if copy is not None:
        if not copy.is_file():
            raise SweepError(f"{copy} not found: RUNS_DIR must be a sweep's output directory (or pass --sweep)")
        shutil.copyfile(copy, runs / SWEEP_COPY)
    records = {}
    for name in names:
        run, dest = src / name, runs / name
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir()
        for file in RUN_FILES:
            if (run / file).is_file():
                shutil.copyfile(run / file, dest / file)
        if (run / EVAL_DIR).is_dir():
            shutil.copytree(run / EVAL_DIR, dest / EVAL_DIR)
        ckpt = newest_checkpoint(run)
        state = read_state(ckpt) if ckpt is not None else {}
        status = json.loads((run / STATUS).read_text()) if (run / STATUS).is_file() else {}
        records[name] = {"state": status.get("state"), "step": state.get("step"),
                         "trained_with": state.get("code_version"), "saved_at": state.get("saved_at")}
    if not records:
        raise SweepError(f"no runs under {src}: expected <run>/config.yml directories")
    return records


def replace_block(doc: Path, marker: str, text: str) -> None:
    """Replace what stands between ``<!-- marker:start -->`` and ``<!-- marker:end -->`` in ``doc`` with ``text``."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    body = doc.read_text()
    if body.count(start) != 1 or body.count(end) != 1 or body.index(start) > body.index(end):
        raise SweepError(f"{doc} must hold '{start}' once, then '{end}' once")
    head, rest = body.split(start)
    _, tail = rest.split(end)
    write_text_atomic(doc, f"{head}{start}\n{text.rstrip()}\n{end}{tail}")


def block(doc: Path, marker: str) -> str:
    """The text between the markers (what :func:`replace_block` wrote)."""
    body = doc.read_text()
    return body.split(f"<!-- {marker}:start -->\n", 1)[1].split(f"\n<!-- {marker}:end -->", 1)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m neox_dar.report.publish", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs_dir", type=Path, help="a sweep's output directory")
    p.add_argument("out", type=Path, help="the results folder to write (e.g. results/replicate-cpu)")
    p.add_argument("--sweep", type=Path, help="the sweep file whose report settings to use (default: the copy "
                                              "the runs were planned with)")
    p.add_argument("--command", default="", help="the command that produced the runs (recorded)")
    p.add_argument("--docs", type=Path, help="a Markdown document whose marked table to regenerate")
    p.add_argument("--marker", default=None, help="the block's name in --docs (default: OUT's folder name)")
    p.add_argument("--only", nargs="+", metavar="RUN", help="add or replace only these runs in an existing OUT, "
                                                            "keeping the others and their provenance")
    args = p.parse_args(argv)
    from .__main__ import main as report_main

    try:
        records = copy_runs(args.runs_dir, args.out, args.sweep, args.only)
        if args.only is None:
            meta = {"device": cpu_name(), "training_command": args.command, "runs": records}
        else:  # the other runs keep their records; the added ones say what produced them and where
            meta = json.loads((args.out / PROVENANCE).read_text())
            for record in records.values():
                record.update(command=args.command, device=cpu_name(), published=provenance())
            meta["runs"] = dict(sorted({**meta["runs"], **records}.items()))
        meta["published"] = provenance()
        write_text_atomic(args.out / PROVENANCE, json.dumps(meta, indent=1) + "\n")
        if report_main([str(args.out / "runs"), "--out", str(args.out / "report")]) != 0:
            return 2
        if args.docs is not None:
            replace_block(args.docs, args.marker or args.out.name, (args.out / "report" / "table.md").read_text())
            print(f"regenerated the {args.marker or args.out.name} table in {args.docs}")
    except (SweepError, RunFileError, OSError) as e:
        print(f"publish error: {e}", file=sys.stderr)
        return 2
    print(f"published {len(records)} runs to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
