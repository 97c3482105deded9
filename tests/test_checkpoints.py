"""Checkpoint trust, end to end through train.py: used run directories, SIGKILLs at every step of a save and of
pruning, same-size corruption, crafted pickles, a full disk, damaged data after a preemption, and models that no
longer match their checkpoints. Each case gets one line and exit 2, or resumes to bit-identical losses.

The runs train on the byte-tokenized sample (trainrun.BYTES: a 257-token vocabulary): what is checked here is the
trainer's checkpoints, whatever the model, and a checkpoint of that model is ~3 MB instead of ~130 MB."""

from __future__ import annotations

import os
import resource
import shutil
from pathlib import Path

import pytest
import torch
from trainrun import BYTES, STEPS, error_line, losses, status, train, train_env, train_in_process, trained_once

from neox_dar.rundir import (
    DEL_PREFIX,
    KILL_AT_ENV,
    LATEST,
    TMP_PREFIX,
    newest_checkpoint,
    read_state,
    step_dir_name,
    step_dirs,
    verify,
    write_manifest,
)

# with dropout, so that every resume below is exact in the random stream too (creating the data loader's iterator
# drew from the global generator after the checkpoint's state was restored: resumed dropout masks were shifted)
EVERY_STEP = [*BYTES, "checkpoint_factor=1", "keep_last_n=2", "eval_interval=0", "hidden_dropout=0.1"]


@pytest.fixture(scope="module")
def data(byte_tokenized_sample) -> str:
    return byte_tokenized_sample


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data) -> Path:
    """An uninterrupted run that checkpoints (and prunes) after every step."""
    return trained_once(tmp_path_factory, "test_checkpoints-reference", data, *EVERY_STEP)


def _checkpoint_names(save: Path) -> list[str]:
    return sorted(p.name for p in (save / "checkpoints").iterdir() if p.name != LATEST and p.suffix != ".py")


def test_sigkill_at_every_point_of_saving_and_pruning_resumes_exactly(reference, data, tmp_path):
    """One run killed (SIGKILL) at each point of a save, of the `latest` update and of pruning, restarted each
    time with the same command: it resumes every time, its losses equal the uninterrupted run's bit for bit, and
    no directory is left beyond keep_last_n."""
    save = tmp_path / "killed"
    points = ["save-written:2", "save-renamed:1", "latest-written:1", "prune-renamed:1", "prune-deleting:1"]
    for point in points:
        out = train(save, data, *EVERY_STEP, expect=None, env=train_env(**{KILL_AT_ENV: point}))
        assert out.returncode == -9, (point, out.stderr[-2000:])
        assert status(save)["state"] == "running"
    train(save, data, *EVERY_STEP)
    assert losses(save) == losses(reference)
    assert _checkpoint_names(save) == [step_dir_name(STEPS - 1), step_dir_name(STEPS)]
    assert (save / "checkpoints" / LATEST).read_text().strip() == step_dir_name(STEPS)


def test_a_stop_signal_during_a_checkpoint_write_stops_at_that_checkpoint(reference, data, tmp_path):
    """SIGTERM while step 2's checkpoint is written: the run stops at step 2 with that checkpoint (exit 3), and the
    rerun repeats the uninterrupted run's losses. (Before: it trained step 3 and wrote a second checkpoint first.)"""
    save = tmp_path / "stopped"
    out = train(save, data, *EVERY_STEP, expect=3, env=train_env(**{KILL_AT_ENV: "save-written:2=SIGTERM"}))
    assert "stopped at step 2 (SIGTERM)" in out.stdout + out.stderr, out.stderr[-2000:]
    assert status(save)["state"] == "interrupted" and status(save)["step"] == 2
    assert newest_checkpoint(save).name == step_dir_name(2) and max(losses(save)) == 2
    train(save, data, *EVERY_STEP)
    assert losses(save) == losses(reference)


def test_a_used_save_is_refused_and_overwrite_replaces_it(reference, data, tmp_path):
    """resume=never or another load= source into a run directory with checkpoints: one line, nothing touched.
    (Before: it printed 'saved checkpoint' while the old run's files stayed.) overwrite=true replaces them."""
    save = tmp_path / "used"
    shutil.copytree(reference, save)
    before = {p: p.read_bytes() for p in save.rglob("*") if p.is_file()}
    out = train(save, data, *EVERY_STEP, "resume=never", "seed=7", expect=2)
    line = error_line(out)
    assert str(save) in line and "resume=never" in line and "overwrite=true" in line
    out = train(save, data, *EVERY_STEP, f"load={reference}", expect=2)
    assert "checkpoints of another run" in error_line(out)
    assert {p: p.read_bytes() for p in save.rglob("*") if p.is_file()} == before  # not even status.json

    aside = save / "checkpoints" / "failed-step_00000009"  # one the old run set aside: discarded with it
    aside.mkdir()
    train(save, data, *EVERY_STEP, "resume=never", "seed=7", "overwrite=true")
    assert not aside.exists()
    newest = newest_checkpoint(save)
    assert "seed: 7" in (newest / "config.yml").read_text()
    assert (newest / "model.safetensors").read_bytes() != (reference / "checkpoints" / newest.name /
                                                         "model.safetensors").read_bytes()
    assert losses(save) != losses(reference) and status(save)["state"] == "done"


def test_same_size_corruption_is_skipped_by_checksum(reference, data, tmp_path):
    """4 KiB of zeros in the newest checkpoint's optimizer state (same size): skipped, with the reason, and the
    run continues from the previous one to the same losses. (Before: resumed silently and diverged.)"""
    save = tmp_path / "corrupt"
    shutil.copytree(reference, save)
    newest = save / "checkpoints" / step_dir_name(STEPS)
    with open(newest / "mp_rank_00_model_states.pt", "r+b") as f:
        f.seek(4096)
        f.write(b"\0" * 4096)
    out = train(save, data, *EVERY_STEP)
    assert "mp_rank_00_model_states.pt is corrupt" in out.stderr
    assert f"resumed from {save / 'checkpoints' / step_dir_name(STEPS - 1)}" in out.stdout
    assert "other sampling settings" not in out.stdout  # the same config: no note
    assert losses(save) == losses(reference) and verify(newest) is None
    aside = save / "checkpoints" / f"failed-{step_dir_name(STEPS)}"  # set aside for inspection, out of pruning's way
    assert f"as {aside.name} (it failed its check)" in out.stderr and verify(aside) is not None


def test_a_resume_with_a_smaller_global_batch_trains_to_the_end(reference, data, tmp_path):
    """A run resumed with half its global batch and a raised train_iters reads on from the samples it consumed to
    the last step. (Before: the data index held train_iters x the new batch samples, fewer than the consumed ones
    plus those left, and the run died of a StopIteration traceback a few steps in.)"""
    save = tmp_path / "smaller"
    shutil.copytree(reference, save)
    out = train(save, data, *EVERY_STEP, f"train_iters={STEPS + 4}", "train_batch_size=4")
    assert "global batch 8 -> 4 samples a step" in out.stdout
    assert status(save)["state"] == "done" and max(losses(save)) == STEPS + 4


def test_loading_a_run_that_has_not_finished_is_said(reference, data, tmp_path):
    """load= a run directory whose run stopped before its end (a stage 2 started from an interrupted stage 1):
    it started from that run's newest checkpoint without a word; now a warning names the state and the step. A
    finished run, or a checkpoint named by its step directory, is taken as before, silently."""
    import json

    earlier = tmp_path / "earlier"
    shutil.copytree(reference, earlier)
    st = json.loads((earlier / "status.json").read_text())
    (earlier / "status.json").write_text(json.dumps({**st, "state": "interrupted", "train_iters": 2 * STEPS}))
    out = train(tmp_path / "next", data, *EVERY_STEP, f"load={earlier}", f"train_iters={STEPS + 1}")
    assert (f"load={earlier} is a run that has not finished (interrupted at step {STEPS} of {2 * STEPS}): starting "
            f"from its newest checkpoint, step_{STEPS:08d}") in out.stderr
    step = earlier / "checkpoints" / f"step_{STEPS:08d}"
    out = train(tmp_path / "named", data, *EVERY_STEP, f"load={step}", f"train_iters={STEPS + 1}")
    assert "has not finished" not in out.stderr


def test_evaluation_refuses_a_corrupt_model_file(reference, tmp_path, capsys):
    """Same-size garbage in model.safetensors: eval exits 2 with one line (before: a NaN perplexity, exit 0). The
    command (python -m eval.perplexity) by its main, in this process."""
    from eval.perplexity import main as perplexity

    save = tmp_path / "garbage"
    shutil.copytree(reference, save)
    weights = save / "checkpoints" / step_dir_name(STEPS) / "model.safetensors"
    with open(weights, "r+b") as f:
        f.seek(weights.stat().st_size // 2)
        f.write(b"\xff" * 4096)
    step_dir = weights.parent
    code = perplexity([str(step_dir), "--corpora", "c4", "--max-docs", "1", "--no-progress"])
    out = capsys.readouterr()
    assert code == 2, out.out + out.err
    assert "model.safetensors is corrupt" in out.err and "Traceback" not in out.err


def test_a_checkpoint_carrying_a_pickled_callable_is_refused(reference, data, tmp_path):
    """A crafted optimizer file with a matching manifest (the attacker rewrote it too): resuming refuses it in
    one line and the planted command never runs. (Before: it ran and training exited 0.)"""
    save = tmp_path / "crafted"
    shutil.copytree(reference, save)
    marker = tmp_path / "pwned"
    newest = save / "checkpoints" / step_dir_name(STEPS)
    state = torch.load(newest / "mp_rank_00_model_states.pt", weights_only=False)
    state["payload"] = _Payload(marker)
    torch.save(state, newest / "mp_rank_00_model_states.pt")
    meta = {k: v for k, v in read_state(newest).items() if k != "files"}
    write_manifest(newest, meta)
    assert verify(newest) is None
    out = train(save, data, *EVERY_STEP, "train_iters=8", expect=2)
    line = error_line(out)
    assert "holds pickled" in line and "trust" in line and "mp_rank_00_model_states.pt" in line
    assert not marker.exists()
    assert status(save)["state"] == "failed"


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _file_size_limit(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_failed_save_removes_its_temporary_and_keeps_the_previous(reference, data, tmp_path):
    """A write that fails mid-checkpoint (a file-size limit standing in for a full disk: 1 MiB, less than the
    ~1.8 MB optimizer state): one line with the path and the free space, no temporary left, the previous checkpoint
    intact and status failed. (The run: a copy of the reference continued to step 8, its first save after the copy
    being step 7's.)"""
    save = tmp_path / "full"
    shutil.copytree(reference, save)
    previous = newest_checkpoint(save)
    out = train(save, data, *EVERY_STEP, "train_iters=8", expect=2, preexec_fn=_file_size_limit(2**20))
    line = error_line(out)
    assert f"could not write checkpoint {save / 'checkpoints' / step_dir_name(STEPS + 1)}" in line
    assert "GiB free" in line
    assert not [p for p in (save / "checkpoints").iterdir() if p.name.startswith((TMP_PREFIX, DEL_PREFIX))]
    assert [d.name for _, d in step_dirs(save / "checkpoints")] == [step_dir_name(STEPS), step_dir_name(STEPS - 1)]
    assert newest_checkpoint(save) == previous and verify(previous) is None
    assert status(save)["state"] == "failed" and "could not write checkpoint" in status(save)["reason"]


def test_damaged_data_after_a_preemption_fails_instead_of_looping(data, tmp_path):
    """A run stopped at a checkpoint (status 'interrupted') whose data file is then damaged: the restart exits 2
    with one line and status.json says failed, so a requeueing job script stops. (Before: status stayed
    'interrupted' and the job requeued forever.)"""
    copy = tmp_path / "c4"
    for ext in (".bin", ".idx"):
        shutil.copy(data + ext, str(copy) + ext)
    save = tmp_path / "run"
    train(save, str(copy), *EVERY_STEP, "exit_interval=2", expect=3)
    assert status(save)["state"] == "interrupted"
    os.truncate(str(copy) + ".bin", 1000)
    out = train_in_process(save, str(copy), *EVERY_STEP)  # the data files are checked before any start-up
    assert out.returncode == 2 and "c4.bin" in error_line(out)
    assert status(save)["state"] == "failed" and "c4.bin" in status(save)["reason"]


def test_resuming_with_another_model_is_one_line(reference, data, tmp_path):
    """The run's config changed the architecture since its checkpoints: one line naming the key (before: a
    49-line size-mismatch traceback)."""
    save = tmp_path / "changed"
    shutil.copytree(reference, save)
    out = train(save, data, *EVERY_STEP, "train_iters=8", "hidden_size=128", expect=2)
    line = error_line(out)
    assert "another model" in line and "hidden_size (64 in the checkpoint, 128 now)" in line


def test_a_resume_keeps_its_log_interval_and_refuses_another_optimizer_state(reference, data, tmp_path):
    """Stopped at step 3 inside a log interval of 4 and resumed: the rows at steps 4 and 6 average the same steps'
    losses as the uninterrupted reference's (the checkpoint keeps the interval's losses; before, the row at 4
    averaged step 4 alone). Resuming under another ZeRO stage (0 after 1) or precision is one line naming the
    checkpoint's (before: an AssertionError or FileNotFoundError from DeepSpeed)."""
    per_step = losses(reference)
    save = tmp_path / "run"
    args = (*EVERY_STEP, "log_interval=4")
    train(save, data, *args, "exit_interval=3", expect=3)
    for extra, why in (("zero_optimization.stage=0", "was written under ZeRO-1, this run has zero_optimization.stage=0"),
                       ("precision=bf16", "was written in fp32, this run trains in bf16")):
        out = train(save, data, *args, extra, expect=2)
        assert why in error_line(out) and "save=NEW load=" in error_line(out)
    train(save, data, *args)
    got = losses(save)
    assert sorted(got) == [4, 6]
    for step, steps in ((4, [1, 2, 3, 4]), (6, [5, 6])):
        assert got[step] == pytest.approx(sum(per_step[s] for s in steps) / len(steps), rel=1e-6, abs=0)
