"""The timings in the README and the docs are the committed result files' (the quickstart from
``bench/quickstart.py``, the suite and its fast tier from ``RECORD=... bash scripts/test.sh``, docs/training.md's CPU
throughput from ``bench/train_throughput.py``): no typed number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def minutes(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 60} min {s % 60:02d} s"


@pytest.mark.parametrize("result, key, sentence", [
    ("quickstart_cpu.json", "wall_s", "the quickstart took {} ("),
    ("test_suite_cpu.json", "wall_s", "the whole suite took {} ("),
    ("test_fast_tier_cpu.json", "wall_s", "the fast tier took {} ("),
])
def test_readme_timing_is_the_result_file(result, key, sentence):
    record = json.loads((ROOT / "bench" / "results" / result).read_text())
    assert record.get("pytest_exit", 0) == 0 and not record.get("git_dirty", record.get("provenance", {}).get(
        "git_dirty")), f"{result}: measured on a failing run or a tree with local changes"
    expected = sentence.format(minutes(record[key]))
    assert expected in " ".join(README.split()), f"README should say '{expected}' (bench/results/{result})"


@pytest.mark.parametrize("result", ["train_throughput_cpu.json", "train_throughput_cpu_d256_l4_t512.json"])
def test_training_docs_throughput_row_is_the_result_file(result):
    """docs/training.md's CPU throughput table: each row's command and numbers are its result file's."""
    record = json.loads((ROOT / "bench" / "results" / result).read_text())
    assert not record["git_dirty"], f"{result}: measured on a tree with local changes"
    rows = [r for r in (ROOT / "docs" / "training.md").read_text().splitlines() if f"`{record['command']}`" in r]
    assert len(rows) == 1, f"docs/training.md should have one table row for `{record['command']}`"
    e, hf = record["engine"], record["vs_hf"]
    cells = [c.strip() for c in rows[0].split("|")[-5:-1]]
    assert cells == [f"{e['tokens_per_sec']:,.0f}", f"{hf['ours_step_s']:.3f} s", f"{hf['hf_step_s']:.3f} s",
                     f"{hf['hf_over_ours']:.3f}"], f"docs/training.md's row for bench/results/{result}"
