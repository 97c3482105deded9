"""The figures issue 35 asks for beside the report's, from the published run files of results/results-round2 (and
results-round2-finetune when it exists); scripts/results_round2.sh --publish runs it.

    python scripts/results_round2_figures.py [RESULTS_DIR]     # default results/results-round2

- ``mu_f_vs_window.png``: AHA's full-attention usage (final evaluation, mean over both held-out texts, layers and
  heads: the report's mu_f) against the window, one marker per pretrained run (seed 1 and seed 2), their mean as a
  line, each head as a faint dot; the fine-tuned runs as a second line when published.
- ``learning_curves_per_budget.png``: validation loss (the in-training evaluation on the same held-out sequences
  for every run of seed 1) against the step, one panel per budget (1x, 2x, 4x) for vanilla, SWA, DAR d/4 and MSWA;
  the last panel the final Rel. (%) of each against vanilla at the same budget.
Only runs that are published are drawn; a panel without runs says so.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SCALING = {"vanilla": "vanilla", "swa": "SWA w=64", "dar": "DAR d/4", "mswa": "MSWA"}
BUDGETS = ("1x", "2x", "4x")


def runs_of(folder: Path) -> dict[str, dict]:
    """Each published run: its axes, config values, metrics and final evaluation."""
    out = {}
    for d in sorted((folder / "runs").glob("*/run.json")):
        run = d.parent
        ev = run / "eval" / "perplexity.json"
        out[run.name] = {"axes": json.loads(d.read_text()).get("axes", {}),
                         "metrics": [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
                         if (run / "metrics.jsonl").is_file() else [],
                         "eval": json.loads(ev.read_text()) if ev.is_file() else None}
    return out


def heads_mu_f(ev: dict) -> list[float]:
    """Per (layer, head) mu_f, mean over the evaluated corpora."""
    per = []
    for c in ev["corpora"].values():
        stats = c.get("attention_stats") or {}
        layers = sorted((k for k in stats if k.endswith("/mu_f")), key=lambda k: int(k[5:].split("/")[0]))
        per.append([x for k in layers for x in stats[k]])
    return [statistics.fmean(h) for h in zip(*per)]


def mu_f_figure(runs: dict, ft: dict, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    series = [("pretrained (800 steps)", {n: r for n, r in runs.items() if r["axes"].get("variant") == "aha"}, "C0"),
              ("fine-tuned from vanilla-seed3 (200 steps)",
               {n: r for n, r in ft.items() if r["axes"].get("variant") == "aha-ft"}, "C3")]
    for label, group, color in series:
        by_w: dict[int, list[float]] = {}
        for name, r in group.items():
            if not r["eval"]:
                continue
            w = int(r["axes"]["window"])
            heads = heads_mu_f(r["eval"])
            by_w.setdefault(w, []).append(100 * statistics.fmean(heads))
            ax.scatter([w] * len(heads), [100 * h for h in heads], s=8, color=color, alpha=0.18, linewidths=0)
            ax.scatter([w], [100 * statistics.fmean(heads)], s=30, color=color,
                       marker="o" if r["axes"].get("seed", "seed1") == "seed1" else "s")
        if by_w:
            ws = sorted(by_w)
            ax.plot(ws, [statistics.fmean(by_w[w]) for w in ws], color=color, label=f"AHA {label}: mean")
    ax.set_xscale("log", base=2)
    ax.set_xticks([16, 32, 64, 128], labels=["16", "32", "64", "128"])
    ax.set_xlabel("window w (bytes)")
    ax.set_ylabel("mu_f (%): share of (token, head) routed to full attention")
    ax.set_title("AHA: full-attention usage against the window\n(circle: seed 1, square: seed 2; dots: single heads)",
                 fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def curves_figure(runs: dict, out: Path) -> None:
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    final: dict[str, dict[str, float]] = {}
    for ax, budget in zip(axes, BUDGETS):
        drawn = False
        for i, (variant, label) in enumerate(SCALING.items()):
            for name, r in runs.items():
                a = r["axes"]
                if a.get("variant") != variant or a.get("budget") != budget or a.get("seed") != "seed1":
                    continue
                if variant in ("dar",) and a.get("d_down") != "32":
                    continue
                rows = [m for m in r["metrics"] if "valid_loss" in m]
                if rows:
                    ax.plot([m["step"] for m in rows], [m["valid_loss"] for m in rows], color=f"C{i}", label=label)
                    drawn = True
                if r["eval"]:
                    final.setdefault(variant, {})[budget] = r["eval"]
        ax.set_title(f"{budget} budget: validation loss", fontsize=10)
        ax.set_xlabel("step (16 x 512 bytes)")
        if drawn:
            ax.set_ylim(top=min(ax.get_ylim()[1], 2.3))
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no run published yet", ha="center", transform=ax.transAxes)
    axes[0].set_ylabel("validation loss (nats per byte)")
    ax = axes[3]
    base = final.get("vanilla", {})
    for i, (variant, label) in enumerate(SCALING.items()):
        pts = []
        for k, budget in enumerate(BUDGETS):
            ev, b = final.get(variant, {}).get(budget), base.get(budget)
            if ev and b:
                pts.append((k, statistics.fmean(ev["corpora"][c]["byte_perplexity"] / b["corpora"][c]["byte_perplexity"]
                                                for c in ("wikitext103", "wikipedia")) * 100))
        if pts:
            ax.plot(*zip(*pts), marker="o", color=f"C{i}", label=label)
    ax.set_xticks(range(3), labels=BUDGETS)
    ax.set_xlabel("budget (1x = 6.55M bytes)")
    ax.set_ylabel("Rel. (%) against vanilla at the same budget")
    ax.set_title("final evaluation", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else "results/results-round2")
    runs = runs_of(folder)
    ft_folder = folder.parent / f"{folder.name}-finetune"
    ft = runs_of(ft_folder) if (ft_folder / "runs").is_dir() else {}
    (folder / "figures").mkdir(exist_ok=True)
    mu_f_figure(runs, ft, folder / "figures" / "mu_f_vs_window.png")
    curves_figure(runs, folder / "figures" / "learning_curves_per_budget.png")
    print(f"wrote {folder / 'figures'}/mu_f_vs_window.png, learning_curves_per_budget.png")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
