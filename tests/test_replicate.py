"""The small replication recipe (scripts/replicate.sh, configs/sweeps/replicate-small.yml): the text pack removes the
WikiText-103 validation/test articles from training, the budget check lays the plan's runs over parts and never
fails for lack of time, the sweep plans its 8 runs at >= 100M tokens each with two vanilla seeds, and the whole
pipeline runs at toy size on CPU (``--smoke``) with a report that reads the result files; the CPU replication
(``--cpu``, configs/sweeps/replicate-cpu.yml) runs end to end at toy size (``--cpu --smoke``) and resumes."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from trainrun import ROOT, train_env

from neox_dar.config import load_config
from neox_dar.sweep.budget import check, lay_out, main as budget_main

FIXTURES = ROOT / "tests" / "fixtures" / "replicate"  # excerpts of ../shared/data (tests/fixtures/replicate/SOURCES.md)
RUNS = ["vanilla-seed1", "vanilla-seed2", "dar", "uniform", "swa-w128", "mswa-w128", "aha-w32", "aha-w128"]


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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text"]  # built beside it, swapped in: no leftovers
    bad = subprocess.run([sys.executable, "-m", "data_prep.wikipedia", "--wikipedia", tmp_path, "--wikitext",
                          FIXTURES / "wikitext103", "--out", tmp_path / "x"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def _measured(d, tokens_per_sec: float, wall: float, steps: int = 40):
    """A measured run directory: its config (batch 32 x 2048) and metrics rows every 5 steps."""
    d.mkdir(parents=True)
    (d / "config.yml").write_text(load_config(ROOT / "configs" / "pythia-14m.yml",
                                              overrides=["seq_length=2048", "train_batch_size=32"]).to_yaml())
    rows = [{"step": s, "loss": 5.0, "tokens_per_sec": tokens_per_sec * (0.5 if s == 5 else 1.0)}
            for s in range(5, steps + 1, 5)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "wall_seconds").write_text(f"{wall}\n")


def test_lay_out_runs_over_parts():
    """Runs in order over parts: each (re)start pays the start-up, a run stopped at the deadline continues in the next
    part, a trained run pays its evaluation (in the next part when this one has no time left for it)."""
    # part 1 (300 s): 115 + 115 s (two runs), 10 s start-up + 60 s of run 3; part 2 (500 s): run 3's last 40 s + eval
    # (55 s), runs 4-6 (115 s each), run 7 starts (10 + 90 s); part 3: run 7's last 10 s + eval, run 8
    assert lay_out(8, 100, 10, 5, 300, 500) == (3, [2, 4, 2])
    assert lay_out(1, 1000, 10, 5, 300, 500) == (3, [0, 0, 1])  # one long run resumed twice
    assert lay_out(2, 1, 10, 5, 5, 5) == (None, [])  # a part shorter than one start-up: no progress
    assert lay_out(2, 1, 1, 50, 60, 40) == (None, [1])  # an evaluation longer than a later part never fits


def test_check_says_how_the_plan_fits_and_never_fails_for_time(tmp_path):
    """The slowest variant's median tokens/s (the first, warm-up row left out) and the largest start-up set the
    parts the fixed plan needs; a plan that needs more parts than planned, or a part too short to train, is said in
    the note (and budget.json), not an error."""
    m = tmp_path / "measure"
    _measured(m / "vanilla-seed1", 400_000.0, 20.0)
    _measured(m / "dar", 300_000.0, 25.0)
    step = 32 * 2048
    b = check(m, train_iters=1526, runs=8, part_seconds=510, setup_seconds=30, measure_seconds=60, eval_seconds=10,
              parts=3)
    startup = max(20.0 - 40 * step / 400_000.0, 25.0 - 40 * step / 300_000.0)
    train = 1526 * step / (0.9 * 300_000.0)
    assert b["tokens_per_sec"] == 300_000.0 and b["startup_seconds"] == pytest.approx(startup)
    assert b["train_seconds_per_run"] == pytest.approx(train) and b["tokens_per_run"] == 1526 * step
    assert (b["parts_needed"], b["runs_finished_per_part"]) == lay_out(8, train, startup, 10, 510 - 30 - 60, 510 - 30)
    assert b["parts_needed"] > 3 and not b["fits"] and f"about {b['parts_needed']} part(s)" in b["note"]
    assert "more than the 3 part(s) planned" in b["note"]
    small = check(m, train_iters=10, runs=2, part_seconds=510, setup_seconds=30, measure_seconds=60,
                  eval_seconds=10, parts=3)
    assert small["fits"] and small["parts_needed"] == 1 and "fits the 3 part(s) planned" in small["note"]
    # a part too short for one start-up: said, with what to change, and the command still writes budget.json
    out = tmp_path / "budget.json"
    assert budget_main([str(m), "--train-iters", "2", "--runs", "2", "--part-seconds", "40", "--setup-seconds", "30",
                        "--measure-seconds", "0", "--eval-seconds", "1", "--out", str(out)]) == 0
    tight = json.loads(out.read_text())
    assert tight["parts_needed"] is None and not tight["fits"] and "raise PART_SECONDS" in tight["note"]
    assert budget_main([str(tmp_path / "nothing"), "--train-iters", "2", "--runs", "2", "--part-seconds", "40",
                        "--setup-seconds", "0", "--measure-seconds", "0", "--eval-seconds", "0", "--out",
                        str(out)]) == 2  # no measured runs: a one-line error


def test_recipe_plans_eight_runs_of_at_least_100m_tokens_and_two_vanilla_seeds(tmp_path, tokenized_sample):
    """The GPU recipe's plan as `plan data_path=X` prints it: every run >= 100M tokens, vanilla at two seeds."""
    done = subprocess.run([sys.executable, "-m", "neox_dar.sweep", "configs/sweeps/replicate-small.yml", "plan",
                           "--out", tmp_path / "runs", f"data_path={tokenized_sample}"],
                          cwd=ROOT, capture_output=True, text=True, env=train_env())
    assert done.returncode == 0, done.stderr
    lines = [re.split(r"\s{2,}", line.strip()) for line in done.stdout.splitlines()[1:]]
    assert lines[0][:6] == ["run", "model", "attention", "steps", "batch", "tokens"]
    rows = {cells[0]: dict(zip(lines[0], cells)) for cells in lines[1:]}
    assert sorted(rows) == sorted(RUNS)
    for row in rows.values():
        batch, seq = (int(x) for x in row["batch"].split(" x "))
        assert int(row["steps"]) * batch * seq >= 100_000_000 and row["tokens"] == "0.10B", row
    vanilla = [r for r, row in rows.items() if row["attention"] == "vanilla"]
    seeds = {yaml.safe_load((tmp_path / "runs" / r / "config.yml").read_text())["seed"] for r in vanilla}
    assert len(vanilla) == 2 and seeds == {1, 2}
    dar = (tmp_path / "runs" / "dar" / "config.yml").read_text()
    assert "attention_type: dar" in dar and "seq_length: 2048" in dar and "train_iters: 1526" in dar
    assert "window_size: 32" in (tmp_path / "runs" / "aha-w32" / "config.yml").read_text()


def test_smoke_runs_the_whole_pipeline_and_the_report_reads_the_results(tmp_path):
    """Pack, a part (tokenize, measure, the plan's check, train and evaluate on WikiText-103 test, held-out
    Wikipedia, C4 and FineWeb-Edu with each run's progress on the terminal) and the report at toy size, with the
    smoke's default 600 s parts; then a changed perplexity in one run's result file changes the table the report
    prints."""
    work = tmp_path / "smoke"
    env = {**train_env(), "SHARED": str(FIXTURES)}
    env.pop("PART_SECONDS", None)
    done = subprocess.run(["bash", "scripts/replicate.sh", "--smoke", "--work", str(work)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "(parts of 600s)" in done.stdout and "its runs are trained and evaluated" in done.stdout
    assert "[measure vanilla-seed1] step 3/3" in done.stdout and "[worker 0] step 2/2" in done.stdout
    check_file = json.loads((work / "budget.json").read_text())
    assert check_file["train_iters"] == 2 and check_file["runs"] == 5 and check_file["parts_planned"] == 1
    assert f"budget: {check_file['note']}" in done.stdout
    table = json.loads((work / "report" / "table.json").read_text())
    rows = {r[0]: dict(zip(table["columns"], r)) for r in table["rows"]}
    smoke_runs = ["vanilla-seed1", "dar", "uniform", "mswa-w128", "aha-w32"]
    assert set(smoke_runs) <= set(rows)
    assert all(isinstance(rows[r]["WikiText-103"], float) for r in smoke_runs)
    targets = (work / "report" / "targets.md").read_text()
    assert "wikipedia" in table["columns"] and "## Targets: 1,024 tokens per run" in targets
    assert "- DAR d/4 - vanilla:" in targets and "no noise floor" in targets  # one vanilla seed in the smoke
    for run in smoke_runs:  # trained and evaluated runs drop their checkpoints; results stay
        assert not (work / "runs" / run / "checkpoints").exists()
        assert "wikipedia" in json.loads((work / "runs" / run / "eval" / "perplexity.json").read_text())["corpora"]

    result = work / "runs" / "dar" / "eval" / "perplexity.json"
    data = json.loads(result.read_text())
    data["corpora"]["wikitext103"]["token_perplexity"] *= 2  # one value changed by hand
    result.write_text(json.dumps(data))
    again = subprocess.run(["bash", "scripts/replicate.sh", "--report", "--work", str(work)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    changed = json.loads((work / "report" / "table.json").read_text())
    new_rows = {r[0]: dict(zip(changed["columns"], r)) for r in changed["rows"]}
    assert new_rows["dar"]["WikiText-103"] == pytest.approx(2 * rows["dar"]["WikiText-103"], rel=1e-3)
    assert new_rows["vanilla-seed1"] == rows["vanilla-seed1"]


def test_cpu_replication_at_toy_size_runs_resumes_and_reports(tmp_path):
    """`--cpu --smoke`: the CPU replication's pipeline (text, byte-level tokens, plan and run of
    configs/sweeps/replicate-cpu.yml with its paths under --work, the report) at a tiny budget on two runs (the
    baseline and the noise floor); run again, every step is skipped and the report is rebuilt."""
    work = tmp_path / "cpu"
    env = {**train_env(), "SHARED": str(FIXTURES)}
    done = subprocess.run(["bash", "scripts/replicate.sh", "--cpu", "--smoke", "--work", str(work)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "[sweep] vanilla-seed1: training" in done.stdout and "step 2/2" in done.stdout  # progress on the terminal
    sweep = yaml.safe_load((work / "replicate-cpu.yml").read_text())
    assert sweep["set"]["data_path"] == f"{work}/data/wiki_train"
    assert sweep["eval"]["extra"]["wikipedia"] == f"{work}/data/wiki_heldout100.jsonl.gz"
    table = json.loads((work / "report" / "table.json").read_text())
    rows = {r[0]: dict(zip(table["columns"], r)) for r in table["rows"]}
    for run in ("vanilla-seed1", "vanilla-seed2"):
        assert isinstance(rows[run]["WikiText-103"], float) and isinstance(rows[run]["wikipedia"], float), rows[run]
        assert rows[run]["Step"] == 2
    assert rows["dar"]["WikiText-103"] is None  # planned, not in the toy subset
    first = (work / "report" / "table.json").stat().st_mtime_ns
    again = subprocess.run(["bash", "scripts/replicate.sh", "--cpu", "--smoke", "--work", str(work)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert again.stdout.count("exists, skipped") == 3 and again.stdout.count("done, skipped") == 2
    assert "training (" not in again.stdout and (work / "report" / "table.json").stat().st_mtime_ns > first


def test_bad_arguments_are_one_line_errors():
    for args, message in ((["--part", "4"], "unknown argument '4'"), ([], "say what to do"),
                          (["--model", "70m", "--report"], "--model is 14m or 31m"),
                          (["--cpu", "--pack"], "--cpu goes alone or with --smoke"),
                          (["--pack", "--report"], "give one of"),
                          (["--cpu", "--smoke"], "--cpu --smoke needs --work DIR")):
        done = subprocess.run(["bash", "scripts/replicate.sh", *args], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ})
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, (
            args, done.stderr)


def test_a_part_without_a_pack_is_one_line(tmp_path):
    """--part before --pack: one line naming the missing pack, before any work (gzip's "No such file" after the
    work folder and its part counter were made)."""
    done = subprocess.run(["bash", "scripts/replicate.sh", "--part", "--pack-dir", str(tmp_path / "none"), "--work",
                           str(tmp_path / "work")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith(f"replicate.sh: error: no pack in {tmp_path / 'none'}")
    assert not (tmp_path / "work" / "parts").exists()
