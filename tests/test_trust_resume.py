"""What a run resumes (issue 36, items 5-7), through train.py as a user runs it: a run whose checkpoints were moved
away, data changed under a run between its stop and its resume, a run directory copied elsewhere."""

from __future__ import annotations

import shutil

import pytest
from trainrun import error_line, rows, status, train

from neox_dar.rundir import STATUS

SHORT = ["train_iters=2", "eval_interval=0", "checkpoint_factor=2"]


@pytest.fixture(scope="module")
def data(tokenized_sample) -> str:
    return tokenized_sample


def test_a_run_whose_checkpoints_were_moved_away_is_not_restarted_silently(data, tmp_path):
    """Train, move `checkpoints/` away, run the same command: one line saying the status records a checkpoint the
    run no longer holds and what to do, exit 2, metrics and status byte for byte; overwrite=true starts it again.
    (Before: it trained from step 0 without a word and replaced the metrics rows.)"""
    save = tmp_path / "run"
    train(save, data, *SHORT)
    assert status(save)["checkpoint"] == 2
    shutil.move(save / "checkpoints", tmp_path / "elsewhere")
    before = {name: (save / name).read_bytes() for name in (STATUS, "metrics.jsonl")}
    out = train(save, data, *SHORT, expect=2)
    assert error_line(out) == (
        f"error: {save} holds no checkpoint but its status.json records one at step 2 (were its checkpoints/ moved or "
        "deleted?): restore its checkpoints to continue it, or set overwrite=true to start it again (discarding its "
        "metrics, status and evaluations)")
    assert {name: (save / name).read_bytes() for name in before} == before
    train(save, data, *SHORT, "overwrite=true")
    assert status(save)["state"] == "done" and [r["step"] for r in rows(save)] == [1, 2]
