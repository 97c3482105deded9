"""Command line of the report.

    python -m neox_dar.report RUNS_DIR_OR_SWEEP [--out DIR] [--metric word_perplexity] [--no-figures]

Writes DIR/table.md, DIR/table.tex, DIR/table.json and the figures (DIR defaults to <runs dir>/report) and
prints the Markdown table. The sweep file's ``report:`` mapping sets the title, baseline, grouping, row order,
cost column and the axes to average over (seeds); the command-line options override it. An unknown setting or a
baseline that matches no run is a one-line error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..rundir import RunFileError, check_writable, write_text_atomic
from ..sweep.errors import SweepError
from .collect import absent_runs, collect
from .figures import draw_all, earlier_figures
from .tables import average_table, build_table, to_latex, to_markdown
from ..notices import one_line_notices


def report_tables(runs, report: dict) -> list:
    """The report's tables: the per-run table, and with ``average_over`` the averaged one (what ``table.md``
    holds, one after the other)."""
    table = build_table(runs, report)
    tables = [table]
    if report.get("average_over"):
        tables.append(average_table(table, runs, report["average_over"]))
    return tables


def main(argv: list[str] | None = None) -> int:
    one_line_notices()  # this package's warnings as `warning: ...`, one line
    p = argparse.ArgumentParser(prog="python -m neox_dar.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="sweep YAML, sweep output directory, or a directory of run directories")
    p.add_argument("--out", help="output directory (default: <runs dir>/report)")
    p.add_argument("--metric", choices=["token_perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte"])
    p.add_argument("--baseline", help="baseline run name (default: the sweep's report.baseline selector)")
    p.add_argument("--group-by", nargs="*", help="grid axes whose runs share one baseline")
    p.add_argument("--average-over", nargs="*", help="axes to average over in a second table (e.g. seed)")
    p.add_argument("--no-figures", action="store_true")
    args = p.parse_args(argv)
    try:
        runs, sweep, root = collect(args.target)
        report = dict(sweep.report if sweep else {})
        if sweep is None and any(r.matches({"attention_type": "vanilla"}) for r in runs):
            report.setdefault("baseline", {"attention_type": "vanilla"})
        if args.metric:
            report["metric"] = args.metric
        if args.baseline:
            report["baseline"] = {"run": args.baseline}
        if args.group_by is not None:
            report["group_by"] = args.group_by
        if args.average_over is not None:
            report["average_over"] = args.average_over
        tables = report_tables(runs, report)
        table = tables[0]
        if absent := absent_runs(sweep, root):
            table.notes.append(f"warning: {len(absent)} run(s) of the sweep have no directory in its output "
                               f"(deleted, or added to the sweep file after its plan), so the table leaves them "
                               f"out: {', '.join(absent)}")
        out = Path(args.out) if args.out else root / "report"
        check_writable(out, "--out", folder=True)
        out.mkdir(parents=True, exist_ok=True)
        md = "\n".join(to_markdown(t) for t in tables)
        write_text_atomic(out / "table.md", md)
        write_text_atomic(out / "table.tex", "\n".join(to_latex(t) for t in tables))
        body = {"title": table.title, "columns": table.columns, "rows": table.rows, "notes": table.notes}
        if len(tables) > 1:
            body["averaged"] = {"title": tables[1].title, "columns": tables[1].columns, "rows": tables[1].rows,
                                "notes": tables[1].notes}
        write_text_atomic(out / "table.json", json.dumps(body, indent=1) + "\n")
        print(md)
        files = [out / "table.md", out / "table.tex", out / "table.json"]
        figs = []
        if not args.no_figures:
            name = sweep.name if sweep else root.name
            figs, skipped = draw_all(runs, table, report, out, name)
            files += figs
            for s in skipped:
                print(f"figure skipped: {s}")
        why = ("--no-figures draws none, and an earlier report's would not match these tables" if args.no_figures
               else "an earlier report's figure that these runs do not draw")
        for old in earlier_figures(out, figs):
            old.unlink()
            print(f"removed {old}: {why}")
        print("wrote " + ", ".join(str(f) for f in files))
        return 0
    except (SweepError, RunFileError, OSError) as e:  # RunWriteError is an OSError
        print(f"report error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
