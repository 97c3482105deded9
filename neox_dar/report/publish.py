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

Every argument is checked before anything is written (a one-line error, exit 2), and the new ``OUT`` is built in a
folder beside it (a copy of ``OUT``: files publish does not write stay) that replaces it once complete: a
mistyped argument, a failed report or Ctrl-C leaves an existing publication as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import sys
from pathlib import Path

from ..config.files import not_utf8
from ..provenance import provenance
from ..rundir import (CONFIG, EVAL_DIR, METRICS, RUN_META, STATUS, RunFileError, newest_checkpoint, read_json,
                      read_state, staged_dir, write_text_atomic)
from ..sweep.errors import SweepError
from ..sweep.spec import SWEEP_COPY

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


def run_names(src: Path) -> list[str]:
    """The runs under a sweep's output directory: its ``<run>/config.yml`` folders, sorted."""
    return sorted(d.name for d in src.iterdir() if (d / CONFIG).is_file()) if src.is_dir() else []


def check_inputs(args: argparse.Namespace) -> None:
    """SweepError (one line) for any argument publish cannot use, before anything is written: RUNS_DIR without runs
    or without the sweep file to copy, OUT a file or a folder that holds RUNS_DIR, an ``--only`` run that is not
    there or an OUT not published before, a ``--docs`` document without its markers."""
    src, out = args.runs_dir, args.out
    if not src.is_dir():
        raise SweepError(f"RUNS_DIR {src} is not a directory: name a sweep's output directory")
    names = run_names(src)
    if not names:
        raise SweepError(f"no runs under {src}: expected <run>/config.yml directories")
    copy = args.sweep or (src / SWEEP_COPY if args.only is None else None)
    if copy is not None and not copy.is_file():
        raise SweepError(f"{copy} not found: RUNS_DIR must be a sweep's output directory (or pass --sweep)")
    if out.exists() and not out.is_dir():
        raise SweepError(f"OUT {out} is a file: name a folder for the publication")
    if out.resolve() in (src.resolve(), *src.resolve().parents):
        raise SweepError(f"OUT {out} holds RUNS_DIR {src}: publish into another folder")
    if args.only is not None:
        if missing := [n for n in args.only if n not in names]:
            raise SweepError(f"--only: no run {', '.join(missing)} under {src} (runs there: {', '.join(names)})")
        for needed in (out / "runs" / SWEEP_COPY, out / PROVENANCE):
            if not needed.is_file():
                raise SweepError(f"--only adds runs to a published folder: {needed} not found")
        read_json(out / PROVENANCE)
    if args.docs is not None:
        if not args.docs.is_file():
            raise SweepError(f"--docs {args.docs} not found")
        try:
            text = args.docs.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise SweepError(f"--docs {not_utf8(args.docs, e)}") from None
        markers(text, args.docs, args.marker or out.name)


def copy_runs(src: Path, out: Path, sweep_file: Path | None, only: list[str] | None = None) -> dict[str, dict]:
    """The run files of every run under ``src`` (``only``: of those runs, beside the ones ``out/runs`` holds) into
    ``out/runs`` (a folder being built: :func:`check_inputs` checked the arguments); returns each copied run's
    record for the provenance (its state, step and the code version its newest checkpoint was trained with)."""
    runs = out / "runs"
    if only is None and runs.exists():
        shutil.rmtree(runs)
    runs.mkdir(parents=True, exist_ok=True)
    copy = sweep_file or (src / SWEEP_COPY if only is None else None)
    if copy is not None:
        shutil.copyfile(copy, runs / SWEEP_COPY)
    records = {}
    for name in only or run_names(src):
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
    return records


def markers(body: str, doc: Path, marker: str) -> tuple[str, str]:
    """``(start, end)`` markers of ``marker``'s block; SweepError unless ``body`` holds each once, in that order."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    if body.count(start) != 1 or body.count(end) != 1 or body.index(start) > body.index(end):
        raise SweepError(f"{doc} must hold '{start}' once, then '{end}' once")
    return start, end


def replace_block(doc: Path, marker: str, text: str) -> None:
    """Replace what stands between ``<!-- marker:start -->`` and ``<!-- marker:end -->`` in ``doc`` with ``text``."""
    body = doc.read_text()
    start, end = markers(body, doc, marker)
    head, rest = body.split(start)
    _, tail = rest.split(end)
    write_text_atomic(doc, f"{head}{start}\n{text.rstrip()}\n{end}{tail}")


def block(doc: Path, marker: str) -> str:
    """The text between the markers (what :func:`replace_block` wrote)."""
    body = doc.read_text()
    return body.split(f"<!-- {marker}:start -->\n", 1)[1].split(f"\n<!-- {marker}:end -->", 1)[0]


def publish_into(stage: Path, args: argparse.Namespace) -> None:
    """Write the publication into ``stage`` (a copy of OUT as it was): the runs, the provenance, the report;
    SweepError when the report fails (it printed why)."""
    from .__main__ import main as report_main

    records = copy_runs(args.runs_dir, stage, args.sweep, args.only)
    if args.only is None:
        meta = {"device": cpu_name(), "training_command": args.command, "runs": records}
    else:  # the other runs keep their records; the added ones say what produced them and where
        meta = read_json(stage / PROVENANCE)
        for record in records.values():
            record.update(command=args.command, device=cpu_name(), published=provenance())
        meta["runs"] = dict(sorted({**meta["runs"], **records}.items()))
    meta["published"] = provenance()
    write_text_atomic(stage / PROVENANCE, json.dumps(meta, indent=1) + "\n")
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        code = report_main([str(stage / "runs"), "--out", str(stage / "report")])
    print(said.getvalue().replace(str(stage), str(args.out)), end="")  # the paths OUT will have once swapped in
    if code != 0:
        raise SweepError(f"the report of the runs failed (above): {args.out} is left as it was")


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
    try:
        check_inputs(args)
        with staged_dir(args.out, keep=True) as stage:  # OUT itself changes only once all of it is written
            publish_into(stage, args)
        if args.docs is not None:
            replace_block(args.docs, args.marker or args.out.name, (args.out / "report" / "table.md").read_text())
            print(f"regenerated the {args.marker or args.out.name} table in {args.docs}")
    except (SweepError, RunFileError, OSError) as e:
        print(f"publish error: {e}", file=sys.stderr)
        return 2
    print(f"published {len(args.only or run_names(args.runs_dir))} runs to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
