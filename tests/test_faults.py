"""Preemption, shared directories, full disks and bad run-directory paths, through train.py (issue 24): a kill in
the first seconds, a stale torch extension lock, symbolic links and directories where run files belong, a refused
second launch beside a live run, a full disk outside and inside a checkpoint, and token budgets that repeat the data.
Each case ends in one line and exit 2, or in a run that completes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainrun import BYTES, ROOT, error_line, rows, status, train, train_command, train_env, train_in_process

from neox_dar.rundir import LOCK, STATUS, lock_run_dir, write_status

TWO_STEPS = ["train_iters=2", "eval_interval=0", "checkpoint_factor=2"]
SHORT = [*BYTES, *TWO_STEPS]


@pytest.fixture(scope="module")
def data(byte_tokenized_sample) -> str:
    """The sample under the byte tokenizer: runs here add trainrun.BYTES (what fails is the trainer's start, its
    files and disk, not the model; a 257-token vocabulary makes each start cheaper)."""
    return byte_tokenized_sample


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


def _catches(pid: int, *signals: signal.Signals) -> bool:
    """Whether process ``pid`` has its own handler for every one of ``signals`` (``SigCgt`` in /proc)."""
    caught = int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if line.startswith("SigCgt:")).split()[1], 16)
    return all(caught >> (s - 1) & 1 for s in signals)


def _ignore_usr1() -> None:  # the trainer's start under slurm/launch_node.sh: torchrun runs with USR1 ignored
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def test_a_trainer_killed_in_its_first_seconds_starts_again(data, tmp_path):
    """SIGKILL as the trainer takes its run directory (or as a torch extension lock appears, if one ever does):
    before the training loop, followed by nothing but the same command again. That start completes, and no lock is
    left in the extensions cache. (Before: the kill landed while DeepSpeed built its shm_comm op, left the build lock
    behind, and every later start hung.)"""
    cache = tmp_path / "torch_extensions"
    save = tmp_path / "run"
    env = train_env(TORCH_EXTENSIONS_DIR=str(cache))
    proc = subprocess.Popen(train_command(save, data, *SHORT), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not _extension_locks(cache) and not (save / LOCK).exists() \
            and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()[0]
    proc.send_signal(signal.SIGKILL)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == -signal.SIGKILL, output
    assert not (save / "metrics.jsonl").is_file() or not rows(save)  # killed before the training loop
    train(save, data, *SHORT, env=env, timeout=240)
    assert status(save)["state"] == "done" and not _extension_locks(cache)


def test_a_stop_during_start_up_stops_at_the_first_step(data, tmp_path):
    """SIGUSR1 (the time limit; SIGTERM, a cancel, takes the same handler) while the trainer still starts, USR1
    ignored as torchrun under slurm/launch_node.sh hands it on: the run stops at its first step with a checkpoint
    (exit 3, interrupted), and the same command continues it. (Before: the USR1 was ignored and the run trained on,
    so the job requeued itself after a cancel; a TERM killed the start.)"""
    sig = signal.SIGUSR1
    save = tmp_path / "run"
    proc = subprocess.Popen(train_command(save, data, *BYTES, "train_iters=4", "eval_interval=0",
                                          "checkpoint_factor=4"),
                            cwd=ROOT, env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_ignore_usr1)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None and not _catches(proc.pid, signal.SIGTERM, signal.SIGUSR1):
        time.sleep(0.01)
    assert not (save / "metrics.jsonl").is_file(), "the signal came too late: training had started"
    proc.send_signal(sig)
    output = proc.communicate(timeout=240)[0]
    assert proc.returncode == 3, output
    assert status(save)["state"] == "interrupted" and status(save)["step"] == 1, output
    train(save, data, *BYTES, "train_iters=4", "eval_interval=0", "checkpoint_factor=4", timeout=240)
    assert status(save)["state"] == "done" and [r["step"] for r in rows(save) if "loss" in r][-1] == 4


def _default_sigint() -> None:  # a terminal's Ctrl-C reaches a train.py whose SIGINT is not ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_at_a_step_with_a_checkpoint_and_twice_aborts_in_one_line(data, tmp_path):
    """Ctrl-C once in training: a checkpoint at the end of the step, exit 3, interrupted (it was a traceback, status
    failed and every step since the last checkpoint lost); Ctrl-C twice (in the run that continued from it): abort
    at once, one line, exit 130, status interrupted, the checkpoint still recorded."""
    save = tmp_path / "run"
    # 4 x 512 wide: a step and a checkpoint long enough that the second press lands in them, not after the stop
    run = [*BYTES, "num_layers=4", "hidden_size=512", "num_attention_heads=8", "train_iters=400", "eval_interval=0",
           "checkpoint_factor=400", "log_interval=1"]
    for presses, code in ((1, 3), (2, 130)):
        proc = subprocess.Popen(train_command(save, data, *run), cwd=ROOT, env=train_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
        start = len(rows(save)) if (save / "metrics.jsonl").is_file() else 0
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not (
                (save / "metrics.jsonl").is_file() and len(rows(save)) > start):
            time.sleep(0.02)
        for _ in range(presses):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.05)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == code and "Traceback" not in err, err[-3000:]
        assert status(save)["state"] == "interrupted", status(save)
        if presses == 1:
            assert "Ctrl-C: stopping at the end of this step with a checkpoint" in err
            stopped = status(save)["step"]
            assert status(save)["checkpoint"] == stopped < 400
        else:
            assert err.strip().splitlines()[-1].startswith("train.py: interrupted (Ctrl-C)"), err[-2000:]
            assert status(save)["checkpoint"] == stopped and status(save)["reason"] == "aborted with a second Ctrl-C"


def test_a_symlinked_run_lock_is_refused_and_its_target_kept(data, tmp_path):
    """`ln -s victim SAVE/run.lock`, then train: one line, exit 2, and victim keeps its bytes. (Before: the
    trainer wrote its lock JSON into victim.)"""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    save = tmp_path / "run"
    save.mkdir()
    (save / LOCK).symlink_to(victim)
    out = train(save, data, *SHORT, expect=2)
    assert f"{save / LOCK} is a symbolic link" in error_line(out)
    assert victim.read_text() == "precious\n"


def test_a_refused_second_launch_writes_nothing_into_the_run(data, tmp_path):
    """A live run (its lock held, status running) and a finished one: `train.py save=RUN data_path=typo` exits 2 in
    one line and leaves both status files byte for byte, and a valid second launch beside the live run is refused
    by the lock, after saying which epochs its token budget reads. (Before: the typo rewrote status.json to
    failed.)"""
    live, finished = tmp_path / "live", tmp_path / "finished"
    held = lock_run_dir(live)
    write_status(live, "running", 3, 6)
    finished.mkdir()
    write_status(finished, "done", 6, 6)
    before = {d: (d / STATUS).read_bytes() for d in (live, finished)}
    try:
        for save in (live, finished):  # train.py's main in this process: the data path is checked before any start-up
            out = train_in_process(save, str(tmp_path / "typo"), *SHORT)
            assert out.returncode == 2 and "typo" in error_line(out)
            assert (save / STATUS).read_bytes() == before[save]
        out = train(live, data, *BYTES, "train_iters=3000", "eval_interval=0", expect=2)
        assert "in use by another trainer" in error_line(out)
        assert "warning: token budget: 768,000 tokens = " in out.stderr and "more than max_epochs = 1" in out.stderr
        assert (live / STATUS).read_bytes() == before[live]
    finally:
        held.release()


def _on_a_small_disk(save: Path, size: str, driver: str, *args: str) -> subprocess.CompletedProcess:
    """Run the Python ``driver`` with ``args`` while ``save`` is a tmpfs of ``size`` (a private mount namespace:
    the mount goes away with the process); skip where such a mount is not allowed."""
    save.mkdir(parents=True, exist_ok=True)
    script = f"mount -t tmpfs -o size={size} tmpfs {save} && exec {sys.executable} -c \"$0\" \"$@\""
    out = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", script, driver, *args], cwd=ROOT,
                         env=train_env(), capture_output=True, text=True, timeout=600)
    if out.returncode != 0 and ("mount:" in out.stderr or "unshare:" in out.stderr):
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    return out


# train.py with its arguments; once metrics.jsonl holds a row (when the first argument is "fill"), fill the disk;
# then copy status.json out of the tmpfs and pass train.py's output and exit code on
_TRAIN_ON_SMALL_DISK = """
import shutil, subprocess, sys, time
from pathlib import Path
fill, out, save, command = sys.argv[1] == "fill", Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
metrics = save / "metrics.jsonl"
while fill and proc.poll() is None and not (metrics.is_file() and metrics.stat().st_size):
    time.sleep(0.1)
if fill:
    with open(save / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(bytes(1 << 16))
        except OSError:
            pass
    with open(save / "filler", "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"x")
        except OSError:
            pass
stdout, stderr = proc.communicate()
shutil.copy(save / "status.json", out / "status.json")
sys.stdout.write(stdout)
sys.stderr.write(stderr)
sys.exit(proc.returncode)
"""


def test_a_full_disk_while_logging_is_one_line_and_failed(data, tmp_path):
    """The disk fills up during training (metrics.jsonl cannot take the next row): one line naming the file and
    the free space, exit 2, status.json `failed`. (Before: a chained OSError traceback, exit 1, status `running`.)"""
    save = tmp_path / "run"
    command = train_command(save, data, *BYTES, "train_iters=60", "eval_interval=0", "checkpoint_factor=1000")
    out = _on_a_small_disk(save, "16m", _TRAIN_ON_SMALL_DISK, "fill", str(tmp_path), str(save), *command)
    assert out.returncode == 2, out.stderr[-3000:]
    line = error_line(out)
    assert line.startswith(f"error: cannot write {save / 'metrics.jsonl'}: No space left on device (0.00 GiB free")
    written = json.loads((tmp_path / "status.json").read_text())
    assert written["state"] == "failed" and "metrics.jsonl" in written["reason"]


def test_a_full_disk_at_a_checkpoint_says_no_space_left(tokenized_sample, tmp_path):
    """A checkpoint that does not fit: "no space left on device" with the checkpoint's path (not torch's
    "[enforce fail at inline_container.cc:672] . unexpected pos 128 vs 0"), exit 2, status `failed`. (The Pythia
    vocabulary: its ~40 MB checkpoint is what overflows the 48 MB disk.)"""
    save = tmp_path / "run"
    command = train_command(save, tokenized_sample, *TWO_STEPS)
    out = _on_a_small_disk(save, "48m", _TRAIN_ON_SMALL_DISK, "no", str(tmp_path), str(save), *command)
    assert out.returncode == 2, out.stderr[-3000:]
    line = error_line(out)
    assert f"could not write checkpoint {save / 'checkpoints' / 'step_00000002'}: no space left on device (" in line
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "failed"


_TORCH_ON_FULL_DISK = """
import sys, torch
from neox_dar.training.checkpointing import torch_save, write_failure
with open(sys.argv[1] + "/filler", "wb", buffering=0) as f:
    try:
        while True:
            f.write(b"x" * 4096)
    except OSError:
        pass
state = {"state": torch.zeros(4096)}
try:  # what the rng file's save said
    torch.save(state, sys.argv[1] + "/rng.pt")
except RuntimeError as e:
    print(str(e).splitlines()[0])
try:  # the way checkpointing saves every file now: through a Python file
    torch_save(state, sys.argv[1] + "/rng.pt")
except Exception as e:
    print(write_failure(e))
"""


def test_torchs_full_disk_message_reads_no_space_left(tmp_path):
    """torch.save to a path on a full disk says only "[enforce fail at inline_container.cc:672] . unexpected pos";
    saved through a Python file, as checkpoints now are, the error reads "no space left on device"."""
    out = _on_a_small_disk(tmp_path / "mnt", "1m", _TORCH_ON_FULL_DISK, str(tmp_path / "mnt"))
    torch_says, we_say = out.stdout.splitlines()
    assert "unexpected pos" in torch_says and we_say == "no space left on device"


def test_a_ctrl_c_inside_torchs_writer_is_an_interrupt_not_a_failed_write(tmp_path):
    """A second Ctrl-C while torch writes a checkpoint file surfaces as torch's "unexpected pos" RuntimeError with
    the KeyboardInterrupt as its context (here: a file whose third write is interrupted); the run reported it as a
    failed write ("could not write checkpoint ...", state failed). :func:`failed_write` raises the interrupt, so
    the run ends interrupted as at any other moment; a real failure is returned as it was."""
    import io

    import torch

    from neox_dar.training.checkpointing import failed_write

    class Interrupted(io.FileIO):
        writes = 0

        def write(self, b):
            Interrupted.writes += 1
            if Interrupted.writes == 3:
                raise KeyboardInterrupt
            return super().write(b)

    with pytest.raises(RuntimeError, match="unexpected pos") as caught:
        with Interrupted(tmp_path / "rng.pt", "wb") as f:
            torch.save({"a": torch.zeros(1000), "b": torch.ones(100)}, f)
    with pytest.raises(KeyboardInterrupt):
        failed_write(caught.value)
    full = OSError(28, "No space left on device")
    assert failed_write(full) is full


def test_bad_paths_and_values_are_one_line(data, tmp_path):
    """save that is an existing file, lr=.inf, trainable_params=[], LoRA's r 0, dropout 1.5, alpha 0 and no
    target, fp16 without CUDA and finetune without load: one line each, exit 2. (Before: a FileExistsError
    traceback, silent accepts (alpha 0 trained adapters that change nothing; finetune without load trained from
    scratch), and peft's and DeepSpeed's tracebacks.) train.py's main in this process: all are config checks,
    made before the process group and the engine."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    out = train_in_process(tmp_path / "file", data, *SHORT)
    assert out.returncode == 2 and error_line(out) == (
        f"config error: save={tmp_path / 'file'} is a file, not a directory: name a directory for the run")
    for value, why in (("optimizer.params.lr=.inf", "inf (must be a finite number)"),
                       ("trainable_params=[]", "must name at least one pattern"),
                       ('lora={"r": 0}', "'lora.r' in the command line: 0 (must be >= 1)"),
                       ('lora={"dropout": 1.5}', "'lora.dropout' in the command line: 1.5 (must be in [0, 1))"),
                       ('lora={"alpha": 0}', "'lora.alpha' in the command line: 0.0 (must be > 0"),
                       ('lora={"target_modules": []}', "(must name at least one linear layer)"),
                       ("precision=fp16", "precision fp16 needs a CUDA GPU"),
                       (f"load={tmp_path / 'nope'}", f"load={tmp_path / 'nope'} does not exist: name a run directory"),
                       (f"load={tmp_path / 'hf'}", f"load={tmp_path / 'hf'} is a Hugging Face folder: import it first "
                                                   f"(python -m neox_dar.convert from-hf {tmp_path / 'hf'} OUT)"),
                       ("finetune=true", "finetune=true starts from load='s weights, but load is not set")):
        out = train_in_process(tmp_path / "run", data, *SHORT, value)
        assert out.returncode == 2 and why in error_line(out)
        assert not (tmp_path / "run").exists()  # nothing written (a missing load left a run.lock and a status)
    # a run with checkpoints of its own continues from them, whatever became of its load
    (tmp_path / "resumed" / "checkpoints" / "step_00000003").mkdir(parents=True)
    with pytest.raises(AssertionError, match="got past its config and data checks"):
        train_in_process(tmp_path / "resumed", data, *SHORT, f"load={tmp_path / 'nope'}")


def test_triton_without_cuda_is_one_line_before_the_run(data, tmp_path, monkeypatch):
    """attention_impl=triton where it cannot run: without CUDA and Triton's interpreter, and for linear layers
    (flash-linear-attention's kernels) without CUDA at all: one line, exit 2, before the process group. (Before:
    a RuntimeError traceback at the first step.)"""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = train_in_process(tmp_path / "run", data, *SHORT, "attention_type=linear", "attention_impl=triton")
    assert out.returncode == 2 and "flash-linear-attention's kernels, which need a CUDA GPU" in error_line(out)
    monkeypatch.delenv("TRITON_INTERPRET")
    out = train_in_process(tmp_path / "run", data, *SHORT, "attention_type=swa", "attention_impl=triton")
    assert out.returncode == 2 and error_line(out).startswith("config error: attention_impl=triton needs a CUDA GPU")


def test_sweep_plan_prints_the_epochs_a_budget_reads(tokenized_sample, tmp_path, capsys):
    """The DAR Table 1 plan (10B tokens per run) on the 20k-token test sample: each run's row shows the epochs and a
    warning says the data repeats. (Before: planned without a word.)"""
    from neox_dar.sweep.__main__ import main as sweep_main

    assert sweep_main(["configs/sweeps/dar-table1.yml", "plan", "--out", str(tmp_path),
                       f"data_path={tokenized_sample}"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[1].split()[-1] == "epochs" and "5.16e+05" in out.splitlines()[2]
    assert "warning: vanilla: token budget: 9,999,745,024 tokens = 5.16e+05 epochs" in err


INF_GRADIENT = """
import torch
import neox_dar.training.engine as engine_module

build = engine_module.build_engine


def build_with_an_inf_gradient(*args, **kwargs):  # the 3rd backward's (step 2's first) gets an inf
    engine, model, flops = build(*args, **kwargs)
    calls = [0]

    def hook(grad):
        calls[0] += 1
        return grad.index_fill(0, torch.tensor([0]), float("inf")) if calls[0] == 3 else grad

    next(model.parameters()).register_hook(hook)
    return engine, model, flops


engine_module.build_engine = build_with_an_inf_gradient
"""


def test_a_step_deepspeed_skips_is_logged_and_said(data, tmp_path):
    """bf16 (ZeRO-1) with a non-finite gradient at step 2 and a finite loss: DeepSpeed 0.19 skips that optimizer
    step (the weights and the LR schedule stay); the rows from step 2 on carry ``skipped_steps`` and the run says so
    in one warning line (before: only grad_norm inf, while the step count went on)."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(INF_GRADIENT)
    env = {**train_env(), "PYTHONPATH": f"{tmp_path / 'inject'}:{ROOT}"}
    out = train(tmp_path / "run", data, *SHORT, "train_iters=4", "log_interval=1", "precision=bf16", env=env)
    logged = rows(tmp_path / "run")
    assert [r.get("skipped_steps") for r in logged if "loss" in r] == [None, 1, 1, 1]
    assert logged[1]["grad_norm"] == float("inf") and logged[2]["lr"] == logged[1]["lr"]
    assert "warning: DeepSpeed skipped 1 optimizer step(s) up to step 2" in out.stdout + out.stderr


def test_a_diverged_run_stops_failed_in_one_line(data, tmp_path):
    """A loss that is not finite at a log row stops the run: the row is written, status failed with the reason,
    one line, exit 2. (Before: it trained on NaN to the end and its status said done, so sweeps reported it.)"""
    save = tmp_path / "run"
    out = train(save, data, *SHORT, "train_iters=4", "optimizer.params.lr=1e6", expect=2)
    assert error_line(out).startswith("error: the loss is nan at step ") and "training diverged" in error_line(out)
    assert status(save)["state"] == "failed" and "DivergedError" in status(save)["reason"]
    assert rows(save)[-1]["loss"] != rows(save)[-1]["loss"]  # the NaN row is logged
