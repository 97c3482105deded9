"""scripts/results_round2.sh and scripts/results_round2_figures.py (issue 35's runner and figures) run as
docs/experiments.md shows them: the task list in the sweeps' order (the short studies before the longer budgets), a bad argument as one line, and the figures drawn
from the published run files."""

from __future__ import annotations

import os
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
    bad = subprocess.run(["bash", "scripts/results_round2.sh", "--publish-checkpoint"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--publish-checkpoint needs one RUN" in bad.stderr
    for args, message in [(["nope"], "no run 'nope' in configs/sweeps/results-round2.yml"),
                          (["dar-4x", "0"], "STEPS must be a positive integer, got '0'"),
                          ([], "--rebuild needs RUN and optionally STEPS")]:
        bad = subprocess.run(["bash", "scripts/results_round2.sh", "--rebuild", *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and message in bad.stderr, (args, bad.stderr)
        assert not bad.stdout  # refused before the data or the code is prepared


def test_the_figures_are_drawn_from_the_published_runs(tmp_path):
    folder = tmp_path / "results-round2"
    shutil.copytree(ROOT / "results" / "results-round2", folder)
    res = subprocess.run([sys.executable, "scripts/results_round2_figures.py", str(folder)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("mu_f_vs_window.png", "learning_curves_per_budget.png"):
        assert (folder / "figures" / name).read_bytes()[:4] == b"\x89PNG", name


def test_publish_dimpo_gives_the_committed_study_back_from_the_runners_folder(tmp_path):
    """``--publish-dimpo`` on the DimPO study as the runner leaves it (the machine's absolute paths; the code run from
    its worktree, runs/round2-code) writes results.json, fit.log and the projections (tensors and metadata) with
    repository-relative paths, table.md, and docs/experiments.md's table: each the committed file, byte for byte."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from neox_dar.report.publish import block, replace_block

    repo = tmp_path / "repo"
    root = f"{repo}/"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "results_round2.sh", repo / "scripts")
    (repo / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "experiments.md", repo / "docs")
    replace_block(repo / "docs" / "experiments.md", "results-round2-dimpo", "stale")
    published = ROOT / "results" / "results-round2-dimpo"
    work = repo / "runs" / "results-round2-dimpo"
    (work / "projections").mkdir(parents=True)

    def absolute(text: str) -> str:
        text = text.replace("runs/", root + "runs/")
        return text.replace("python -m neox_dar.dimpo", f"python {root}runs/round2-code/neox_dar/dimpo/__main__.py")

    for name in ("results.json", "fit.log", "table.md"):
        (work / name).write_text(absolute((published / name).read_text()))
    projections = sorted((published / "projections").glob("*.safetensors"))
    for path in projections:
        with safe_open(str(path), "pt") as f:
            save_file({k: f.get_tensor(k) for k in f.keys()}, str(work / "projections" / path.name),
                      {k: absolute(v) for k, v in f.metadata().items()})
    assert root in (work / "results.json").read_text()

    res = subprocess.run(["bash", "scripts/results_round2.sh", "--publish-dimpo"], cwd=repo, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    out = repo / "results" / "results-round2-dimpo"
    for name in ("results.json", "fit.log", "table.md"):
        assert (out / name).read_text() == (published / name).read_text(), name
    assert len(projections) == len(list((out / "projections").iterdir())) > 0
    for path in projections:
        with safe_open(str(path), "pt") as theirs, safe_open(str(out / "projections" / path.name), "pt") as ours:
            assert ours.metadata() == theirs.metadata(), path.name
            assert all(ours.get_tensor(k).equal(theirs.get_tensor(k)) for k in theirs.keys()), path.name
    assert block(repo / "docs" / "experiments.md", "results-round2-dimpo") == \
        block(ROOT / "docs" / "experiments.md", "results-round2-dimpo")


def test_publish_checkpoint_writes_the_committed_start_from_the_runs_checkpoint(tmp_path):
    """``--publish-checkpoint vanilla-seed3`` on a run whose step-800 checkpoint holds the committed weights writes
    results/results-round2/checkpoints/vanilla-seed3 again, every file the committed one, byte for byte."""
    import json

    from neox_dar.rundir import write_manifest

    published = ROOT / "results" / "results-round2" / "checkpoints" / "vanilla-seed3"
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "results_round2.sh", repo / "scripts")
    step = repo / "runs" / "results-round2" / "vanilla-seed3" / "checkpoints" / "step_00000800"
    shutil.copytree(published, step)
    state = json.loads((step / "state.json").read_text())
    write_manifest(step, {"step": 800, "tokenizer_sha256": state["tokenizer_sha256"]})  # a training checkpoint's
    res = subprocess.run(["bash", "scripts/results_round2.sh", "--publish-checkpoint", "vanilla-seed3"], cwd=repo,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    out = repo / "results" / "results-round2" / "checkpoints" / "vanilla-seed3"
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in published.iterdir())
    assert all((out / p.name).read_bytes() == p.read_bytes() for p in published.iterdir())
