"""The papers' figures as PNG, drawn from the run files.

- ``relative_ppl_vs_step.png`` (DAR Fig. 3): each run's perplexity / its group's baseline x 100 over training.
  Where a run and its baseline have evaluations (``eval/*.json``) at two or more common steps, the paper's
  Rel. (%) over the three corpora; otherwise the validation perplexity from ``valid_loss`` rows (one
  validation set). The legend says which.
- ``loss_curves.png``: training loss per run, one panel per group.
- ``cost_vs_perplexity.png`` (MSWA Table 5 as a plot): relative attention cost vs Rel. (%).
- ``{variant}_{stat}_heatmap.png`` for each per-head statistic a variant reports (AHA's ``mu_f``: the paper's Fig.
  3, full-attention usage per layer (rows) and head (columns)), from each
  run's final evaluation (real tokens only, mean over the corpora).
- ``{variant}_{stat}_heads.png`` (AHA Fig. 4 for ``mu_f``): every head's value, sorted, per run (same source).

A figure whose inputs no run holds is not drawn; :func:`draw_all` says which and why.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..evaluation.tables import relative_percent  # noqa: E402

from .collect import RunRecord  # noqa: E402
from .tables import Table, baselines, group_key  # noqa: E402


def _groups(runs: list[RunRecord], group_by: list[str]) -> dict[tuple, list[RunRecord]]:
    out: dict[tuple, list[RunRecord]] = {}
    for r in runs:
        out.setdefault(group_key(r, group_by), []).append(r)
    return out


def _panels(n: int, width: float = 5.5, height: float = 3.8):
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, list(axes[0])


def _label(ax, xlabel: str, ylabel: str, title: str, legend: bool = True) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if legend:
        ax.legend(fontsize=7)


def _save(fig, path: Path, rect=None) -> Path:
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _eval_points(run: RunRecord, base: RunRecord, metric: str) -> list[tuple[int, float]]:
    """(step, Rel. %) at every step where both runs have an evaluation with all three corpora."""
    ref = {e["step"]: e for e in base.evals if e.get("step") is not None}
    pts = [(e["step"], relative_percent(e, ref[e["step"]], metric)) for e in run.evals if e.get("step") in ref]
    return [(s, v) for s, v in pts if v is not None]


def _valid_points(run: RunRecord, base: RunRecord) -> list[tuple[int, float]]:
    """(step, validation perplexity ratio %) at every step where both runs logged ``valid_loss``."""
    ref = {row["step"]: row["valid_loss"] for row in base.valid_rows()}
    return [(row["step"], math.exp(row["valid_loss"] - ref[row["step"]]) * 100)
            for row in run.valid_rows() if row["step"] in ref]


def relative_ppl_vs_step(runs: list[RunRecord], report: dict, out: Path) -> Path | None:
    """Per run: evaluations at >= 2 common steps give the paper's Rel. (%); otherwise validation loss."""
    group_by = list(report.get("group_by") or [])
    base = baselines(runs, report.get("baseline"), group_by)
    metric = report.get("metric", "token_perplexity")
    series = []
    for r in runs:
        b = base.get(group_key(r, group_by))
        if b is None or b is r:
            continue
        pts, source = _eval_points(r, b, metric), "eval"
        if len(pts) < 2:
            pts, source = _valid_points(r, b), "valid"
        if pts:
            series.append((group_key(r, group_by), f"{r.name} ({source})", pts))
    if not series:
        return None
    keys = list(dict.fromkeys(s[0] for s in series))
    fig, axes = _panels(len(keys))
    for ax, key in zip(axes, keys):
        for _, name, pts in (s for s in series if s[0] == key):
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name)
        ax.axhline(100.0, color="black", lw=1, ls="--")
        _label(ax, "step", "perplexity / baseline (%)", " ".join(key) or "relative perplexity")
    return _save(fig, out / "relative_ppl_vs_step.png")


def loss_curves(runs: list[RunRecord], report: dict, out: Path) -> Path | None:
    groups = {k: [r for r in g if r.train_rows()] for k, g in _groups(runs, list(report.get("group_by") or [])).items()}
    groups = {k: g for k, g in groups.items() if g}
    if not groups:
        return None
    fig, axes = _panels(len(groups))
    for ax, (key, group) in zip(axes, groups.items()):
        for r in group:
            rows = r.train_rows()
            ax.plot([x["step"] for x in rows], [x["loss"] for x in rows], lw=1, label=r.name)
        _label(ax, "step", "training loss", " ".join(key) or "training loss")
    return _save(fig, out / "loss_curves.png")


def cost_vs_perplexity(table: Table, runs: list[RunRecord], out: Path) -> Path | None:
    if "Cost" not in table.columns:
        return None
    ci, ri = table.columns.index("Cost"), table.columns.index("Rel. (%)")
    kinds: dict[str, list[tuple[float, float, str]]] = {}
    for r, row in zip(runs, table.rows):
        if row[ri] is not None:
            label = r.variant.label(r.cfg.model)
            kinds.setdefault(label, []).append((row[ci], row[ri], r.name))
    if not kinds:
        return None
    fig, axes = _panels(1, 6.5, 4.5)
    ax = axes[0]
    for kind, pts in kinds.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=kind)
        for x, y, name in pts:
            ax.annotate(name, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    _label(ax, "attention FLOPs per token, relative to vanilla", "Rel. perplexity (%)", "cost vs perplexity")
    return _save(fig, out / "cost_vs_perplexity.png")


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
        fig, axes = _panels(len(tables), 4.8, 3.8)
        for ax, (run_name, t) in zip(axes, tables):
            im = ax.imshow(t, vmin=0.0, vmax=1.0, cmap="Blues_r", aspect="auto")
            ax.set_xticks(range(len(t[0])))
            ax.set_yticks(range(len(t)))
            _label(ax, "head", "layer", run_name, legend=False)
            fig.colorbar(im, ax=ax, fraction=0.046)
        fig.suptitle(f"{name.upper()} {stat} per layer and head (final evaluation, mean over corpora): {meaning}",
                     fontsize=8)
        files.append(_save(fig, out / f"{name}_{stat}_heatmap.png", rect=(0, 0, 1, 0.92)))

        fig, axes = _panels(1, 6.5, 4.0)
        for run_name, t in tables:
            values = sorted((v for row in t for v in row), reverse=True)
            axes[0].plot(range(1, len(values) + 1), values, marker=".", label=run_name)
        _label(axes[0], "head rank", f"{stat} (final evaluation)", f"{name.upper()} heads sorted by {stat}")
        files.append(_save(fig, out / f"{name}_{stat}_heads.png"))
    return files, skipped


def draw_all(runs: list[RunRecord], table: Table, report: dict, out: Path) -> tuple[list[Path], list[str]]:
    """Every figure that the runs support; returns (files, reasons for those not drawn)."""
    out.mkdir(parents=True, exist_ok=True)
    files, skipped = [], []
    for name, fn in (("relative perplexity vs step", lambda: relative_ppl_vs_step(runs, report, out)),
                     ("loss curves", lambda: loss_curves(runs, report, out)),
                     ("cost vs perplexity", lambda: cost_vs_perplexity(table, _ordered(runs, table), out))):
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
