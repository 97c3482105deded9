"""The papers' perplexity table: per-corpus perplexity of each run and ``Rel. (%)`` against vanilla.

    python -m eval.table runs/dar/ppl.json runs/swa/ppl.json --baseline runs/vanilla/ppl.json [--names DAR,SWA]
        [--metric token_perplexity] [--format both|markdown|latex]

``Rel. (%)`` = mean over FineWeb-Edu, C4 and WikiText-103 of ``ppl(run) / ppl(vanilla) * 100`` (the DAR paper's
Table 1 metric; with ``--metric bits_per_byte``, of the byte perplexities); it is shown only when the run and the
baseline both have all three corpora. A corpus or metric missing from a results file, or not a finite number, is
printed as ``--``, never as a number. A run scored otherwise than the baseline (other documents, window, stride,
dtype, tokenizer or training step) is flagged on stderr, and so are corpora outside the three (enwik8, an extra
corpus: ``python -m neox_dar.report`` shows them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from neox_dar.config.files import not_utf8
from neox_dar.evaluation.tables import CORPORA, METRICS, flag_other_scoring, latex, markdown, table_rows


def _run_name(res: dict, path: Path) -> str:
    ckpt = Path(res.get("checkpoint", path.stem))
    run = ckpt.parents[1].name if ckpt.parent.name == "checkpoints" else ckpt.name
    return f"{res.get('attention_type', '?')} ({run})"


def _load(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"results file not found: {p}")
    try:
        res = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(not_utf8(p, e)) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p} is not a results JSON ({e})") from None
    if not isinstance(res, dict) or not isinstance(res.get("corpora"), dict):
        raise ValueError(f"{p} has no 'corpora' object; is it from python -m eval.perplexity?")
    for corpus, entry in res["corpora"].items():
        if not isinstance(entry, dict):
            raise ValueError(f"{p}: corpus '{corpus}' is {entry!r}, not an object of metrics")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.table", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="results JSON files from python -m eval.perplexity")
    ap.add_argument("--baseline", required=True, help="the vanilla run's results JSON")
    ap.add_argument("--names", default=None, help="comma-separated row names for the runs (default: from the files)")
    ap.add_argument("--baseline-name", default="Vanilla")
    ap.add_argument("--metric", default="token_perplexity", choices=METRICS)
    ap.add_argument("--format", default="both", choices=["both", "markdown", "latex"])
    args = ap.parse_args(argv)
    try:
        results = [_load(p) for p in args.runs]
        baseline = _load(args.baseline)
        names = args.names.split(",") if args.names else [_run_name(r, Path(p)) for r, p in zip(results, args.runs)]
        if len(names) != len(results):
            raise ValueError(f"--names has {len(names)} names for {len(results)} results files")
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    runs = list(zip(names, results))
    for note in flag_other_scoring(runs, baseline):
        print(note, file=sys.stderr)
    others = sorted({c for r in [baseline, *results] for c in r["corpora"]} - set(CORPORA))
    if others:  # a results file of other corpora (enwik8, an extra corpus) printed a table of '--' without a word
        print(f"note: {', '.join(others)} {'is' if len(others) == 1 else 'are'} not among this table's corpora "
              f"({', '.join(CORPORA)}): python -m neox_dar.report shows every corpus of a sweep or a folder of runs",
              file=sys.stderr)
    rows = table_rows(runs, (args.baseline_name, baseline), args.metric)
    parts = []
    if args.format in ("both", "markdown"):
        parts.append(markdown(rows, args.metric))
    if args.format in ("both", "latex"):
        parts.append(latex(rows, args.metric))
    print("\n\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
