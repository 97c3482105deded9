"""The papers' perplexity tables: per-corpus perplexity and Rel. (%), in Markdown and LaTeX.

``Rel. (%)`` is :mod:`neox_dar.evaluation.tables`' (the DAR paper's): the mean over the corpora of
``ppl(run) / ppl(baseline) * 100``, with the
baseline run of the same group (e.g. vanilla at the same scale). A perplexity the run files do not hold
is *missing* (shown as eval.table shows it, "--"), never zero, and a Rel. that would need it is missing too.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..evaluation.corpora import CORPORA
from ..evaluation.tables import MISSING, TITLES, flag_other_documents, latex_escape, relative_percent
from ..sweep.spec import SweepError
from .collect import RunRecord, relative_cost

@dataclass
class Table:
    """A report table: header cells and rows of values (None = missing, printed as ``MISSING``)."""

    title: str
    columns: list[str]
    rows: list[list]
    notes: list[str]


def group_key(run: RunRecord, group_by: list[str]) -> tuple:
    return tuple(run.axes[g] if g in run.axes else str(run.config_value(g)) for g in group_by)


def baselines(runs: list[RunRecord], selector: dict | None, group_by: list[str]) -> dict[tuple, RunRecord]:
    """The baseline run of each group (runs matching ``selector``); a group with two baselines is an error."""
    out: dict[tuple, RunRecord] = {}
    if not selector:
        return out
    for r in runs:
        if r.matches(selector):
            key = group_key(r, group_by)
            if key in out:
                raise SweepError(f"two baseline runs in group {key or '(all)'}: {out[key].name} and {r.name}; "
                                 "set report.group_by or a narrower report.baseline")
            out[key] = r
    return out


def build_table(runs: list[RunRecord], report: dict) -> Table:
    """Rows in ``report['rows']`` order (default: the baseline, then the given order); columns run, axes,
    corpora, Rel., extras."""
    metric = report.get("metric", "token_perplexity")
    group_by = list(report.get("group_by") or [])
    base = baselines(runs, report.get("baseline"), group_by)
    order = report.get("rows")
    if order:
        by_name = {r.name: r for r in runs}
        runs = [by_name[n] for n in order if n in by_name] + [r for r in runs if r.name not in order]
    elif base and not group_by:  # as in the papers: the baseline first
        runs = [r for r in runs if r in base.values()] + [r for r in runs if r not in base.values()]
    axes = [a for a in dict.fromkeys(k for r in runs for k in r.axes)]
    stats = list(dict.fromkeys(stat for r in runs for stat in r.variant.stats))  # the variants' statistics
    with_cost = bool(report.get("cost"))
    columns = ["Run", *axes, *(TITLES.get(c, c) for c in CORPORA), "Rel. (%)"]
    if with_cost:
        columns.append("Cost")
    columns += [f"{stat} (%)" for stat in stats]
    columns.append("Step")
    cache: dict = {}
    rows, flags = [], []
    for r in runs:
        ppl = {c: r.perplexity(c, metric) for c in CORPORA}
        b = base.get(group_key(r, group_by))
        rel = relative_percent(r.eval, b.eval, metric) if (b and b.eval and r.eval) else None
        if b and b is not r and b.eval and r.eval:
            flags += flag_other_documents([(r.name, r.eval)], b.eval)
        row = [r.name, *(r.axes.get(a, "") for a in axes), *(ppl[c] for c in CORPORA), rel]
        if with_cost:
            row.append(relative_cost(r, cache))
        for stat in stats:  # "" when the run's variant has no such statistic; None (missing) when not evaluated
            value = r.stat_mean(stat) if stat in r.variant.stats else ""
            row.append(value * 100 if isinstance(value, float) else value)
        row.append(r.eval.get("step") if r.eval else None)
        rows.append(row)
    notes = [f"Perplexity: {metric} from each run's final eval/*.json; Rel. (%) = mean over "
             f"{', '.join(TITLES.get(c, c) for c in CORPORA)} of ppl / ppl(baseline) x 100"
             + (f", baseline per {', '.join(group_by)}" if group_by else "") + f". '{MISSING}' = not evaluated."]
    if with_cost:
        notes.append("Cost: attention FLOPs per token at seq_length (scores, weighted sums, variant extras), "
                     "relative to vanilla attention; data-dependent variants counted at their upper bound.")
    meanings = {stat: meaning for r in runs for stat, meaning in r.variant.stats.items()}
    for stat in stats:
        notes.append(f"{stat}: {meanings[stat]}; from the final evaluation (real tokens only), mean over the corpora, "
                     f"layers and heads; '{MISSING}' = not evaluated.")
    return Table(report.get("title") or "Perplexity", columns, rows, notes + flags)


def _cell(v, latex: bool = False) -> str:
    if v is None:
        return MISSING
    if isinstance(v, float):
        return f"{v:.2f}"
    return latex_escape(str(v)) if latex else str(v)


def to_markdown(t: Table) -> str:
    lines = [f"### {t.title}", "", "| " + " | ".join(t.columns) + " |",
             "| " + " | ".join("---" if i == 0 else "---:" for i in range(len(t.columns))) + " |"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in t.rows]
    return "\n".join(lines + [""] + [f"{n}" for n in t.notes]) + "\n"


def to_latex(t: Table) -> str:
    spec = "l" + "r" * (len(t.columns) - 1)
    head = " & ".join(_cell(c, latex=True) for c in t.columns) + r" \\"
    body = [" & ".join(_cell(v, latex=True) for v in row) + r" \\" for row in t.rows]
    return "\n".join([r"\begin{table}[t]", r"\centering", rf"\begin{{tabular}}{{{spec}}}", r"\toprule", head,
                      r"\midrule", *body, r"\bottomrule", r"\end{tabular}",
                      rf"\caption{{{_cell(t.title, latex=True)}. {_cell(' '.join(t.notes), latex=True)}}}",
                      r"\end{table}"]) + "\n"
