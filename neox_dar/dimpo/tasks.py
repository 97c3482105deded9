"""The paper's Tables 2-3 (and Appendix D) on one model: lm-eval task scores and the KV-cache saving for the last
``l`` layers projected to ``d'``.

``plan_grid`` lays out the cells (one per ``d'`` and ``l``; every ``d'`` shares the unprojected ``l = 0`` run) and
writes ``OUT/grid.json``; ``run_grid`` runs lm-eval for each cell without results, through the project's lm-eval
model (``python -m eval.lm_eval_cli --model neox_dar``, a separate process: the ``eval`` package builds on this one,
not the reverse), each into ``OUT/l{l}-d{d'}/`` (``OUT/l0/`` for the unprojected model); :func:`cell_scores`
reads lm-eval's results files back.

The tasks are DimPO's Table 2 (lm-eval's names and the paper's metrics): :data:`PAPER_TASKS`, zero-shot as in the
paper (``--num_fewshot 0``; options in ``lm_eval_args`` come after it and win). The ``l`` values are the paper's own
grid for the depths it reports (:data:`PAPER_LAYERS`: Tables 12-16 for 16, 28, 32 and 36 layers), else Table 2's
scaled to the depth. The paper ran lm-eval 0.4.9.1 (:data:`PAPER_LM_EVAL`); ``grid.json`` records the installed
version, and each cell's lm-eval results file its own (``lm_eval_version``, read back by :func:`cell_lm_eval_version`).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..rundir import write_text_atomic
from ..top_packages import module_name
from .files import read_result
from .instances import DimPOError
from .projections import Projections, kv_cache_saving, projected_layers

GRID = "grid.json"
FORMAT = "neox_dar.dimpo.tasks"
PAPER_TASKS = {"arc_challenge": "acc_norm", "hellaswag": "acc_norm", "truthfulqa_mc2": "acc", "mmlu": "acc",
               "winogrande": "acc"}
TASK_TITLES = {"arc_challenge": "ARC-Challenge", "hellaswag": "HellaSwag", "truthfulqa_mc2": "TruthfulQA-mc2",
               "mmlu": "MMLU", "winogrande": "WinoGrande"}
LAYER_FRACTIONS = (1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4, 7 / 8, 15 / 16, 1)  # Table 2's l for L = 32, as fractions
PAPER_LAYERS = {  # the l columns of the paper's tables, by the model's depth
    16: [0, 2, 4, 6, 8, 10, 12, 14, 16],  # Table 12, Llama-3.2-1B-Instruct
    28: [0, 2, 4, 7, 10, 12, 14, 16, 18, 21, 24, 26, 28],  # Tables 13 and 16, Llama-3.2-3B and Qwen2.5-7B-Instruct
    32: [0, 2, 4, 8, 12, 16, 20, 24, 28, 30, 32],  # Tables 2 and 14, Llama-3.1-8B-Instruct
    36: [0, 2, 4, 6, 9, 12, 15, 18, 21, 24, 27, 30, 32, 34, 36],  # Tables 3 and 15, Qwen3-4B-Instruct
}
PAPER_LM_EVAL = "0.4.9.1"  # "harness 0.4.9.1" (Sec. 4)


def default_layers(num_layers: int) -> list[int]:
    """The paper's ``l`` values for ``num_layers`` (:data:`PAPER_LAYERS`), else Table 2's (0, 2, 4, 8, 12, ..., 28,
    30, 32 for 32 layers) scaled to ``num_layers``."""
    if num_layers in PAPER_LAYERS:
        return list(PAPER_LAYERS[num_layers])
    return sorted({l for l in (0, 2, 4, *(round(num_layers * f) for f in LAYER_FRACTIONS)) if l <= num_layers})


def lm_eval_version() -> str:
    """The installed lm-evaluation-harness version (``not installed`` when it is absent)."""
    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return "not installed"


def parse_tasks(spec: str) -> dict[str, str]:
    """``"name:metric,name:metric"`` (or ``paper``) -> ``{task: metric}``."""
    if spec == "paper":
        return dict(PAPER_TASKS)
    tasks = {}
    for item in spec.split(","):
        name, sep, metric = item.strip().partition(":")
        if not name or not sep or not metric:
            raise DimPOError(f"--tasks wants name:metric pairs separated by commas (or 'paper'), got '{item}'")
        tasks[name] = metric
    return tasks


def cell_dir(out: Path, layers: int, d: int) -> Path:
    return out / ("l0" if layers == 0 else f"l{layers}-d{d}")


def plan_grid(checkpoint: str, projections: list[tuple[str, Projections]], layer_counts: list[int],
              tasks: dict[str, str], out: str | Path, lm_eval_args: list[str]) -> dict:
    """The cells of the grid, written to ``OUT/grid.json``; each names its output folder and its lm-eval command.
    ``projections``: (path, file) per ``d'``, already checked against the model for the largest ``l``."""
    out = Path(out)
    shape = projections[0][1].shape
    cells = []
    for path, proj in projections:
        for l in layer_counts:
            model_args = f"checkpoint={checkpoint}" + (f",dimpo={path},dimpo_layers={l}" if l else "")
            cells.append({
                "d_proj": proj.d_proj, "layers": l, "projected": projected_layers(shape["num_layers"], l),
                "kv_cache_saving": kv_cache_saving(l, shape["num_layers"], proj.d_proj, shape["head_dim"]),
                "projection": path if l else None, "output": str(cell_dir(out, l, proj.d_proj)),
                "command": [sys.executable, "-m", module_name("eval.lm_eval_cli"), "--model", "neox_dar",
                            "--model_args", model_args, "--tasks", ",".join(tasks), "--num_fewshot", "0",
                            "--output_path", str(cell_dir(out, l, proj.d_proj)), *lm_eval_args]})
    grid = {"format": FORMAT, "checkpoint": checkpoint, "shape": shape, "method": projections[0][1].method,
            "tasks": tasks, "lm_eval_version": lm_eval_version(), "paper_lm_eval_version": PAPER_LM_EVAL,
            "cells": cells}
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / GRID, json.dumps(grid, indent=1))
    return grid


def load_grid(out: str | Path) -> dict:
    return read_result(out, GRID, FORMAT, "tasks")


def results_file(output: str | Path) -> Path | None:
    """The newest lm-eval ``results_*.json`` under a cell's output folder, or None."""
    found = sorted(Path(output).rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def cell_scores(cell: dict, tasks: dict[str, str]) -> dict[str, float | None]:
    """``{task: score}`` of a cell from its lm-eval results (None: not run, or the task/metric is missing)."""
    path = results_file(cell["output"])
    if path is None:
        return {t: None for t in tasks}
    results = json.loads(path.read_text()).get("results", {})
    return {t: results.get(t, {}).get(f"{metric},none") for t, metric in tasks.items()}


def cell_lm_eval_version(cell: dict) -> str | None:
    """The lm-eval version a cell's results were produced with (lm-eval writes it into its results file), or None
    when the cell has not run or the file does not say."""
    path = results_file(cell["output"])
    return None if path is None else json.loads(path.read_text()).get("lm_eval_version")


def run_grid(grid: dict) -> list[str]:
    """Run lm-eval for every cell whose folder holds no results (each folder once); returns the folders run."""
    todo = {}
    for cell in grid["cells"]:
        if results_file(cell["output"]) is None:
            todo.setdefault(cell["output"], cell)
    for output, cell in todo.items():
        print(f"dimpo: l={cell['layers']} d'={cell['d_proj']}: {shlex.join(cell['command'])}", file=sys.stderr)
        done = subprocess.run(cell["command"])
        if done.returncode != 0:
            raise DimPOError(f"lm-eval failed (exit {done.returncode}) for l={cell['layers']} d'={cell['d_proj']}; "
                             f"its output folder is {output}")
    return list(todo)
