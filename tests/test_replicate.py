"""The small replication recipe (scripts/replicate.sh, configs/sweeps/replicate-small.yml): the text pack removes the
WikiText-103 validation/test articles from training, the budget follows its formula, the sweep plans its 13 runs,
and the whole pipeline runs at toy size on CPU (``--smoke``) with a report that reads the result files."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest
from trainrun import ROOT, train_env

from neox_dar.sweep.budget import budget

FIXTURES = ROOT / "tests" / "fixtures" / "replicate"  # excerpts of ../shared/data (tests/fixtures/replicate/SOURCES.md)
RUNS = ["vanilla-seed1", "vanilla-seed2", "vanilla-seed3", "dar-seed1", "dar-seed2", "dar-seed3", "uniform-seed1",
        "uniform-seed2", "uniform-seed3", "swa-w128", "mswa-w128", "aha-w32", "aha-w128"]


def test_pack_removes_wikitext_articles_and_keeps_the_official_test_file(tmp_path):
    out = tmp_path / "text"
    done = subprocess.run([sys.executable, "-m", "data_prep.wikipedia", "--wikipedia", FIXTURES / "wikipedia",
                           "--wikitext", FIXTURES / "wikitext103", "--out", out, "--max-mib", "1"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    train = manifest["train"]
    assert train["articles_read"] == 31 and train["articles"] == 30 and train["removed_wikitext_articles"] == 1
    assert train["removed"] == [{"title": "Nero", "id": "21632", "wikitext_split": "test", "match": "exact"}]
    assert gzip.decompress((out / "wiki.test.tokens.gz").read_bytes()) == (FIXTURES / "wikitext103" /
                                                                           "wiki.test.tokens").read_bytes()
    assert manifest["heldout"]["articles"] == 3 and (out / "SOURCES.md").is_file()
    bad = subprocess.run([sys.executable, "-m", "data_prep.wikipedia", "--wikipedia", tmp_path, "--wikitext",
                          FIXTURES / "wikitext103", "--out", tmp_path / "x"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def _measured(d, tokens_per_sec: float, wall: float, steps: int = 40):
    """A measured run directory: its config (batch 32 x 2048) and metrics rows every 5 steps."""
    d.mkdir(parents=True)
    (d / "config.yml").write_text((ROOT / "configs" / "pythia-14m.yml").read_text()
                                  + "\nseq_length: 2048\ntrain_batch_size: 32\n")
    rows = [{"step": s, "loss": 5.0, "tokens_per_sec": tokens_per_sec * (0.5 if s == 5 else 1.0)}
            for s in range(5, steps + 1, 5)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "wall_seconds").write_text(f"{wall}\n")


def test_budget_follows_its_formula(tmp_path):
    """The slowest variant's median tokens/s (the first, warm-up row left out) and the worst part set train_iters."""
    m = tmp_path / "measure"
    _measured(m / "vanilla-seed1", 400_000.0, 20.0)
    _measured(m / "dar-seed1", 300_000.0, 25.0)
    b = budget(m, [3, 5, 5], part_seconds=510, setup_seconds=30, measure_seconds=60, eval_seconds=10)
    step = 32 * 2048
    startup = max(20.0 - 40 * step / 400_000.0, 25.0 - 40 * step / 300_000.0)
    overhead = startup + 10
    seconds = min((510 - 30 - 60 - 3 * overhead) / 3, (510 - 30 - 5 * overhead) / 5)
    assert b["tokens_per_sec"] == 300_000.0 and b["overhead_seconds_per_run"] == pytest.approx(overhead)
    assert b["train_iters"] == int(0.9 * seconds * 300_000.0 // step)
    assert b["tokens_per_run"] == b["train_iters"] * step
    with pytest.raises(ValueError, match="no time left to train"):
        budget(m, [3, 5, 5], part_seconds=100, setup_seconds=30, measure_seconds=60, eval_seconds=10)


def test_recipe_plans_its_thirteen_runs(tmp_path, tokenized_sample):
    done = subprocess.run([sys.executable, "-m", "neox_dar.sweep", "configs/sweeps/replicate-small.yml", "plan",
                           "--out", tmp_path / "runs", f"data_path={tokenized_sample}", "train_iters=7"],
                          cwd=ROOT, capture_output=True, text=True, env=train_env())
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if (p / "config.yml").is_file()) == sorted(RUNS)
    dar = (tmp_path / "runs" / "dar-seed2" / "config.yml").read_text()
    assert "attention_type: dar" in dar and "seq_length: 2048" in dar and "train_iters: 7" in dar
    assert "window_size: 32" in (tmp_path / "runs" / "aha-w32" / "config.yml").read_text()


def test_smoke_runs_the_whole_pipeline_and_the_report_reads_the_results(tmp_path):
    """Pack, the three parts (tokenize, measure, budget, train, evaluate on WikiText-103 test, held-out Wikipedia,
    C4 and FineWeb-Edu) and the report at toy size; then a changed perplexity in one run's result file changes the
    table the report prints."""
    work = tmp_path / "smoke"
    env = {**train_env(), "SHARED": str(FIXTURES)}
    done = subprocess.run(["bash", "scripts/replicate.sh", "--smoke", "--work", str(work)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    budget_file = json.loads((work / "budget.json").read_text())
    assert budget_file["train_iters"] == 2 and budget_file["max_iters"] == 2
    table = json.loads((work / "report" / "table.json").read_text())
    rows = {r[0]: dict(zip(table["columns"], r)) for r in table["rows"]}
    smoke_runs = ["vanilla-seed1", "dar-seed1", "uniform-seed1", "mswa-w128", "aha-w32"]
    assert set(smoke_runs) <= set(rows)
    assert all(isinstance(rows[r]["WikiText-103"], float) for r in smoke_runs)
    assert "wikipedia" in table["columns"] and "## Targets" in (work / "report" / "targets.md").read_text()
    for run in smoke_runs:  # trained and evaluated runs drop their checkpoints; results stay
        assert not (work / "runs" / run / "checkpoints").exists()
        assert "wikipedia" in json.loads((work / "runs" / run / "eval" / "perplexity.json").read_text())["corpora"]

    result = work / "runs" / "dar-seed1" / "eval" / "perplexity.json"
    data = json.loads(result.read_text())
    data["corpora"]["wikitext103"]["token_perplexity"] *= 2  # one value changed by hand
    result.write_text(json.dumps(data))
    again = subprocess.run(["bash", "scripts/replicate.sh", "--report", "--work", str(work)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    changed = json.loads((work / "report" / "table.json").read_text())
    new_rows = {r[0]: dict(zip(changed["columns"], r)) for r in changed["rows"]}
    assert new_rows["dar-seed1"]["WikiText-103"] == pytest.approx(2 * rows["dar-seed1"]["WikiText-103"], rel=1e-3)
    assert new_rows["vanilla-seed1"] == rows["vanilla-seed1"]


def test_bad_arguments_are_one_line_errors():
    for args, message in ((["--part", "4"], "--part is 1, 2 or 3"), ([], "say what to do"),
                          (["--model", "70m", "--report"], "--model is 14m or 31m")):
        done = subprocess.run(["bash", "scripts/replicate.sh", *args], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ})
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
