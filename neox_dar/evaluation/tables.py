"""The papers' perplexity tables: per-corpus perplexity of runs and ``Rel. (%)`` against a baseline, in Markdown and
LaTeX (used by ``python -m eval.table`` and the sweep report).

``Rel. (%)`` = mean over FineWeb-Edu, C4 and WikiText-103 of ``ppl(run) / ppl(baseline) * 100`` (the DAR paper's
Table 1 metric); it exists only when the run and the baseline both have all three corpora. A corpus missing from a
result is printed as ``--``, never as a number.
"""

from __future__ import annotations

import math

from .corpora import CORPORA

TITLES = {"fineweb_edu": "FineWeb-Edu", "c4": "C4", "wikitext103": "WikiText-103"}
METRICS = ("token_perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte")
MISSING = "--"


def relative_metric(metric: str) -> str:
    """The metric Rel. (%) takes the ratio of for a table of ``metric``: ``byte_perplexity`` for ``bits_per_byte``
    (a ratio of bits per byte is not a perplexity ratio), else ``metric`` itself."""
    return "byte_perplexity" if metric == "bits_per_byte" else metric


def relative_percent(run: dict, baseline: dict, metric: str = "token_perplexity",
                     corpora: tuple[str, ...] | list[str] = CORPORA) -> float | None:
    """Mean over ``corpora`` (default: the papers' three) of ``run / baseline * 100`` for ``metric``'s perplexity
    (:func:`relative_metric`); ``None`` if a corpus is missing or a value is not a finite number (a diverged run's
    NaN is missing, not a ratio)."""
    metric = relative_metric(metric)
    ratios = []
    for corpus in corpora:
        mine, base = run["corpora"].get(corpus), baseline["corpora"].get(corpus)
        if mine is None or base is None:
            return None
        a, b = mine.get(metric), base.get(metric)
        if not (_finite(a) and _finite(b)) or b == 0:
            return None
        ratios.append(a / b * 100.0)
    return sum(ratios) / len(ratios)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def number_cell(value) -> str:
    """A table cell for a metric's value: two decimals, ``--`` for a missing or non-finite one."""
    return f"{value:.2f}" if _finite(value) else MISSING


def table_rows(runs: list[tuple[str, dict]], baseline: tuple[str, dict], metric: str) -> list[list[str]]:
    """One row per run (the baseline first): name, one cell per corpus, Rel. (%)."""
    rows = []
    for name, res in [baseline, *runs]:
        cells = [name]
        for corpus in CORPORA:
            entry = res["corpora"].get(corpus)
            cells.append(number_cell(entry.get(metric)) if entry is not None else MISSING)
        cells.append(number_cell(relative_percent(res, baseline[1], metric)))
        rows.append(cells)
    return rows


def header(metric: str) -> list[str]:
    what = "" if metric == "token_perplexity" else f" ({metric})"
    return ["Model" + what] + [TITLES[c] for c in CORPORA] + ["Rel. (%)"]


def markdown(rows: list[list[str]], metric: str) -> str:
    head = header(metric)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


_LATEX = str.maketrans({"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "$": r"\$",
                        "{": r"\{", "}": r"\}"})


def latex_escape(text: str) -> str:
    return text.translate(_LATEX)


def latex(rows: list[list[str]], metric: str) -> str:
    head = [latex_escape(h) for h in header(metric)]
    body = [" & ".join(latex_escape(c) for c in r) + r" \\" for r in rows]
    return "\n".join([r"\begin{tabular}{l" + "r" * (len(head) - 1) + "}", r"\toprule", " & ".join(head) + r" \\",
                      r"\midrule", body[0], r"\midrule", *body[1:], r"\bottomrule", r"\end{tabular}"])


SCORING = {"max_length": "window (max_length)", "stride": "stride", "prefix_token": "prefix token id",
           "dtype": "dtype", "tokenizer_sha256": "tokenizer"}
"""The settings of an evaluation that change its numbers besides the model: results that differ in one do not
compare (a result without the key, from an older version, is not flagged)."""


def flag_other_scoring(runs: list[tuple[str, dict]], baseline: dict, step: bool = True) -> list[str]:
    """Warnings for the results in ``runs`` that were not scored as ``baseline`` was: a corpus scored on other
    documents (manifest hashes), another :data:`SCORING` setting, and with ``step`` another training step; a Rel.
    (%) between them compares more than the models."""
    notes = []
    for name, res in runs:
        for corpus, entry in res["corpora"].items():
            base = baseline["corpora"].get(corpus)
            if base and entry.get("manifest_sha256") != base.get("manifest_sha256"):
                notes.append(f"warning: {name}: {corpus} was scored on other documents than the baseline "
                             "(manifest hashes differ)")
        keys = {**SCORING, "step": "training step"} if step else SCORING
        for key, what in keys.items():
            mine, theirs = res.get(key), baseline.get(key)
            if mine is not None and theirs is not None and mine != theirs:
                notes.append(f"warning: {name}: scored with {what} {mine}, the baseline with {theirs}: its Rel. "
                             "compares more than the models")
    return notes
