"""The paper's key-pair study (Appendix C, Fig. 4): the trained methods fitted with other key selections
(:mod:`.pairs`), test KL and MSE averaged over the layers and ``d'``, drawn against the selection's ``k``.

* (a) ``all:k``: every pair among ``k`` sampled keys, ``k`` in {2, 4, 8, 16}; DimPO on the same ``k`` keys;
* (b) ``distinct:k``: ``k`` pairs per query sharing no key, ``k`` in {1, 2, 4, 8, 16, 32, 64};
* (c) ``distance:k``: chosen and rejected ``k`` ranks apart, ``k`` in {1, 8, 16, 32, 64, 127}.

Each (panel, k) is one ``dimpo fit`` into ``OUT/{panel}-k{k}`` (a rerun resumes them); ``OUT/study.json`` holds
the averages and ``OUT/fig4.png`` the figure.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..report.tables import Table
from ..rundir import write_text_atomic
from .fit import load_results
from .methods import METHODS, PAIRWISE
from .tables import METHOD_TITLES

PANELS = {  # panel: (title, the paper's k, the methods it compares)
    "all": ("(a) all pairs of k sampled keys", (2, 4, 8, 16), PAIRWISE + ("dimpo",)),
    "distinct": ("(b) k distinct pairs per query", (1, 2, 4, 8, 16, 32, 64), PAIRWISE),
    "distance": ("(c) chosen and rejected k ranks apart", (1, 8, 16, 32, 64, 127), PAIRWISE),
}
STUDY = "study.json"


def fit_dir(out: str | Path, panel: str, k: int) -> Path:
    return Path(out) / f"{panel}-k{k}"


def averages(fit_out: str | Path) -> dict[str, dict[str, float]]:
    """Per method: test ``kl`` and ``mse`` averaged over the fitted layers and every ``d'`` of a fit."""
    results = load_results(fit_out)
    out = {}
    for method in results["settings"]["methods"]:
        scores = [r["results"][method][str(d)]["test"] for r in results["layers"].values()
                  for d in results["settings"]["dims"]]
        out[method] = {m: sum(s[m] for s in scores) / len(scores) for m in ("kl", "mse")}
    return out


def collect(out: str | Path, ks: dict[str, list[int]]) -> dict:
    """``{panel: {method: {k: {"kl", "mse"}}}}`` of the finished fits under ``out``; written to ``OUT/study.json``."""
    study: dict = {}
    for panel, values in ks.items():
        for k in values:
            for method, scores in averages(fit_dir(out, panel, k)).items():
                study.setdefault(panel, {}).setdefault(method, {})[str(k)] = scores
    write_text_atomic(Path(out) / STUDY, json.dumps(study, indent=1))
    return study


def tables(study: dict) -> list[Table]:
    """One table per panel: ``KL / MSE`` per method (rows, Table 1's order) and k (columns)."""
    out = []
    for panel, methods in study.items():
        ks = sorted({int(k) for by_k in methods.values() for k in by_k})
        rows = [[METHOD_TITLES[m]] + [f"{methods[m][str(k)]['kl']:.3f} / {methods[m][str(k)]['mse']:.2f}"
                                      if str(k) in methods[m] else "--" for k in ks]
                for m in METHODS if m in methods]
        out.append(Table(f"Fig. 4 {PANELS[panel][0]}", ["Method"] + [f"k = {k}" for k in ks],
                         rows, ["Test KL / attention-output MSE, each averaged over the layers and d'."]))
    return out


def draw(study: dict, path: str | Path, source: str) -> Path:
    """Fig. 4: one column per panel, KL (top) and MSE (bottom) against k, one line per method."""
    from ..report.plots import metric_grid

    columns = []
    for panel, methods in study.items():
        series = {METHOD_TITLES[m]: {metric: [(int(k), v[metric]) for k, v in by_k.items()] for metric in ("kl", "mse")}
                  for m, by_k in methods.items()}
        columns.append((PANELS[panel][0], series))
    return metric_grid(columns, {"kl": "attention KL", "mse": "output MSE"}, "k",
                       f"DimPO Fig. 4, key-pair selection: {source}",
                       ["Test KL and attention-output MSE, each averaged over the layers and d'."], Path(path))
