"""The papers' figures as PNG, drawn from the run files; every title names the sweep.

- ``relative_ppl_vs_step.png`` (DAR Fig. 3): each run's perplexity / its group's baseline x 100 over training.
  Where a run and its baseline have evaluations (``eval/*.json``: in-training ``eval_perplexity`` and the final
  one) at two or more common steps, the paper's Rel. (%) over the three corpora (solid; the last point is the
  table's); otherwise a proxy from the ``valid_loss`` rows (dashed, with the validation tokens it rests on in the
  caption). Integer steps.
- ``loss_curves.png``: training loss per run, one column per group; below it each run's loss minus its
  baseline's (or, without a baseline, the second half zoomed in).
- ``learning_curves.png``: validation loss against the tokens seen (bytes, with a byte-level tokenizer), every run
  of a group on one panel; below it the in-training Rel. (%), ``exp(valid_loss - baseline's) x 100`` at each
  validation, with the noise floor (the runs of ``report.repeats``: the baseline's model at another seed) as a
  grey band.
- ``cost_vs_perplexity.png`` (MSWA Table 5 as a plot): relative attention cost vs Rel. (%), a labelled marker per
  run, the cost basis in the caption.
- ``{variant}_{stat}_heatmap.png`` for each per-head statistic a variant reports (AHA's ``mu_f``: the paper's Fig.
  3, full-attention usage per layer (rows) and head (columns)), from each
  run's final evaluation (real tokens only, mean over the corpora).
- ``{variant}_{stat}_heads.png`` (AHA Fig. 4 for ``mu_f``): every head's value, sorted, per run (same source).

A figure whose inputs no run holds is not drawn; :func:`draw_all` says which and why, and
:func:`earlier_figures` names the files of these names an earlier report left in the folder, which the report
removes (they would sit beside the new tables as if drawn from these runs).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator  # noqa: E402

from ..evaluation.tables import TITLES, relative_percent  # noqa: E402
from .collect import RunRecord  # noqa: E402
from .plots import head_heatmaps, label_axes, panel_row, save_figure, sorted_heads, titled  # noqa: E402
from .tables import Table, baselines, group_key, relative_settings  # noqa: E402


def _groups(runs: list[RunRecord], group_by: list[str]) -> dict[tuple, list[RunRecord]]:
    out: dict[tuple, list[RunRecord]] = {}
    for r in runs:
        out.setdefault(group_key(r, group_by), []).append(r)
    return out


def _evals_by_step(run: RunRecord) -> dict[int, dict]:
    """The run's evaluations by step; at one step the sweep's final evaluation (the table's) wins."""
    return {e["step"]: e for e in run.evals if e.get("step") is not None}


def _eval_points(run: RunRecord, base: RunRecord, report: dict) -> list[tuple[int, float]]:
    """(step, Rel. %) at every step where both runs have an evaluation with all of Rel.'s corpora."""
    ref = _evals_by_step(base)
    metric, corpora = relative_settings(report)
    pts = [(s, relative_percent(e, ref[s], metric, corpora)) for s, e in sorted(_evals_by_step(run).items())
           if s in ref]
    return [(s, v) for s, v in pts if v is not None]


def _valid_points(run: RunRecord, base: RunRecord) -> list[tuple[int, float]]:
    """(step, validation perplexity ratio %) at every step where both runs logged ``valid_loss``."""
    ref = {row["step"]: row["valid_loss"] for row in base.valid_rows()}
    return [(row["step"], math.exp(row["valid_loss"] - ref[row["step"]]) * 100)
            for row in run.valid_rows() if row["step"] in ref]


def validation_tokens(run: RunRecord) -> int:
    """Tokens one validation (``eval_iters`` global batches) scores."""
    t = run.cfg.training
    batch = t.train_batch_size if t.train_batch_size is not None else t.train_micro_batch_size_per_gpu
    return run.cfg.run.eval_iters * batch * run.cfg.model.seq_length


def _integer_steps(ax) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _baseline_text(base: dict) -> str:
    return ", ".join(dict.fromkeys(b.name for b in base.values()))


def relative_ppl_vs_step(runs: list[RunRecord], report: dict, out: Path, sweep: str = "") -> Path | None:
    """Per run: evaluations at >= 2 common steps give the paper's Rel. (%) (solid); otherwise the validation-loss
    proxy (dashed, marked in the legend and the caption)."""
    group_by = list(report.get("group_by") or [])
    base = baselines(runs, report.get("baseline"), group_by)
    metric, corpora = relative_settings(report)
    series = []
    for r in runs:
        b = base.get(group_key(r, group_by))
        if b is None or b is r:
            continue
        pts, proxy = _eval_points(r, b, report), False
        if len(pts) < 2:
            pts, proxy = _valid_points(r, b), True
        if pts:
            series.append((group_key(r, group_by), r, proxy, pts))
    if not series:
        return None
    keys = list(dict.fromkeys(s[0] for s in series))
    fig, axes = panel_row(len(keys), 6.0, 4.2)
    for ax, key in zip(axes, keys):
        for _, r, proxy, pts in (s for s in series if s[0] == key):
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, ls="--" if proxy else "-",
                    label=r.name + (" (valid-loss proxy)" if proxy else ""))
        ax.axhline(100.0, color="black", lw=1, ls=":")
        _integer_steps(ax)
        label_axes(ax, "training step", "perplexity / baseline's (%)", " ".join(key))
    papers = ", ".join(TITLES.get(c, c) for c in corpora)
    caption = []
    if any(not s[2] for s in series):
        caption.append(f"solid: Rel. (%) = mean over {papers} of {metric} / baseline's x 100, from the evaluations "
                       "(the last point is the table's)")
    proxies = [s[1] for s in series if s[2]]
    if proxies:
        tokens = sorted({validation_tokens(r) for r in proxies})
        caption.append(f"dashed: proxy, exp(valid_loss - baseline's) x 100 on {'/'.join(f'{n:,}' for n in tokens)} "
                       "tokens per validation, for runs without corpus evaluations at 2+ steps (noisy; it may "
                       "disagree with the table)")
    rect = titled(fig, f"{sweep}: perplexity relative to the baseline ({_baseline_text(base)})", caption)
    return save_figure(fig, out / "relative_ppl_vs_step.png", rect=rect)


def loss_curves(runs: list[RunRecord], report: dict, out: Path, sweep: str = "") -> Path | None:
    """Training loss per run (top), and below it each run's loss minus its baseline's at the same steps (the runs
    see the same batches, so the difference is far less noisy than either curve); without a baseline, the second
    half of training zoomed in."""
    group_by = list(report.get("group_by") or [])
    groups = {k: [r for r in g if r.train_rows()] for k, g in _groups(runs, group_by).items()}
    groups = {k: g for k, g in groups.items() if g}
    if not groups:
        return None
    base = baselines(runs, report.get("baseline"), group_by)
    fig, grid = plt.subplots(2, len(groups), figsize=(6.0 * len(groups), 7.0), squeeze=False)
    for col, (key, group) in enumerate(groups.items()):
        top, bottom = grid[0][col], grid[1][col]
        b = base.get(key)
        ref = {x["step"]: x["loss"] for x in b.train_rows()} if b is not None else {}
        last = max(x["step"] for r in group for x in r.train_rows())
        for r in group:
            rows = r.train_rows()
            line, = top.plot([x["step"] for x in rows], [x["loss"] for x in rows], lw=1, label=r.name)
            if ref and r is not b:
                diff = [(x["step"], x["loss"] - ref[x["step"]]) for x in rows if x["step"] in ref]
                bottom.plot([d[0] for d in diff], [d[1] for d in diff], lw=1, color=line.get_color(), label=r.name)
            elif not ref:
                late = [x for x in rows if x["step"] >= last / 2]
                bottom.plot([x["step"] for x in late], [x["loss"] for x in late], lw=1, color=line.get_color(),
                            label=r.name)
        for ax in (top, bottom):
            _integer_steps(ax)
        label_axes(top, "training step", "training loss", " ".join(key) or "training loss")
        if ref:
            bottom.axhline(0.0, color="black", lw=1, ls=":")
            label_axes(bottom, "training step", f"loss - {b.name}'s loss", f"relative to the baseline {b.name}")
        else:
            label_axes(bottom, "training step", "training loss", "second half of training (zoom)")
    rect = titled(fig, f"{sweep}: training loss", [])
    return save_figure(fig, out / "loss_curves.png", rect=rect)


def _tokens_seen(run: RunRecord, row: dict) -> int:
    """Training tokens the run had consumed at a metrics row (its ``consumed_samples`` x ``seq_length``)."""
    samples = row.get("consumed_samples")
    if samples is None:  # a validation row of an older run: the step's global batches
        samples = row["step"] * run.cfg.training.train_batch_size
    return int(samples) * run.cfg.model.seq_length


def learning_curves(runs: list[RunRecord], report: dict, out: Path, sweep: str = "") -> Path | None:
    """Validation loss against the tokens seen (top) and the in-training Rel. (%) from it (bottom: each run's
    ``exp(valid_loss - baseline's) x 100`` at the same step, the repeats' spread as a grey band), one column per
    group. Needs ``valid_loss`` rows; the runs of a group validate on the same sequences with ``eval_mode: fixed``."""
    group_by = list(report.get("group_by") or [])
    groups = {k: [r for r in g if r.valid_rows()] for k, g in _groups(runs, group_by).items()}
    groups = {k: g for k, g in groups.items() if g}
    if not groups:
        return None
    base = baselines(runs, report.get("baseline"), group_by)
    repeats = report.get("repeats")
    fig, grid = plt.subplots(2, len(groups), figsize=(7.5 * len(groups), 8.0), squeeze=False)
    for col, (key, group) in enumerate(groups.items()):
        top, bottom = grid[0][col], grid[1][col]
        b = base.get(key)
        ref = {row["step"]: row["valid_loss"] for row in b.valid_rows()} if b is not None else {}
        band: dict[int, float] = {}
        for r in group:
            rows = r.valid_rows()
            line, = top.plot([_tokens_seen(r, x) for x in rows], [x["valid_loss"] for x in rows], lw=1.2,
                             marker=".", ms=3, label=r.name)
            if not ref or r is b:
                continue
            pts = [(_tokens_seen(r, x), math.exp(x["valid_loss"] - ref[x["step"]]) * 100) for x in rows
                   if x["step"] in ref]
            bottom.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.2, marker=".", ms=3,
                        color=line.get_color(), label=r.name, ls="--" if repeats and r.matches(repeats) else "-")
            if repeats and r.matches(repeats):
                for x, (_, v) in zip(rows, pts):
                    band[_tokens_seen(r, x)] = max(band.get(_tokens_seen(r, x), 0.0), abs(v - 100.0))
        if band:
            xs = sorted(band)
            bottom.fill_between(xs, [100 - band[x] for x in xs], [100 + band[x] for x in xs], color="0.85",
                                label="noise floor (repeats)", zorder=0)
        label_axes(top, "tokens seen", "validation loss (nats per token)", " ".join(key) or "validation loss")
        if ref:
            bottom.axhline(100.0, color="black", lw=1, ls=":")
            label_axes(bottom, "tokens seen", f"exp(valid_loss - {b.name}'s) x 100",
                       f"in-training Rel. (%) vs {b.name}")
        else:
            bottom.set_visible(False)
    tokens = sorted({validation_tokens(r) for g in groups.values() for r in g})
    caption = [f"Validation on {'/'.join(f'{n:,}' for n in tokens)} held-out tokens per point"
               + ("; dashed: a repeat of the baseline's model with another seed, the grey band its distance from "
                  "100 (the noise floor)" if repeats else "")]
    rect = titled(fig, f"{sweep}: learning curves", caption)
    return save_figure(fig, out / "learning_curves.png", rect=rect)


def cost_vs_perplexity(table: Table, runs: list[RunRecord], out: Path, sweep: str = "") -> Path | None:
    """Rel. (%) against the attention cost, a marker per run (labelled) and a line per kind of attention through
    its runs at distinct costs."""
    if "Cost" not in table.columns:
        return None
    ci, ri = table.columns.index("Cost"), table.columns.index("Rel. (%)")
    kinds: dict[str, list[tuple[float, float, str]]] = {}
    for r, row in zip(runs, table.rows):
        if row[ri] is not None:
            kinds.setdefault(r.variant.label(r.cfg.model), []).append((row[ci], row[ri], r.name))
    if not kinds:
        return None
    fig, axes = panel_row(1, 7.0, 4.8)
    ax = axes[0]
    for (kind, pts), marker in zip(kinds.items(), "osD^v<>ph*"):
        pts.sort()
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, ls="none", label=kind)
        means = {}
        for x, y, _ in pts:
            means.setdefault(x, []).append(y)
        if len(means) > 1:  # a line only between distinct costs: runs at one cost stay separate markers
            xs = sorted(means)
            ax.plot(xs, [sum(means[x]) / len(means[x]) for x in xs], lw=1, color=line.get_color(), alpha=0.6)
        for x, y, name in pts:
            ax.annotate(name, (x, y), fontsize=6, xytext=(4, 2), textcoords="offset points")
    costs = sorted({p[0] for pts in kinds.values() for p in pts})
    if costs[-1] / costs[0] > 4:
        ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(costs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelsize=7, labelrotation=45)
    ax.axhline(100.0, color="black", lw=1, ls=":")
    T = runs[0].cfg.model.seq_length
    label_axes(ax, f"attention cost relative to vanilla (training FLOPs per token at T = {T:,})", "Rel. (%)", "")
    rect = titled(fig, f"{sweep}: attention cost vs perplexity",
                   ["cost: training FLOPs of q.k scores and weighted sums over the keys each query sees, plus the "
                    "products a variant adds (DAR's second key/value projection); AHA at its upper bound (every "
                    "gate open). Rel. (%) as in the table."])
    return save_figure(fig, out / "cost_vs_perplexity.png", rect=rect)


def stat_figures(runs: list[RunRecord], out: Path) -> tuple[list[Path], list[str]]:
    """For every per-head statistic a run's variant reports (AHA's ``mu_f``: the paper's Fig. 3 and 4), a heatmap
    per layer (rows) and head (columns) per run, and every head's value sorted. Returns (files, skipped)."""
    files, skipped = [], []
    kinds = {(r.variant.name, stat): meaning for r in runs for stat, meaning in r.variant.stats.items()}
    for (name, stat), meaning in kinds.items():
        tables = [(r.name, r.stat_table(stat)) for r in runs if r.variant.name == name]
        tables = [(n, t) for n, t in tables if t]
        if not tables:
            skipped.append(f"{name.upper()} {stat} figures: no {name} run's evaluation reports {stat} "
                           "(run eval.perplexity on them)")
            continue
        files.append(head_heatmaps(tables, f"{name.upper()} {stat} per layer and head (final evaluation, mean over "
                                           f"corpora): {meaning}", out / f"{name}_{stat}_heatmap.png"))
        files.append(sorted_heads(tables, f"{stat} (final evaluation)", f"{name.upper()} heads sorted by {stat}",
                                  out / f"{name}_{stat}_heads.png"))
    return files, skipped


FIGURES = ("relative_ppl_vs_step.png", "loss_curves.png", "learning_curves.png", "cost_vs_perplexity.png")
STAT_FIGURE = re.compile(r"[a-z0-9]+_[A-Za-z0-9_]+_(heatmap|heads)\.png")  # {variant}_{stat}_heatmap.png, ..._heads.png


def earlier_figures(out: Path, drawn: list[Path]) -> list[Path]:
    """The files in ``out`` named as this module names its figures that are not in ``drawn``."""
    if not out.is_dir():
        return []
    return sorted(p for p in out.iterdir() if p.is_file() and p not in drawn
                  and (p.name in FIGURES or STAT_FIGURE.fullmatch(p.name)))


def draw_all(runs: list[RunRecord], table: Table, report: dict, out: Path,
             sweep: str = "") -> tuple[list[Path], list[str]]:
    """Every figure that the runs support (titled with the sweep's name); returns (files, reasons for those not
    drawn)."""
    out.mkdir(parents=True, exist_ok=True)
    files, skipped = [], []
    for name, fn in (("relative perplexity vs step", lambda: relative_ppl_vs_step(runs, report, out, sweep)),
                     ("loss curves", lambda: loss_curves(runs, report, out, sweep)),
                     ("learning curves", lambda: learning_curves(runs, report, out, sweep)),
                     ("cost vs perplexity", lambda: cost_vs_perplexity(table, _ordered(runs, table), out, sweep))):
        path = fn()
        if path is None:
            skipped.append(f"{name}: no run holds its inputs")
        else:
            files.append(path)
    stat_files, stat_skipped = stat_figures(runs, out)
    return files + stat_files, skipped + stat_skipped


def _ordered(runs: list[RunRecord], table: Table) -> list[RunRecord]:
    by_name = {r.name: r for r in runs}
    return [by_name[row[0]] for row in table.rows]
