"""Preemption, shared directories, full disks and bad run-directory paths, through train.py (issue 24): a kill in
the first seconds, a stale torch extension lock, symbolic links and directories where run files belong, a refused
second launch beside a live run, a full disk outside and inside a checkpoint, and token budgets that repeat the data.
Each case ends in one line and exit 2, or in a run that completes."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainrun import COMMON, ROOT, error_line, rows, status, train, train_command, train_env

from neox_dar.rundir import LOCK, STATUS, lock_run_dir, write_status

SHORT = ["train_iters=2", "eval_interval=0", "checkpoint_factor=2"]


@pytest.fixture(scope="module")
def data(tokenized_sample) -> str:
    return tokenized_sample


def _extension_locks(root: Path) -> list[Path]:
    return sorted(root.rglob("lock"))


def test_a_stale_torch_extension_lock_never_hangs_a_start(data, tmp_path):
    """A lock file left by a build killed mid-way (torch waits on it forever, silently) in the extensions cache:
    the trainer neither builds nor waits for DeepSpeed's shm_comm op, names the stale file in one warning and
    completes. (Before: it waited on the lock with no message, forever.)"""
    cache = tmp_path / "torch_extensions"
    stale = cache / "deepspeed_shm_comm" / "lock"
    stale.parent.mkdir(parents=True)
    stale.touch()
    save = tmp_path / "run"
    out = train(save, data, *SHORT, env=train_env(TORCH_EXTENSIONS_DIR=str(cache)), timeout=240)
    assert status(save)["state"] == "done"
    assert f"stale torch extension lock {stale}" in out.stderr
    assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == [Path("deepspeed_shm_comm"),
                                                                      Path("deepspeed_shm_comm/lock")]


def test_a_trainer_killed_in_its_first_seconds_starts_again(data, tmp_path):
    """SIGKILL as the trainer takes its run directory (or as a torch extension lock appears, if one ever does), then
    SIGTERM 3 s into the next start: both before the training loop, each followed by nothing but the same command
    again. The last start completes, and no lock is left in the extensions cache. (Before: the kill landed while
    DeepSpeed built its shm_comm op, left the build lock behind, and every later start hung.)"""
    cache = tmp_path / "torch_extensions"
    save = tmp_path / "run"
    env = train_env(TORCH_EXTENSIONS_DIR=str(cache))
    for sig, until in ((signal.SIGKILL, lambda: (save / LOCK).exists()), (signal.SIGTERM, lambda: False)):
        proc = subprocess.Popen(train_command(save, data, *SHORT), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + (60 if sig == signal.SIGKILL else 3)
        while time.time() < deadline and not _extension_locks(cache) and not until() and proc.poll() is None:
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()[0]
        proc.send_signal(sig)
        output = proc.communicate(timeout=120)[0]
        assert proc.returncode == -sig, output
        assert not (save / "metrics.jsonl").is_file() or not rows(save)  # killed before the training loop
    train(save, data, *SHORT, env=env, timeout=240)
    assert status(save)["state"] == "done" and not _extension_locks(cache)
