"""scripts/results_round2.sh and scripts/results_round2_figures.py (issue 35's runner and figures) run as
docs/experiments.md shows them: the task list in the sweeps' order (the short studies before the longer budgets), a bad argument as one line, and the figures drawn
from the published run files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from neox_dar.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]


def test_the_runner_lists_its_tasks_in_the_sweeps_order_and_refuses_a_bad_argument():
    res = subprocess.run(["bash", "scripts/results_round2.sh", "--list"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    tasks = [line.split(":", 1) for line in res.stdout.splitlines()]
    first = [run for sweep, run in tasks if sweep == "configs/sweeps/results-round2.yml"]
    names = [r.name for r in load_sweep(ROOT / "configs/sweeps/results-round2.yml").runs]
    assert first and set(first) <= set(names) and first == [n for n in names if n in first]  # round 1 reused
    # the short studies (fine-tuning, DimPO) before the 2x and 4x budgets, which take hours each
    order = [run for _, run in tasks]
    longer = [i for i, run in enumerate(order) if run.endswith(("-2x", "-4x"))]
    assert longer and order.index("vanilla-seed3") < order.index("aha-ft-w16") < min(longer)
    assert tasks[min(longer) - 1] == ["dimpo", "vanilla-seed3"]
    bad = subprocess.run(["bash", "scripts/results_round2.sh", "--bogus"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown argument '--bogus'" in bad.stderr


def test_the_figures_are_drawn_from_the_published_runs(tmp_path):
    folder = tmp_path / "results-round2"
    shutil.copytree(ROOT / "results" / "results-round2", folder)
    res = subprocess.run([sys.executable, "scripts/results_round2_figures.py", str(folder)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("mu_f_vs_window.png", "learning_curves_per_budget.png"):
        assert (folder / "figures" / name).read_bytes()[:4] == b"\x89PNG", name
