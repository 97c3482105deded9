"""Command line of the report.

    python -m neox_dar.report RUNS_DIR_OR_SWEEP [--out DIR] [--metric word_perplexity] [--no-figures]

Writes DIR/table.md, DIR/table.tex and the figures (DIR defaults to <runs dir>/report) and prints
the Markdown table. The sweep file's ``report:`` mapping sets the title, baseline, grouping and row
order; the command-line options override it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..rundir import RunFileError
from ..sweep.spec import SweepError
from .collect import collect
from .figures import draw_all
from .tables import build_table, to_latex, to_markdown


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m neox_dar.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="sweep YAML, sweep output directory, or a directory of run directories")
    p.add_argument("--out", help="output directory (default: <runs dir>/report)")
    p.add_argument("--metric", choices=["token_perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte"])
    p.add_argument("--baseline", help="baseline run name (default: the sweep's report.baseline selector)")
    p.add_argument("--group-by", nargs="*", help="grid axes whose runs share one baseline")
    p.add_argument("--no-figures", action="store_true")
    args = p.parse_args(argv)
    try:
        runs, sweep, root = collect(args.target)
        report = dict(sweep.report if sweep else {})
        if sweep is None:
            report.setdefault("baseline", {"attention_type": "vanilla"})
        if args.metric:
            report["metric"] = args.metric
        if args.baseline:
            report["baseline"] = {"run": args.baseline}
        if args.group_by is not None:
            report["group_by"] = args.group_by
        table = build_table(runs, report)
        out = Path(args.out) if args.out else root / "report"
        out.mkdir(parents=True, exist_ok=True)
        md = to_markdown(table)
        (out / "table.md").write_text(md)
        (out / "table.tex").write_text(to_latex(table))
        (out / "table.json").write_text(json.dumps({"title": table.title, "columns": table.columns,
                                                    "rows": table.rows}, indent=1) + "\n")
        print(md)
        files = [out / "table.md", out / "table.tex", out / "table.json"]
        if not args.no_figures:
            figs, skipped = draw_all(runs, table, report, out)
            files += figs
            for s in skipped:
                print(f"figure skipped: {s}")
        print("wrote " + ", ".join(str(f) for f in files))
        return 0
    except (SweepError, RunFileError) as e:
        print(f"report error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
