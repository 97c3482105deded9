"""scripts/test.sh, the README's second command, on a small selection: the fast tier's marker, extra arguments passed
to pytest, ``SETUP=0`` (no install), and ``RECORD=FILE`` writing the wall time, pytest's exit and the code version
that the README's timings cite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_fast_tier_on_a_selection_records_its_time(tmp_path):
    record = tmp_path / "suite.json"
    env = {**os.environ, "SETUP": "0", "RECORD": str(record), "PYTHON": sys.executable}
    env.pop("PYTEST_XDIST_WORKER", None)
    out = subprocess.run(["bash", "scripts/test.sh", "--fast", "tests/test_progress.py", "-p", "no:cacheprovider"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "setup: installing" not in out.stderr
    assert "test.sh: fast tier" in out.stdout and " passed" in out.stdout
    result = json.loads(record.read_text())
    assert result["tier"] == 'fast tier (-m "not e2e")' and result["pytest_exit"] == 0 and result["wall_s"] >= 0
    assert result["command"] == "bash scripts/test.sh --fast tests/test_progress.py -p no:cacheprovider"
    assert result["git_commit"] and len(result["load_average_at_end"]) == 3
