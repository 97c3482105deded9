"""The papers' perplexity tables: per-corpus perplexity and Rel. (%), in Markdown and LaTeX.

``Rel. (%)`` is :mod:`neox_dar.evaluation.tables`' (the DAR paper's): the mean over the corpora of
``ppl(run) / ppl(baseline) * 100``, with the
baseline run of the same group (e.g. vanilla at the same scale). A perplexity the run files do not hold
is *missing* (shown as eval.table shows it, "--"), never zero, and a Rel. that would need it is missing too.
Corpora a sweep evaluates beyond the papers' three (its ``eval: {extra: ...}``) get their own columns; Rel. (%)
stays the papers' mean over their three.

The report's settings (the sweep file's ``report:`` mapping, :mod:`neox_dar.sweep.report_selection`) are checked when
the sweep is read: an unknown key, a baseline that matches no run or a metric that does not exist is a one-line
error.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..evaluation.corpora import CORPORA
from ..evaluation.tables import MISSING, TITLES, flag_other_scoring, latex_escape, relative_metric, relative_percent
from ..sweep.report_selection import baselines, check_axes, check_report, group_key
from .collect import RunRecord, kv_bytes_per_token, relative_cost

@dataclass
class Table:
    """A report table: header cells and rows of values (None = missing, printed as ``MISSING``)."""

    title: str
    columns: list[str]
    rows: list[list]
    notes: list[str]


def corpora_of(runs: list[RunRecord]) -> list[str]:
    """The papers' three corpora (those some run's evaluation holds, all three while none is evaluated), then every
    other corpus some run's evaluation holds, in order of appearance."""
    held = [c for r in runs for c in ((r.eval or {}).get("corpora") or {})]
    papers = [c for c in CORPORA if c in held] if held else list(CORPORA)
    return [*papers, *dict.fromkeys(c for c in held if c not in CORPORA)]


def scored_on(runs: list[RunRecord], corpora: list[str], base: dict[tuple, RunRecord]) -> str | None:
    """One line: how many documents and tokens each corpus was scored on (from a baseline's evaluation, else the
    first evaluated run's)."""
    ordered = [*base.values(), *runs]
    parts = []
    for c in corpora:
        entry = next((r.eval["corpora"][c] for r in ordered if r.eval and c in (r.eval.get("corpora") or {})), None)
        if entry is not None and entry.get("tokens") is not None:
            docs = entry.get("documents")
            parts.append(f"{TITLES.get(c, c)} {docs:,} documents / {entry['tokens']:,} tokens" if docs is not None
                         else f"{TITLES.get(c, c)} {entry['tokens']:,} tokens")
    return "Scored on: " + "; ".join(parts) + "." if parts else None


def relative_settings(report: dict) -> tuple[str, tuple[str, ...]]:
    """The metric Rel. (%) compares and the corpora it averages over: perplexities (``byte_perplexity`` when the
    table shows ``bits_per_byte``, whose ratio would not be a perplexity ratio) over ``relative_over`` (default: the
    papers' three corpora)."""
    return relative_metric(report.get("metric", "token_perplexity")), tuple(report.get("relative_over") or CORPORA)


def noise_floor(runs: list[RunRecord], report: dict, base: dict[tuple, RunRecord]) -> list[tuple[str, float]]:
    """``(run, Rel. (%))`` of the runs that repeat their group's baseline (``report['repeats']``) with another seed:
    how far two runs that differ only by seed already are."""
    if not report.get("repeats"):
        return []
    metric, corpora = relative_settings(report)
    group_by = list(report.get("group_by") or [])
    out = []
    for r in runs:
        b = base.get(group_key(r, group_by))
        if r.matches(report["repeats"]) and b is not None and b is not r and r.eval and b.eval:
            rel = relative_percent(r.eval, b.eval, metric, corpora)
            if rel is not None:
                out.append((r.name, rel))
    return out


def build_table(runs: list[RunRecord], report: dict) -> Table:
    """Rows in ``report['rows']`` order (default: the baseline, then the given order); columns run, axes,
    corpora, Rel., extras."""
    check_report(report)
    metric = report.get("metric", "token_perplexity")
    rel_metric, rel_corpora = relative_settings(report)
    group_by = list(report.get("group_by") or [])
    base = baselines(runs, report.get("baseline"), group_by)
    refs = {label: baselines(runs, selector, group_by) for label, selector in (report.get("compare") or {}).items()}
    noise = noise_floor(runs, report, base)
    floor = max(abs(v - 100.0) for _, v in noise) if noise else None
    order = report.get("rows")
    if order:
        by_name = {r.name: r for r in runs}
        runs = [by_name[n] for n in order if n in by_name] + [r for r in runs if r.name not in order]
    elif base:  # as in the papers: a baseline before the first run of its group, the rest in the given order
        ordered: list[RunRecord] = []
        for x in (x for r in runs for x in (base.get(group_key(r, group_by)), r)):
            if x is not None and not any(x is y for y in ordered):
                ordered.append(x)
        runs = ordered
    corpora = corpora_of(runs)
    axes = [a for a in dict.fromkeys(k for r in runs for k in r.axes)]
    stats = list(dict.fromkeys(stat for r in runs for stat in r.variant.stats))  # the variants' statistics
    with_cost = bool(report.get("cost"))
    columns = ["Run", *axes, *(TITLES.get(c, c) for c in corpora), "Rel. (%)", *(f"Rel. vs {x} (%)" for x in refs)]
    if floor is not None:
        columns.append("vs noise")
    if with_cost:
        columns += ["Cost", "KV (B/token)"]
    columns += [f"{stat} (%)" for stat in stats]
    columns.append("Step")
    cache: dict = {}
    rows, flags = [], []
    for r in runs:
        b = base.get(group_key(r, group_by))
        rel = relative_percent(r.eval, b.eval, rel_metric, rel_corpora) if (b and b.eval and r.eval) else None
        if b and b is not r and b.eval and r.eval:
            flags += flag_other_scoring([(r.name, r.eval)], b.eval, step=False)
            flags += flag_other_budget(r, b)
        if b and b is not r:
            flags += flag_other_shape(r, b)
        row = [r.name, *(r.axes.get(a, "") for a in axes), *(r.perplexity(c, metric) for c in corpora), rel]
        for ref in refs.values():  # "" for the reference itself or a group without one; None when not evaluated
            c = ref.get(group_key(r, group_by))
            row.append("" if c is None or c is r else
                       relative_percent(r.eval, c.eval, rel_metric, rel_corpora) if (c.eval and r.eval) else None)
        if floor is not None:
            row.append(None if rel is None else "" if r is b else
                       "within" if abs(rel - 100.0) <= floor else "beyond")
        if with_cost:
            row += [relative_cost(r, cache), kv_bytes_per_token(r)]
        for stat in stats:  # "" when the run's variant has no such statistic; None (missing) when not evaluated
            value = r.stat_mean(stat) if stat in r.variant.stats else ""
            row.append(value * 100 if isinstance(value, float) else value)
        row.append(r.eval.get("step") if r.eval else None)
        rows.append(row)
        if r.eval and r.trained_to() is not None and r.eval.get("step") is not None \
                and r.eval["step"] < r.trained_to():
            flags.append(f"warning: {r.name}: evaluated at step {r.eval['step']} but trained to step {r.trained_to()}; "
                         "its numbers are out of date (`python -m neox_dar.sweep ... run --local` or `submit` "
                         "evaluates it again)")
    missing = "not evaluated" + (", or its baseline not evaluated" if base else "")
    papers = ", ".join(TITLES.get(c, c) for c in rel_corpora)
    notes = [f"{'Perplexity' if metric != 'bits_per_byte' else 'Bits per byte'}: {metric} from each run's final "
             f"evaluation (eval/perplexity.json, else its latest eval/*.json); Rel. (%) = mean over {papers} of "
             f"{rel_metric} / baseline's x 100"
             + (f" with the baseline of the same {', '.join(group_by)}" if group_by else "")
             + (f" (baseline: {_baseline_names(base)})" if base else " (no baseline: set report.baseline)")
             + f". '{MISSING}' = {missing}."]
    for label, ref in refs.items():
        notes.append(f"Rel. vs {label} (%): the same mean ratio against {_baseline_names(ref)}"
                     + (f" of the same {', '.join(group_by)}" if group_by else "") + " instead of the baseline.")
    counts = scored_on(runs, corpora, base)
    if counts:
        notes.append(counts)
    if floor is not None:
        notes.append("Noise floor: " + ", ".join(f"{n} has Rel. {v:.2f}" for n, v in noise)
                     + f" against the baseline (same model, another seed): {floor:.2f} points. 'vs noise': whether a "
                     "run's |Rel. - 100| is beyond that (one seed per run: a difference within it is not resolved).")
    if with_cost:
        notes.append("Cost: training FLOPs per token of attention at seq_length (q.k scores and weighted sums over "
                     "the keys each query sees, plus products a variant adds, e.g. DAR's second key/value "
                     "projection), relative to vanilla attention; AHA counted as if every gate were open. DAR's "
                     "bottleneck (dar_down, dar_up) is counted with the parameters (6N), not here, so Cost does not "
                     "depend on d_down (the DAR paper gives no FLOP cost, only the cache's O(T d_down + w d)). "
                     "KV (B/token): inference cache bytes per token in bf16 at a context of seq_length, summed over "
                     "the layers (python -m neox_dar.describe; AHA counted with its full cache).")
    meanings = {stat: meaning for r in runs for stat, meaning in r.variant.stats.items()}
    for stat in stats:
        notes.append(f"{stat}: {meanings[stat]}; from the final evaluation (real tokens only), mean over the corpora, "
                     f"layers and heads; '{MISSING}' = not evaluated.")
    return Table(report.get("title") or "Perplexity", columns, rows, notes + flags)


def trained_budget(r: RunRecord) -> tuple[int | None, int | None]:
    """``(step, tokens)`` at the run's final evaluation: its step, and the tokens trained by then (that step's
    ``consumed_samples`` in metrics.jsonl times ``seq_length``; None when no row records it)."""
    step = r.eval.get("step") if r.eval else None
    samples = next((m["consumed_samples"] for m in r.metrics if m.get("step") == step and "consumed_samples" in m),
                   None)
    return step, None if samples is None else samples * r.cfg.model.seq_length


def flag_other_budget(r: RunRecord, b: RunRecord) -> list[str]:
    """A warning when ``r`` was evaluated after another training budget (step or tokens) than its baseline ``b``:
    its Rel. then compares models trained for different lengths (e.g. a run extended, or stopped early)."""
    mine, theirs = trained_budget(r), trained_budget(b)
    if mine == theirs:
        return []

    def said(budget: tuple[int | None, int | None]) -> str:
        return f"step {budget[0]}" + (f" ({budget[1]:,} tokens)" if budget[1] is not None else "")

    return [f"warning: {r.name}: evaluated at {said(mine)}, its baseline {b.name} at {said(theirs)}: its Rel. compares "
            "models trained for different budgets"]


SHAPE = ("model_family", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
         "intermediate_size", "seq_length", "vocab_size")
"""Model keys that set a model's scale: a run's Rel. (%) is meant against a baseline with the same values."""


def flag_other_shape(r: RunRecord, b: RunRecord) -> list[str]:
    """A warning when ``r``'s model differs from its baseline ``b``'s in a :data:`SHAPE` key (SPEC: vanilla at the
    same scale): its Rel. would compare models of two sizes."""
    diff = [f"{k} {getattr(r.cfg.model, k)} against {getattr(b.cfg.model, k)}" for k in SHAPE
            if getattr(r.cfg.model, k) != getattr(b.cfg.model, k)]
    return [f"warning: {r.name}: its model differs from its baseline {b.name}'s ({'; '.join(diff)}): its Rel. "
            "compares models of other scales (report.group_by, e.g. the scale axis, gives each scale its own "
            "baseline)"] if diff else []


def _baseline_names(base: dict[tuple, RunRecord]) -> str:
    return ", ".join(r.name for r in base.values())


def average_table(table: Table, runs: list[RunRecord], over: list[str]) -> Table:
    """Rows of ``table`` that differ only in the ``over`` axes (e.g. seeds) merged into one: every number is the
    mean, and Rel. (%) gets its sample standard deviation and its range beside it (the spread between seeds)."""
    by_name = {r.name: r for r in runs}
    check_axes(runs, over, "average_over")
    keep = [c for c in table.columns if c not in over]
    idx = [table.columns.index(c) for c in keep]
    rel = table.columns.index("Rel. (%)")
    groups: dict[tuple, list[list]] = {}
    for row in table.rows:
        run = by_name[row[0]]
        label = tuple(run.axes.get(a, "") for a in dict.fromkeys(k for r in runs for k in r.axes) if a not in over)
        groups.setdefault(label if any(label) else (row[0],), []).append(row)
    columns = ["Runs" if c == "Run" else c for c in keep]
    columns.insert(columns.index("Rel. (%)") + 1, "Rel. sd")
    columns.insert(columns.index("Rel. sd") + 1, "Rel. range")
    columns.insert(1, "n")
    rows, mixed = [], []
    for label, members in groups.items():
        out: list = []
        for i in idx:
            cells = [m[i] for m in members]
            if i == 0:
                out.append(" ".join(dict.fromkeys(str(c) for c in cells)) if len(members) == 1 else
                           "-".join(x for x in label if x) or cells[0])
            elif table.columns[i] == "vs noise":  # the baseline's group is the baseline; members may disagree
                out.append("" if "" in cells else cells[0] if len(set(cells)) == 1 else
                           None if None in cells else "mixed")
            elif table.columns[i] == "Step":  # one budget per row: merged runs at two steps are not a mean
                out.append(cells[0] if len(set(cells)) == 1 else None)
                if len(set(cells)) > 1:
                    mixed.append(f"warning: {' '.join(str(m[0]) for m in members)} were evaluated at steps "
                                 f"{', '.join(str(c) for c in cells)}: their row's means mix training budgets")
            elif all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in cells):
                out.append(statistics.fmean(cells))
            else:
                out.append(cells[0] if len(set(map(str, cells))) == 1 else None)
        rels = [m[rel] for m in members if isinstance(m[rel], float)]
        at = keep.index("Rel. (%)") + 1
        out[at:at] = [statistics.stdev(rels) if len(rels) > 1 else None,
                      f"{min(rels):.2f}..{max(rels):.2f}" if len(rels) > 1 else None]
        if len(rels) != len(members):
            out[at - 1] = None  # a mean over fewer seeds than the row has would mislead
        out.insert(1, len(members))
        rows.append(out)
    notes = [f"Mean over the runs that differ only in {', '.join(over)} (n = how many); Rel. sd = their sample "
             f"standard deviation, Rel. range = min..max; '{MISSING}' where a run of the row is not evaluated."]
    if "vs noise" in keep:
        notes.append("vs noise: the runs' own verdicts where they agree, 'mixed' where some are within the noise floor "
                     "and some beyond it; empty for the baseline's row.")
    return Table(f"{table.title} (mean over {', '.join(over)})", columns, rows, notes + mixed)


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
