"""What a run resumes (issue 36, items 5-7), through train.py as a user runs it: a run whose checkpoints were moved
away, data changed under a run between its stop and its resume, a run directory copied elsewhere.

The runs train on data tokenized with the byte tokenizer (trainrun.BYTES: a 257-token vocabulary): what is checked is
the run directory and its data, whatever the model, and that model's steps and checkpoints are cheap."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from trainrun import BYTE_TOKENIZER, BYTES, ROOT, error_line, rows, status, train, train_env

from data_prep.tokenize import main as tokenize_main
from neox_dar.data.identity import prefix_identity, sha256_file
from neox_dar.rundir import STATUS

SHORT = [*BYTES, "train_iters=2", "eval_interval=0", "checkpoint_factor=2"]


@pytest.fixture(scope="module")
def data(byte_tokenized_sample) -> str:
    return byte_tokenized_sample


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    """A finished run (2 steps, a checkpoint at step 2), which the tests copy."""
    save = tmp_path_factory.mktemp("trained") / "run"
    train(save, data, *SHORT)
    return save


def test_a_run_whose_checkpoints_were_moved_away_is_not_restarted_silently(data, trained, tmp_path):
    """A finished run whose `checkpoints/` was moved away, run again: one line saying the status records a
    checkpoint the run no longer holds and what to do, exit 2, metrics and status byte for byte; overwrite=true
    starts it again. (Before: it trained from step 0 without a word and replaced the metrics rows.)"""
    save = tmp_path / "run"
    shutil.copytree(trained, save)
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


SAMPLE = ROOT / "data" / "sample" / "c4_sample.jsonl"


def _tokenize(out: Path, *args: str, reverse: bool = False, env: dict | None = None) -> int:
    """`python -m data_prep.tokenize` of the embedded C4 sample with the byte tokenizer (``reverse``: its documents in
    reverse order, another corpus) into ``out``; ``args``: its budget. In this process, or with ``env`` in a
    subprocess; returns its exit status."""
    source = SAMPLE
    if reverse:
        source = out.parent / "reversed.jsonl"
        source.write_text("".join(reversed(SAMPLE.read_text().splitlines(keepends=True))))
    argv = [str(source), "--tokenizer", str(BYTE_TOKENIZER), "--out", str(out), "--workers", "1",
            "--no-progress", *args]
    if env is None:
        return tokenize_main(argv)
    return subprocess.run([sys.executable, "-m", "data_prep.tokenize", *argv], cwd=ROOT, env=train_env(**env),
                          capture_output=True, timeout=120).returncode


def test_data_replaced_between_stop_and_resume_is_refused(tmp_path):
    """Train 2 of 4 steps (exit_interval), tokenize other documents to the same prefix, run the same command: one line
    naming the prefix and the way out, exit 2. (Before: "resumed ... at step 2" on the other data.)"""
    data = tmp_path / "c4"
    assert _tokenize(data, "--max-tokens", "20000") == 0
    save = tmp_path / "run"
    train(save, str(data), *BYTES, "train_iters=4", "eval_interval=0", "checkpoint_factor=2", "exit_interval=2",
          expect=3)
    assert _tokenize(data, "--max-tokens", "20000", reverse=True) == 0
    out = train(save, str(data), *BYTES, "train_iters=4", "eval_interval=0", "checkpoint_factor=2", expect=2)
    assert error_line(out).startswith(
        f"error: the data changed since {save / 'checkpoints' / 'step_00000002'} was written: {data} is not the data "
        f"the checkpoint was trained on ({data}; idx_sha256 differ): restore that data to continue the run exactly, "
        f"continue from its checkpoint in a new run (save=NEW load={save}), or set overwrite=true")
    assert status(save)["state"] == "interrupted"


def test_a_tokenize_killed_while_it_replaces_a_set_leaves_none_that_trains(tmp_path):
    """data_prep.tokenize over an earlier set, SIGKILLed after renaming the new manifest in (before the data files):
    train.py refuses the prefix in one line; the same tokenize command again completes the set, byte for byte as its
    manifest describes, which train.py accepts. (Before: .bin/.idx pairs were replaced one at a time and the manifest
    last, so a kill left a mixed set that trained.)"""
    data = tmp_path / "c4"
    assert _tokenize(data, "--max-tokens", "20000", "--valid-tokens", "4000") == 0
    new = ["--max-tokens", "20000", "--valid-tokens", "4000"]
    killed = _tokenize(data, *new, reverse=True, env={"NEOX_DAR_KILL_AT": "data-replacing"})
    assert killed == -signal.SIGKILL
    out = train(tmp_path / "run", str(data), *SHORT, expect=2)
    assert error_line(out).startswith(f"error: {data}.idx is not the file {data}.manifest.json describes")
    assert _tokenize(data, *new, reverse=True) == 0
    manifest = json.loads(Path(f"{data}.manifest.json").read_text())
    for prefix, entry in ((f"{data}", manifest), (f"{data}_valid", manifest["valid"])):
        assert [sha256_file(prefix + ext) for ext in (".bin", ".idx")] == [entry["bin_sha256"], entry["idx_sha256"]]
    assert manifest["inputs"][0]["path"].endswith("reversed.jsonl")
    assert prefix_identity(str(data))["idx_sha256"] == manifest["idx_sha256"]  # what train.py checks at start


def test_a_copied_run_started_from_its_config_says_which_run_it_trains(trained, tmp_path):
    """`cp -r RUN COPY; python train.py COPY/config.yml`: a warning names both directories and the save= that trains
    the copy; the run that config's save names is the one continued (here: finished, so nothing trains), and COPY is
    left as it was. (Before: it silently continued RUN.)"""
    save, copy = trained, tmp_path / "copy"
    shutil.copytree(save, copy)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    out = subprocess.run([sys.executable, "train.py", str(copy / "config.yml")], cwd=ROOT, env=train_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (f"warning: {copy / 'config.yml'} is the config of the run directory {copy}, but it names save={save}: "
            f"this trains (and continues) {save}, not {copy}; add save={copy} to train the run in that directory"
            ) in out.stderr.splitlines()
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before
