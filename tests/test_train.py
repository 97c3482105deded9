"""End-to-end training on CPU: train.py in subprocesses (1 process, and 2 processes under torchrun/gloo).

Shared runs (module fixtures) keep the file fast: one 1-process reference run, one 2-process ZeRO-2 run and one
run that checkpoints only at its end serve several assertions. Every run: tiny model, seq_length 32, global batch 8,
6 steps, fp32, on the byte-tokenized sample (trainrun.BYTES: a 257-token vocabulary, so steps and checkpoints are
cheap). No tensor of this model reaches DeepSpeed's ZeRO-3 persistence threshold (1e5 elements), so the ZeRO-3 run
sets it to 0: every parameter is partitioned.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainrun import (BYTES, COMMON, ROOT, STEPS, error_line, losses, rows, train, train_env, trained_once,
                      valid_losses)

from neox_dar.saved_model import load_model
from neox_dar.rundir import newest_checkpoint, step_dir_name


@pytest.fixture(scope="module")
def data(byte_tokenized_sample) -> str:
    """The sample under the byte tokenizer: every run here adds trainrun.BYTES (what is checked is the trainer's
    mechanics; a 257-token vocabulary makes each run ~2 CPU-seconds cheaper than the Pythia one's 50k)."""
    return byte_tokenized_sample


# the rolling-window perplexity of 3 C4 documents inside training, every 3 steps (an AHA-free model: no stats)
CORPUS_EVAL = ["eval_perplexity.interval=3", "eval_perplexity.corpora=[c4]", "eval_perplexity.max_docs=3"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data) -> Path:
    """1 process, micro 4 x grad-accum 2, ZeRO-0; logging to W&B (offline) and TensorBoard too."""
    return trained_once(tmp_path_factory, "test_train-reference", data, *BYTES, "zero_optimization.stage=0",
                        "use_wandb=true", "tensorboard_dir={save}/tb", *CORPUS_EVAL)


# checkpoints only at the end (checkpoint_factor is past the run), validation at step 4 and after the last step
UNTIMED = [*BYTES, "checkpoint_factor=1000", "keep_last_n=6", "eval_interval=4"]


@pytest.fixture(scope="module")
def untimed(tmp_path_factory, data) -> Path:
    """1 process, ZeRO-1, :data:`UNTIMED`: one checkpoint (step 6) and validation at steps 4 and 6."""
    return trained_once(tmp_path_factory, "test_train-untimed", data, *UNTIMED)


@pytest.fixture(scope="module")
def zero2(tmp_path_factory, data) -> Path:
    """2 processes, micro 4 x grad-accum 1, ZeRO-2."""
    return trained_once(tmp_path_factory, "test_train-zero2", data, *BYTES, "zero_optimization.stage=2",
                        *CORPUS_EVAL, nproc=2)


def test_run_outputs_and_loss_falls(reference):
    """The reference run finishes, logs every contract field, validates, checkpoints, and its loss falls."""
    status = json.loads((reference / "status.json").read_text())
    assert (status["state"], status["step"], status["train_iters"]) == ("done", STEPS, STEPS)
    train_rows = [r for r in rows(reference) if "loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, STEPS + 1))
    for key in ("loss", "lm_loss", "aux_loss", "lr", "grad_norm", "tokens_per_sec", "samples_per_sec",
                "consumed_samples", "tflops_per_device", "mem_rss_gb"):
        assert all(isinstance(r[key], (int, float)) for r in train_rows), key
    assert train_rows[-1]["consumed_samples"] == 8 * STEPS
    assert all(r["grad_norm"] > 0 for r in train_rows)
    assert "mfu" not in train_rows[0]  # CPU: no peak FLOP/s known
    assert train_rows[-1]["loss"] < train_rows[0]["loss"] - 0.2
    valid = [r for r in rows(reference) if "valid_loss" in r]
    assert [r["step"] for r in valid] == [3, 6]
    assert valid[1]["valid_loss"] < valid[0]["valid_loss"]
    # the LR schedule: warmup over 0.34 x 6 = 2.04 steps (unrounded, as GPT-NeoX), cosine to min_lr = lr / 10 at 6
    lrs = [r["lr"] for r in train_rows]
    assert lrs[:2] == pytest.approx([3e-3 / 2.04, 2 * 3e-3 / 2.04]) and lrs[-1] == pytest.approx(3e-4)
    ckpts = reference / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == step_dir_name(STEPS)
    assert newest_checkpoint(reference) == ckpts / step_dir_name(STEPS)
    assert (reference / "config.yml").is_file()
    model, cfg = load_model(reference)
    assert cfg.seq_length == 32 and model.embed_out.weight.dtype == torch.float32
    assert list(reference.glob("wandb/offline-run-*/run-*.wandb")) and (reference / "wandb_run_id").is_file()
    assert list((reference / "tb").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_two_process_zero_matches_one_process(stage, reference, zero2, data, tmp_path):
    """2 ranks x micro 4 (ZeRO-1/2/3; ZeRO-3 with every parameter partitioned) give the 1-rank micro 4 x
    grad-accum 2 losses to 1e-5 relative."""
    if stage == 2:
        save = zero2
    else:
        save = tmp_path / f"zero{stage}"
        partition_all = ["zero_optimization.stage3_param_persistence_threshold=0"] if stage == 3 else []
        train(save, data, *BYTES, f"zero_optimization.stage={stage}", *partition_all, nproc=2)
    ref, got = losses(reference), losses(save)
    assert sorted(got) == sorted(ref)
    for step in ref:
        assert got[step] == pytest.approx(ref[step], rel=1e-5), (step, got[step], ref[step])
    if stage == 3:
        # consolidated weights gathered from the ZeRO-3 partitions are DeepSpeed's fp32 masters, exactly
        from deepspeed.utils.zero_to_fp32 import (
            get_fp32_state_dict_from_zero_checkpoint,
        )

        step_dir = save / "checkpoints" / step_dir_name(STEPS)
        ours = load_file(str(step_dir / "model.safetensors"))
        theirs = get_fp32_state_dict_from_zero_checkpoint(str(step_dir.parent), tag=step_dir.name)
        assert ours.keys() == theirs.keys()
        for k in ours:
            assert torch.equal(ours[k], theirs[k].float()), k


def test_exact_resume_one_process(reference, data, tmp_path):
    """Stop after step 3 (exit code 3), run the same command again: losses equal the reference bit for bit."""
    save = tmp_path / "resumed"
    train(save, data, *BYTES, "zero_optimization.stage=0", "exit_interval=3", expect=3)
    status = json.loads((save / "status.json").read_text())
    assert (status["state"], status["step"]) == ("interrupted", 3)
    out = train(save, data, *BYTES, "zero_optimization.stage=0", "exit_interval=3")
    assert "resumed from" in out.stdout
    assert json.loads((save / "status.json").read_text())["state"] == "done"
    assert losses(save) == losses(reference)
    assert valid_losses(save) == valid_losses(reference) and len(valid_losses(save)) == 2


def test_exact_resume_two_processes_zero2_under_torch_compile(zero2, data, tmp_path):
    """2 ranks under ZeRO-2 with ``torch_compile=true`` (DeepSpeed's engine.compile; aot_eager: inductor's C++
    build takes minutes on this CPU), stopped after step 3 and resumed: bit-for-bit the uninterrupted eager ZeRO-2
    run's losses, so the compiled step is the eager one and resumes exactly.

    (torchrun reports any non-zero worker exit as 1; the run's own state is in status.json.)"""
    save = tmp_path / "resumed"
    compiled = ["zero_optimization.stage=2", "torch_compile=true", "torch_compile_backend=aot_eager"]
    train(save, data, *BYTES, *compiled, "exit_interval=3", nproc=2, expect=1)
    assert json.loads((save / "status.json").read_text())["state"] == "interrupted"
    train(save, data, *BYTES, *compiled, nproc=2)
    assert losses(save) == losses(zero2)
    assert valid_losses(save) == valid_losses(zero2)


def test_sigterm_checkpoints_and_resumes(data, tmp_path):
    """SIGTERM mid-run (an AHA model: its mu_f and L1 term are logged): a complete checkpoint at the next step
    boundary, exit 3, and the rerun continues."""
    save = tmp_path / "preempted"
    extra = [*BYTES, "train_iters=400", "eval_interval=0", "checkpoint_factor=1000", "attention_type=aha",
             "window_size=8"]
    args = [*COMMON, f"data_path={data}", f"save={save}", *extra]
    proc = subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, env=train_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while not ((save / "metrics.jsonl").is_file() and rows(save)) and time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 3, output
    status = json.loads((save / "status.json").read_text())
    assert status["state"] == "interrupted" and 1 <= status["step"] < 400
    step_dir = newest_checkpoint(save)
    assert step_dir.name == step_dir_name(status["step"])
    state = json.loads((step_dir / "state.json").read_text())
    assert state["consumed_samples"] == 8 * status["step"]
    train(save, data, *extra, f"exit_interval={status['step'] + 2}", expect=3)
    assert max(losses(save)) == status["step"] + 2
    row = rows(save)[-1]
    assert row["aux_loss"] > 0 and row["loss"] == pytest.approx(row["lm_loss"] + row["aux_loss"])
    assert len(row["mu_f/layer0"]) == 4 and len(row["mu_f/layer1"]) == 4 and 0 <= row["mu_f"] <= 1


def test_checkpoint_with_missing_file_is_skipped(reference, data, tmp_path):
    """A newest checkpoint with a file gone is skipped (warning) in favour of the previous complete one."""
    save = tmp_path / "damaged"
    shutil.copytree(reference, save)
    newest = save / "checkpoints" / step_dir_name(STEPS)
    (newest / "rng_rank00000.pt").unlink()
    warnings = []
    assert newest_checkpoint(save, warn=warnings.append) == save / "checkpoints" / step_dir_name(3)
    assert len(warnings) == 1 and "rng_rank00000.pt is missing" in warnings[0]
    out = train(save, data, *BYTES, "zero_optimization.stage=0")
    assert "skipping checkpoint" in out.stderr and "is missing" in out.stderr
    assert losses(save) == losses(reference)


def test_batch_mismatch_is_a_config_error(data, tmp_path):
    out = train(tmp_path / "bad", data, *BYTES, "train_batch_size=12", "gradient_accumulation_steps=2", expect=2)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error:") and "train_batch_size" in lines[0]
    assert not (tmp_path / "bad").exists()


def test_wandb_without_an_api_key_is_one_line_saying_how(data, tmp_path):
    """use_wandb=true online, with no API key anywhere and no terminal to ask for one: W&B's UsageError was a
    traceback through the log sinks; now one line naming the ways out, exit 2, and the run recorded as failed."""
    env = {**train_env(HOME=str(tmp_path / "home"), WANDB_CONFIG_DIR=str(tmp_path / "wandbcfg")),
           "WANDB_MODE": "online"}
    env.pop("WANDB_API_KEY", None)
    out = train(tmp_path / "run", data, *BYTES, "use_wandb=true", env=env, expect=2)
    line = error_line(out)
    assert line.startswith("error: use_wandb=true, but W&B did not start (") and "`wandb login`" in line, line
    assert "WANDB_MODE=offline" in line and "use_wandb=false" in line
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "failed"


def test_a_save_holding_other_files_is_said_and_they_are_kept(data, tmp_path):
    """save= naming a folder of other files (no run's): the run trained into it without a word; now a warning
    names what is there, and those files stay."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    out = train(folder, data, *BYTES, "train_iters=2", "eval_interval=2", "checkpoint_factor=2")
    assert (f"warning: save={folder} holds 1 entry of no run (notes.txt): the run writes its files beside them "
            "(config.yml, metrics.jsonl, status.json, checkpoints/); name a new directory to keep them apart") \
        in out.stderr.splitlines()
    assert (folder / "notes.txt").read_text() == "keep me" and (folder / "status.json").is_file()
    again = train(folder, data, *BYTES, "train_iters=2", "eval_interval=2", "checkpoint_factor=2")
    assert "of no run" not in again.stderr  # a run now: nothing to say


def test_validation_also_runs_after_the_last_step(untimed):
    """As in GPT-NeoX, a final validation after the last step when it is not an evaluation step (6 % 4 != 0)."""
    assert sorted(valid_losses(untimed)) == [4, STEPS]


def test_corpus_perplexity_during_training(reference, zero2):
    """eval_perplexity.interval: the corpora scored at steps 3 and 6 inside training, written as eval/step_N.json
    and logged; the step-6 result equals eval.perplexity on the final checkpoint, and the 2-rank (sharded) run
    scores what the 1-rank run scores."""
    from neox_dar.rundir import read_evals

    evals = read_evals(reference)
    assert [e["step"] for e in evals] == [3, STEPS] and all(e["in_training"] for e in evals)
    logged = [r for r in rows(reference) if "ppl/c4" in r]
    assert [r["step"] for r in logged] == [3, STEPS]
    assert logged[-1]["ppl/c4"] == evals[-1]["corpora"]["c4"]["token_perplexity"]
    out = subprocess.run([sys.executable, "-m", "eval.perplexity", str(reference), "--corpora", "c4", "--max-docs",
                          "3", "--no-progress"], cwd=ROOT, env=train_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    standalone = json.loads(out.stdout)["corpora"]["c4"]
    in_training = evals[-1]["corpora"]["c4"]
    assert in_training["tokens"] == standalone["tokens"] and in_training["documents"] == 3
    assert in_training["token_perplexity"] == pytest.approx(standalone["token_perplexity"], rel=1e-6)
    assert in_training["manifest_sha256"] == standalone["manifest_sha256"]
    sharded = read_evals(zero2)[-1]["corpora"]["c4"]
    assert sharded["tokens"] == in_training["tokens"]
    assert sharded["token_perplexity"] == pytest.approx(in_training["token_perplexity"], rel=1e-4)


def test_checkpoint_minutes_saves_by_wall_time_between_step_checkpoints(untimed, data, tmp_path):
    """``checkpoint_minutes``: a checkpoint once that much wall time has passed since the last save, whatever
    ``checkpoint_factor`` says (here every step, 0.06 ms being shorter than any step); the same run without it
    (``untimed``) saves only its last step, and the losses of the two are the same."""
    save = tmp_path / "timed"
    train(save, data, *UNTIMED, "checkpoint_minutes=0.000001")
    steps = sorted(int(p.name.removeprefix("step_")) for p in (save / "checkpoints").glob("step_*"))
    assert steps == list(range(1, STEPS + 1))
    assert [p.name for p in (untimed / "checkpoints").glob("step_*")] == [step_dir_name(STEPS)]
    assert losses(save) == losses(untimed)


def test_a_zero_run_resumed_at_another_world_size_is_refused_saying_how(zero2, data, tmp_path):
    """A ZeRO-2 run of 2 ranks continued by 1: one line naming both world sizes and the two ways on (the same
    ranks, or its weights in a new run with finetune=true); nothing of the run changes."""
    save = tmp_path / "copy"
    shutil.copytree(zero2, save)
    def files():  # the run's files but its records of the last start (status.json, run.lock)
        return {p.relative_to(save): p.read_bytes() for p in save.rglob("*")
                if p.is_file() and p.name not in ("run.lock", "status.json")}

    before = files()
    out = train(save, data, *BYTES, "zero_optimization.stage=2", "train_iters=9", expect=2)
    lines = [line for line in out.stderr.splitlines() if "written by" in line]
    assert len(lines) == 1 and "written by 2 ranks under ZeRO-2" in lines[0] and "(this run has 1)" in lines[0], lines
    assert "finetune=true" in lines[0] and "Traceback" not in out.stderr
    assert files() == before
    status = json.loads((save / "status.json").read_text())
    assert (status["state"], status["step"], status["checkpoint"]) == ("failed", STEPS, STEPS)
