"""Running train.py in a subprocess the way a user does, and reading what the run left (shared by the tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fork_server import run_forked

ROOT = Path(__file__).resolve().parents[1]
STEPS = 6
# a tiny model, seq_length 32, global batch 8, 6 steps, fp32: seconds per run on a CPU
COMMON = [
    "configs/tiny.yml", "configs/attention/vanilla.yml", "seq_length=32", f"train_iters={STEPS}",
    "train_batch_size=8", "train_micro_batch_size_per_gpu=4", "log_interval=1", "eval_interval=3", "eval_iters=2",
    "checkpoint_factor=3", "keep_last_n=3", "precision=fp32", "warmup=0.34",
]


# Runs whose assertions are about the trainer's mechanics (checkpoints, resumes, model families), not about the
# Pythia vocabulary, can train on the sample tokenized with the byte tokenizer (257 ids, 384 embedding rows with
# configs/tiny.yml's rounding) instead: the same code paths with a ~45x smaller output layer, so steps, checkpoints
# (~3 MB instead of ~130 MB), their checksums and resumes cost a fraction. Add BYTES to the run's overrides and train
# on byte_sample()'s prefix.
BYTE_TOKENIZER = ROOT / "data" / "byte_tokenizer.json"
BYTES = [f"vocab_file={BYTE_TOKENIZER}", "vocab_size=257"]


def byte_sample(out_dir: Path) -> str:
    """The embedded C4 sample's first 20,000 tokens under the byte tokenizer (as conftest's ``tokenized_sample`` is
    under the Pythia tokenizer), written to ``out_dir/c4``; returns the prefix."""
    from data_prep.tokenize import run

    prefix = Path(out_dir) / "c4"
    run([str(ROOT / "data" / "sample" / "c4_sample.jsonl"), "--tokenizer", str(BYTE_TOKENIZER), "--out", str(prefix),
         "--max-tokens", "20000", "--workers", "1", "--no-progress"])
    return str(prefix)


def train_env(**extra: str) -> dict:
    env = dict(os.environ)
    # one thread per process: identical kernels in every run (exact resume), no oversubscription
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), WANDB_MODE="offline", **extra)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    return env


def train_command(save: Path, data: str, *overrides: str, nproc: int = 1) -> list[str]:
    args = [*COMMON, f"data_path={data}", f"save={save}", *overrides]
    if nproc == 1:
        return [sys.executable, "train.py", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "train.py", *args]


def train(save: Path, data: str, *overrides: str, nproc: int = 1, expect: int | None = 0, env: dict | None = None,
          preexec_fn=None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run train.py to completion within ``timeout`` seconds; assert its exit code (unless ``expect`` is None). One
    process is forked from this worker's :mod:`fork_server` (the same run, without its ~2.5 s of imports) when its
    environment allows; any other run is a process of its own."""
    command = train_command(save, data, *overrides, nproc=nproc)
    out = None
    if nproc == 1 and preexec_fn is None:
        out = run_forked(command[1:], env or train_env(), timeout, train_env())
    if out is None:
        out = subprocess.run(command, cwd=ROOT, env=env or train_env(), capture_output=True, text=True,
                             timeout=timeout, preexec_fn=preexec_fn)
    if expect is not None:
        assert out.returncode == expect, f"exit {out.returncode}\n{_causes(out.stderr)}{out.stdout[-3000:]}\n" \
                                         f"{out.stderr[-5000:]}"
    return out


def trained_once(tmp_path_factory, name: str, data: str, *overrides: str, nproc: int = 1) -> Path:
    """The run directory of :func:`train` ``(save, data, *overrides)``, trained once per test session and shared by
    the xdist workers (:func:`session_cache.built_once`); ``{save}`` in an override is that run directory."""
    from session_cache import built_once

    def run(save: Path) -> str:
        train(save, data, *(o.replace("{save}", str(save)) for o in overrides), nproc=nproc)
        return str(save)

    return Path(built_once(tmp_path_factory, name, run))


def _causes(stderr: str) -> str:
    """The lines of a failed run's whole stderr that say why a process died (a C++ abort's message, a Python error),
    which torchrun's own report after them can push out of the tail."""
    keys = ("terminate called", "what():", "Error", "error:", "Aborted", "Signal ")
    lines = [line for line in stderr.splitlines() if any(k in line for k in keys)]
    return "".join(f"cause? {line}\n" for line in lines[:40])


def train_in_process(save: Path, data: str, *overrides: str) -> subprocess.CompletedProcess:
    """train.py's ``main`` with :func:`train`'s arguments, run in this process from the repository root: for a run
    that ends at its config and data checks (``config error: ...``, exit 2), which come before the process group,
    the engine and anything the run leaves in this process, so the same command costs no interpreter start-up.
    Returns its exit code and what it printed (as :func:`train` does); a run that gets as far as the process group
    is an error of the test (use :func:`train`)."""
    import contextlib
    import importlib.util
    import io
    from unittest import mock

    spec = importlib.util.spec_from_file_location("train_py", ROOT / "train.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def past_the_checks():
        raise AssertionError("train_in_process: the run got past its config and data checks; run it with train()")

    argv = train_command(save, data, *overrides)[2:]
    stdout, stderr = io.StringIO(), io.StringIO()
    with (contextlib.chdir(ROOT), mock.patch("neox_dar.training.distributed.init_distributed", past_the_checks),
          contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr)):
        code = script.main(argv)
    return subprocess.CompletedProcess(["train.py", *argv], code, stdout.getvalue(), stderr.getvalue())


def rows(save: Path) -> list[dict]:
    return [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]


def losses(save: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in rows(save) if "loss" in r}


def valid_losses(save: Path) -> dict[int, float]:
    return {r["step"]: r["valid_loss"] for r in rows(save) if "valid_loss" in r}


def status(save: Path) -> dict:
    return json.loads((save / "status.json").read_text())


def error_line(out: subprocess.CompletedProcess) -> str:
    """The one line a failed run printed on stderr (after DeepSpeed's own start-up notices)."""
    lines = [line for line in out.stderr.strip().splitlines() if line.startswith(("error:", "config error:"))]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    return lines[0]
