"""Unit tests of the training engine's pieces (no process group, no training): LR schedule, parameter groups,
DeepSpeed config, RNG states, metrics helpers, command-line handling. (Checkpoint files: tests/test_rundir.py.)"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from neox_dar.config import ConfigError, load_config
from neox_dar.model import build_model
from neox_dar.training.checkpointing import capture_rng, restore_rng
from neox_dar.training.engine import deepspeed_config
from neox_dar.training.metrics import attention_stat_metrics, peak_flops, throughput
from neox_dar.training.optim import (
    build_optimizer,
    build_scheduler,
    lr_at,
    param_groups,
    resume_schedule,
)

TINY = "configs/tiny.yml"


def cfg_with(*overrides):
    return load_config(TINY, overrides=overrides)


def test_lr_schedule_warmup_cosine_and_floor():
    cfg = cfg_with("train_iters=100", "warmup=0.1", "optimizer.params.lr=1e-3", "min_lr=1e-4")
    assert [lr_at(cfg, it) for it in range(3)] == pytest.approx([1e-4, 2e-4, 3e-4])
    assert lr_at(cfg, 9) == pytest.approx(1e-3)                          # step 10 = end of warmup: peak
    assert lr_at(cfg, 54) == pytest.approx(1e-4 + 0.9e-3 * 0.5)          # half-way through the decay
    assert lr_at(cfg, 99) == pytest.approx(1e-4)                         # step 100: min_lr
    assert lr_at(cfg, 150) == pytest.approx(1e-4)                        # beyond lr_decay_iters
    lin = cfg_with("train_iters=100", "warmup=0.1", "optimizer.params.lr=1e-3", "min_lr=0", "lr_decay_style=linear")
    assert lr_at(lin, 54) == pytest.approx(0.5e-3)
    # GPT-NeoX's linear decay runs toward 0 and stops at min_lr (it decayed toward min_lr: 5.5e-4 and 2e-4 here)
    floor = cfg_with("train_iters=100", "warmup=0.1", "optimizer.params.lr=1e-3", "min_lr=1e-4",
                     "lr_decay_style=linear")
    assert [lr_at(floor, it) for it in (54, 89, 95)] == pytest.approx([5e-4, 1e-3 / 9, 1e-4])
    # a decay that ends within one step of the warmup reaches min_lr at its end (it stayed near the peak)
    short = cfg_with("train_iters=1", "warmup=0.34", "optimizer.params.lr=1e-3", "min_lr=3e-4")
    assert lr_at(short, 0) == pytest.approx(3e-4)
    const = cfg_with("train_iters=100", "warmup=0.0", "lr_decay_style=constant")
    assert lr_at(const, 0) == lr_at(const, 99) == const.training.optimizer.params.lr


def test_scheduler_follows_lr_at_and_ignores_old_config_on_load():
    cfg = cfg_with("train_iters=20", "warmup=0.2")
    model = torch.nn.Linear(4, 4)
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    sched = build_scheduler(opt, cfg)
    seen = []
    for _ in range(20):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([lr_at(cfg, it) for it in range(20)])
    # a resumed run follows its own config's schedule (longer, another peak) from its first step, once
    # resume_schedule replaced the peak the scheduler's state holds and the last lr the optimizer's state holds
    # (before: the saved peak for the rest of the run, and the saved schedule's lr for the first step)
    for changed in (("train_iters=40", "warmup=0.2"), ("train_iters=40", "warmup=0.2", "optimizer.params.lr=1e-3")):
        new = cfg_with(*changed)
        opt2 = build_optimizer(model, new, torch.device("cpu"))
        sched2 = build_scheduler(opt2, new)
        opt2.load_state_dict(opt.state_dict())
        sched2.load_state_dict(sched.state_dict())
        resume_schedule(sched2, new, model)
        after = []
        for _ in range(20):
            after.append(opt2.param_groups[0]["lr"])
            opt2.step()
            sched2.step()
        assert after == pytest.approx([lr_at(new, it) for it in range(20, 40)], rel=1e-12)
    # unchanged, the lr of every step after a resume is the uninterrupted run's, bit for bit
    opt3 = build_optimizer(model, cfg, torch.device("cpu"))
    sched3 = build_scheduler(opt3, cfg)
    for _ in range(7):
        opt3.step()
        sched3.step()
    opt4 = build_optimizer(model, cfg, torch.device("cpu"))
    sched4 = build_scheduler(opt4, cfg)
    opt4.load_state_dict(opt3.state_dict())
    sched4.load_state_dict(sched3.state_dict())
    resume_schedule(sched4, cfg, model)
    assert opt4.param_groups[0]["lr"] == opt3.param_groups[0]["lr"] == seen[7]
    assert opt4.param_groups == opt3.param_groups  # every hyperparameter as the uninterrupted run's


def test_a_resume_takes_the_configs_weight_decay_betas_and_eps():
    """The loaded optimizer state holds the saved run's weight decay, betas and eps: a resume with others in its
    config trains with the config's (before: the saved ones, while config.yml recorded the new), weight decay on
    the matrices' group only."""
    cfg = cfg_with("train_iters=20", "weight_decay=0.01")
    model = torch.nn.Linear(4, 4)
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    sched = build_scheduler(opt, cfg)
    opt.step()
    sched.step()
    new = cfg_with("train_iters=20", "weight_decay=0.3", "optimizer.params.betas=[0.5,0.6]",
                   "optimizer.params.eps=0.1")
    opt2 = build_optimizer(model, new, torch.device("cpu"))
    sched2 = build_scheduler(opt2, new)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sched.state_dict())
    assert [g["weight_decay"] for g in opt2.param_groups] == [0.01, 0.0]  # as saved
    resume_schedule(sched2, new, model)
    assert [(g["weight_decay"], tuple(g["betas"]), g["eps"]) for g in opt2.param_groups] == [
        (0.3, (0.5, 0.6), 0.1), (0.0, (0.5, 0.6), 0.1)]


def test_warmup_is_not_rounded_to_whole_steps():
    """GPT-NeoX's warmup_iter = warmup * lr_decay_iters, unrounded: warmup 0.25 of 6 steps is 1.5 steps, so step 1
    runs at 2/3 of the peak. (Before: rounded down to 1 step, step 1 at the peak.)"""
    cfg = cfg_with("train_iters=6", "warmup=0.25", "optimizer.params.lr=3e-3")
    assert cfg.training.warmup_iters == 1.5
    assert lr_at(cfg, 0) == pytest.approx(2e-3)


def test_param_groups_exclude_biases_and_norms_from_weight_decay():
    model = build_model(cfg_with().model)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    plain = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert "embed_out.weight" in decayed and "gpt_neox.embed_in.weight" in decayed
    assert "gpt_neox.layers.0.attention.query_key_value.weight" in decayed
    assert all(n.endswith("bias") or "layernorm" in n or "layer_norm" in n for n in plain)
    assert "gpt_neox.final_layer_norm.weight" in plain and "gpt_neox.layers.1.mlp.dense_h_to_4h.bias" in plain
    assert len(decayed) + len(plain) == len(list(model.parameters()))


def test_deepspeed_config_batch_precision_and_mismatch():
    cfg = cfg_with("train_batch_size=64", "train_micro_batch_size_per_gpu=4", "zero_optimization.stage=2",
                   "precision=bf16", "gradient_clipping=0.5")
    ds = deepspeed_config(cfg, world_size=4)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (64, 4, 4)
    assert ds["zero_optimization"]["stage"] == 2 and ds["gradient_clipping"] == 0.5
    assert ds["bf16"]["enabled"] and not ds["fp16"]["enabled"] and "optimizer" not in ds
    fp16 = deepspeed_config(cfg_with("precision=fp16"), world_size=1)
    assert fp16["fp16"]["enabled"] and fp16["fp16"]["loss_scale"] == 0  # dynamic loss scaling
    with pytest.raises(ConfigError, match="train_batch_size"):
        deepspeed_config(cfg, world_size=3)
    with pytest.raises(ConfigError, match="train_batch_size"):
        deepspeed_config(cfg_with("train_batch_size=16", "gradient_accumulation_steps=2"), world_size=2)


def test_rng_capture_restore_round_trip(tmp_path):
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    saved = capture_rng()
    torch.save(saved, tmp_path / "rng.pt")
    expect = (torch.rand(3), np.random.rand(3), random.random())
    restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expect[0], got[0]) and np.array_equal(expect[1], got[1]) and expect[2] == got[2]


def test_metrics_helpers():
    out = throughput(steps=10, seconds=5.0, global_batch=8, seq_length=128, world_size=2, flops_per_token=1e9,
                     peak=1e12)
    assert out["samples_per_sec"] == 16.0 and out["tokens_per_sec"] == 2048.0
    assert out["tflops_per_device"] == pytest.approx(1e9 * 2048 / 2 / 1e12)
    assert out["mfu"] == pytest.approx(out["tflops_per_device"])
    assert "mfu" not in throughput(1, 1.0, 1, 1, 1, 1.0, None)
    assert peak_flops(None, torch.device("cpu"), "fp32") is None
    assert peak_flops(2e12, torch.device("cpu"), "fp32") == 2e12
    stats = {"layer0/mu_f": torch.tensor([0.25, 0.75]), "layer1/mu_f": torch.tensor([0.5, 0.5])}
    m = attention_stat_metrics(stats)
    assert m["mu_f/layer0"] == [0.25, 0.75] and m["mu_f"] == pytest.approx(0.5)


def test_command_line_handling():
    import train

    from neox_dar.training.checks import check_training_config

    assert train._strip_launcher_args(["--local_rank=3", "a.yml", "--local_rank", "1", "x=1"]) == ["a.yml", "x=1"]
    cfg = cfg_with("data_path=/nonexistent/prefix", "save=/tmp/x")
    with pytest.raises(ConfigError, match="data file not found"):
        check_training_config(cfg, 1)
    with pytest.raises(ConfigError, match="save"):
        check_training_config(cfg_with("data_path=/nonexistent/prefix"), 1)
    with pytest.raises(ConfigError, match="bf16"):
        check_training_config(cfg_with("data_path=/nonexistent/prefix", "save=/tmp/x", "precision=bf16",
                                       "zero_optimization.stage=0"), 1)
    from neox_dar.rundir import RunFileError

    with pytest.raises(ConfigError, match=r"micro-batches that fit 4 ranks: 1, 2, 3, 6 \(train_batch_size from the "
                                          r"command line; train_micro_batch_size_per_gpu from the command line\)"):
        check_training_config(cfg_with("data_path=x", "save=/tmp/x", "train_batch_size=24",
                                       "train_micro_batch_size_per_gpu=4"), 4)  # it named neither key's place
    with pytest.raises(RunFileError, match="tensorboard_dir /etc/passwd is a file"):  # a traceback after start-up
        check_training_config(cfg_with("data_path=/nonexistent/prefix", "save=/tmp/x",
                                       "tensorboard_dir=/etc/passwd"), 1)


EXIT = """
import atexit, sys
sys.path.insert(0, sys.argv[1])
import train
atexit.register(lambda: open(sys.argv[2], "w").write("exit handlers ran"))
print("the last line, unflushed", end="")
train.exit_process(3)
"""


def test_ctrl_c_at_any_moment_of_the_start_is_one_line(byte_tokenized_sample, tmp_path):
    """SIGINT at several moments of train.py's start: exit 130 with one line (or, once training runs, 3 with a
    checkpoint), never a traceback. Interrupted inside ``import torch`` it crashed (a half-imported torch imported
    again: AttributeError, a segfault), or a library swallowed the KeyboardInterrupt mid-import and the run trained
    to its end; the imports now hold Ctrl-C until they finish."""
    import signal
    import time

    from trainrun import BYTES, ROOT, train_command, train_env

    for delay in (0.3,):  # inside the imports (by hand 0.1-1.2 s all gave one line; one here for the suite time)
        command = train_command(tmp_path / f"run{delay}", byte_tokenized_sample, *BYTES)
        p = subprocess.Popen(command, cwd=ROOT, env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        out = p.communicate(timeout=120)[0]
        assert p.returncode in (130, 3) and "Traceback" not in out, (delay, p.returncode, out[-3000:])
        if p.returncode == 130:
            assert out.strip().splitlines()[-1].startswith("train.py: interrupted (Ctrl-C)"), out[-2000:]


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_train_py_exits_with_its_code_after_exit_handlers_and_flushed_output(world_size, tmp_path):
    """train.py's exit: a rank of a multi-process run leaves without the interpreter's teardown (whose C++
    destructors sometimes aborted a finished two-rank run), a single process normally; either way with the run's
    exit code, its exit handlers run and its output flushed."""
    root = Path(__file__).resolve().parents[1]
    marker = tmp_path / "marker"
    env = {**os.environ, "WORLD_SIZE": world_size}
    res = subprocess.run([sys.executable, "-c", EXIT, str(root), str(marker)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 3 and res.stdout == "the last line, unflushed", (res.returncode, res.stderr[-2000:])
    assert marker.read_text() == "exit handlers ran"


def test_a_resume_names_the_sampling_settings_it_changes(tmp_path):
    """A resume under another seq_length, seed, split, global batch or count of the index's epochs reads on at the
    checkpoint's sample count in another sample order: allowed, and said in one line that names each change (before:
    nothing was said)."""
    from neox_dar.rundir import CONFIG, write_manifest
    from neox_dar.training.checkpointing import sampling_changes
    from neox_dar.training.distributed import DistInfo

    step_dir = tmp_path / "step_3"
    step_dir.mkdir()
    (step_dir / CONFIG).write_text(cfg_with().to_yaml())
    write_manifest(step_dir, {"step": 3, "consumed_samples": 24, "world_size": 1})
    one, two = (DistInfo(rank=0, world_size=n, local_rank=0, device=torch.device("cpu")) for n in (1, 2))
    assert sampling_changes(step_dir, cfg_with(), one, [1]) is None
    line = sampling_changes(step_dir, cfg_with("seed=7", "seq_length=64", "split=90,10,0"), one, [1])
    assert "seed 1234 -> 7" in line and "seq_length 128 -> 64" in line and "split '949,50,1' -> '90,10,0'" in line
    assert "from sample 24" in line and "\n" not in line
    assert sampling_changes(step_dir, cfg_with(), two, [1]) is None  # train_batch_size holds: more ranks, same batch
    batch = sampling_changes(step_dir, cfg_with("train_batch_size=32"), two, [1])
    assert "global batch 16 -> 32 samples a step" in batch
    # conversations are grouped by length per global batch: two ranks with the same batch read the same order; a
    # checkpoint of a version that grouped them per global micro-batch (no conversation_order recorded) is named
    chat = ["train_data_paths=[c]", "train_label_data_paths=[c_label]", "data_path=null"]
    (step_dir / CONFIG).write_text(cfg_with(*chat).to_yaml())
    assert "conversations ordered by an earlier rule (per global micro-batch) -> length-grouped per global batch, " \
        "whole-step epochs" in sampling_changes(step_dir, cfg_with(*chat), one, [])
    write_manifest(step_dir, {"step": 3, "consumed_samples": 24, "world_size": 1,
                              "conversation_order": "length-grouped per global batch, whole-step epochs"})
    assert sampling_changes(step_dir, cfg_with(*chat), one, []) is None
    assert sampling_changes(step_dir, cfg_with(*chat), two, []) is None
    write_manifest(step_dir, {"step": 3, "consumed_samples": 24, "world_size": 1})
    (step_dir / CONFIG).write_text(cfg_with().to_yaml())  # trained on packed data: no conversation order to change
    assert "conversations" not in (sampling_changes(step_dir, cfg_with(*chat), one, []) or "")
    # the epochs the training index spans (a longer train_iters that needs more of the data): another shuffle
    write_manifest(step_dir, {"step": 3, "consumed_samples": 24, "world_size": 1, "index_epochs": [1]})
    assert sampling_changes(step_dir, cfg_with("train_iters=400"), one, [1]) is None
    assert "the training data's index spans 3 epochs now, 1 epoch when the checkpoint was written" in sampling_changes(
        step_dir, cfg_with("train_iters=400"), one, [3])
    write_manifest(step_dir, {"step": 3, "consumed_samples": 24, "world_size": 1, "index_epochs": [1, 2]})
    assert "spans 2, 2 epochs of its 2 datasets now, 1, 2 epochs of its 2 datasets when" in sampling_changes(
        step_dir, cfg_with(), one, [2, 2])
    (step_dir / CONFIG).write_text("no_such_key: 1\n")
    assert "are not compared" in sampling_changes(step_dir, cfg_with(), one, [1])


def test_a_resumed_run_sends_w_and_b_no_step_it_sent_before(tmp_path, monkeypatch):
    """W&B keeps a run's first values for a step and cannot take rows back: a run resumed from step 4 after an
    attempt that logged up to step 8 sends W&B its rows from step 9 on (it sent 5-8 again, so the W&B run held
    those steps twice), also after a second resume whose metrics.jsonl no longer holds step 8; metrics.jsonl
    itself keeps the resumed rows."""
    import json

    from neox_dar.rundir import METRICS
    from neox_dar.training.logging_sinks import RunLogger

    sent = []

    class Recorder:
        def log(self, scalars, step):
            sent.append(step)

        def finish(self):
            pass

    monkeypatch.setattr(RunLogger, "_init_wandb", lambda self: setattr(self, "wandb", Recorder()))
    monkeypatch.setattr(RunLogger, "_line", lambda self, row: "")
    cfg = cfg_with(f"save={tmp_path}", "use_wandb=true")
    (tmp_path / METRICS).write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 9)))
    for start, steps in ((4, [5, 6]), (4, [5, 6, 7, 8, 9, 10])):
        logger = RunLogger(cfg, True, start)
        for s in steps:
            logger.log({"step": s, "loss": 1.0})
        logger.close()
    assert sent == [9, 10]
    assert [json.loads(r)["step"] for r in (tmp_path / METRICS).read_text().splitlines()] == list(range(1, 11))


def test_interval_clock_leaves_evaluations_and_checkpoints_out():
    """A log interval's training seconds exclude the time in validation, corpus evaluation and checkpoints: the loop
    restarted its clock after each while keeping the interval's steps, so a save inside an interval divided all its
    steps by the seconds since the save (tokens/s 2-3x too high with checkpoint_minutes or an eval_interval that is
    not a multiple of log_interval)."""
    from neox_dar.training.metrics import IntervalClock

    now = [100.0]
    clock = IntervalClock(lambda: now[0])
    now[0] += 2.0                       # two steps
    with clock.paused():                # a checkpoint
        now[0] += 30.0
    now[0] += 1.0                       # one more step
    assert clock.seconds() == 3.0
    clock.restart()
    now[0] += 0.5
    assert clock.seconds() == 0.5


def test_the_fp32_zero_0_gradient_norm_is_summed_in_float64():
    """The logged grad_norm at ZeRO-0 fp32 (our own; DeepSpeed's ZeRO norm is float64): float32 sums drifted ~1e-4
    relative on a few million elements, so ZeRO-0 and ZeRO-1 logged different norms for the same gradients."""
    from neox_dar.training.loop import unclipped_grad_norm

    model = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.Linear(1000, 3000))
    for i, p in enumerate(model.parameters()):
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(i))
    exact = torch.cat([p.grad.double().flatten() for p in model.parameters()]).norm()
    assert unclipped_grad_norm(model).item() == pytest.approx(exact.item(), rel=1e-12)


def test_srun_tasks_without_a_rendezvous_are_one_line(monkeypatch, capsys, tmp_path):
    """python train.py inside an allocation of two tasks, without MASTER_ADDR / MASTER_PORT (no launcher): one line
    naming the way out, exit 2 (a ValueError traceback from the environment, twice)."""
    import train

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert train.main([str(TINY), f"save={tmp_path / 'run'}", f"data_path={tmp_path / 'none'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("config error: this process is task 0 of SLURM_NTASKS=2") and "MASTER_ADDR" in err[-1]
