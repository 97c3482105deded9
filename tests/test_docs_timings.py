"""The README's timings are the committed result files' (the quickstart from ``bench/quickstart.py``, the suite and
its fast tier from ``RECORD=... bash scripts/test.sh``): no typed number."""

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
