"""The paper's tables from result files, in Markdown and LaTeX.

* Table 1 (and Tables 8-11) from a fit's ``results.json``: per method and ``d'``, the test KL and attention-output
  MSE averaged over the layers (or of one layer);
* Tables 2-3 from a task grid (``grid.json`` and lm-eval's results): per ``d'`` and ``l``, the task average and
  the KV-cache saving; Appendix D's per-task tables.

A value the files do not hold is printed as ``--``, never as a number.
"""

from __future__ import annotations

from ..evaluation.tables import MISSING
from ..report.tables import Table
from .fit import load_results
from .instances import DimPOError
from .methods import METHODS
from .tasks import TASK_TITLES, cell_scores, load_grid

METHOD_TITLES = {"random": "Rand", "pca": "PCA", "triplet": "Triplet", "cpo": "CPO", "simpo": "SimPO",
                 "orpo": "ORPO", "dimpo": "DimPO"}


def _fixed(x: float | None, digits: int) -> str:
    """``x`` to ``digits`` decimals; in scientific notation when that would print it as 0."""
    if x is None:
        return MISSING
    return f"{x:.{digits}f}" if x == 0 or abs(x) >= 10 ** -digits else f"{x:.1e}"


def table1(out: str, layer: int | None = None) -> Table:
    """Test KL and MSE per method (rows, the paper's order) and ``d'`` (columns), averaged over the fitted layers
    (or of ``layer``)."""
    results = load_results(out)
    settings = results["settings"]
    done = sorted(int(l) for l in results["layers"])
    layers = done if layer is None else [layer] if layer in done else []
    if layer is not None and not layers:
        raise DimPOError(f"{out}: layer {layer} is not fitted (fitted: {', '.join(map(str, done)) or 'none'})")
    dims = settings["dims"]
    rows = []
    for method in [m for m in METHODS if m in settings["methods"]]:
        cells = [METHOD_TITLES[method]]
        for d in dims:
            scores = [results["layers"][str(l)]["results"][method][str(d)]["test"] for l in layers]
            for metric, digits in (("kl", 2), ("mse", 3)):
                cells.append(_fixed(sum(s[metric] for s in scores) / len(scores), digits) if scores else MISSING)
        rows.append(cells)
    total = settings["model"]["shape"]["num_layers"]
    where = (f"layer {layer}" if layer is not None else
             f"averaged over {len(layers)} of {total} layers" + ("" if len(layers) == total else " (fit unfinished)"))
    notes = [f"Attention-weight KL divergence and attention-output MSE on the test documents ({where}); "
             f"{settings['model']['source']['checkpoint']}, {len(settings['data']['test']['documents'])} test "
             f"documents of {settings['seq_len']} tokens, every query of every head."
             + ("" if settings.get("pairs", "top-bottom") == "top-bottom" else
                f" Trained methods on the key selection {settings['pairs']} (Appendix C).")]
    columns = ["Method"] + [f"{d} {m}" for d in dims for m in ("KL", "MSE")]
    return Table(f"Projection approaches, d' in {{{', '.join(map(str, dims))}}}", columns, rows, notes)


def grid_axes(grid: dict) -> tuple[list[int], list[int], dict[tuple[int, int], dict]]:
    """A grid's ``d'`` values (descending), ``l`` values (ascending) and its cells by ``(d', l)``."""
    cells = grid["cells"]
    return (sorted({c["d_proj"] for c in cells}, reverse=True), sorted({c["layers"] for c in cells}),
            {(c["d_proj"], c["layers"]): c for c in cells})


def table2(out: str) -> Table:
    """Task average (in %) and KV-cache saving per ``d'`` (rows, descending) and ``l`` (columns)."""
    grid = load_grid(out)
    tasks = grid["tasks"]
    dims, counts, by_key = grid_axes(grid)
    rows = []
    for d in dims:
        cells = [str(d)]
        for l in counts:
            cell = by_key.get((d, l))
            scores = list(cell_scores(cell, tasks).values()) if cell else [None]
            avg = None if None in scores else 100 * sum(scores) / len(scores)
            cells.append(f"{_fixed(avg, 1)} / {100 * cell['kv_cache_saving']:.2f}%" if cell else MISSING)
        rows.append(cells)
    names = ", ".join(TASK_TITLES.get(t, t) + f" ({m})" for t, m in tasks.items())
    notes = [f"Average score (%) over {names}, and the share of the KV cache saved (l / L x (1 - d'/d_h) x 50%), "
             f"for the last l of {grid['shape']['num_layers']} layers projected to d' with {grid['method']}; "
             f"{grid['checkpoint']}."]
    return Table("Task average / KV-cache saving", ["d' / l"] + [str(l) for l in counts], rows, notes)


def task_tables(out: str) -> list[Table]:
    """Appendix D: one table per task, score (%) per ``d'`` and ``l``."""
    grid = load_grid(out)
    dims, counts, by_key = grid_axes(grid)
    tables = []
    for task, metric in grid["tasks"].items():
        rows = []
        for d in dims:
            scores = [cell_scores(by_key[d, l], {task: metric})[task] if (d, l) in by_key else None for l in counts]
            rows.append([str(d)] + [_fixed(None if s is None else 100 * s, 2) for s in scores])
        tables.append(Table(f"{TASK_TITLES.get(task, task)} ({metric})", ["d' / l"] + [str(l) for l in counts],
                            rows, [f"{grid['checkpoint']}, {grid['method']} projections."]))
    return tables
