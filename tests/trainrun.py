"""Running train.py in a subprocess the way a user does, and reading what the run left (shared by the tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = 6
# a tiny model, seq_length 32, global batch 8, 6 steps, fp32: seconds per run on a CPU
COMMON = [
    "configs/tiny.yml", "configs/attention/vanilla.yml", "seq_length=32", f"train_iters={STEPS}",
    "train_batch_size=8", "train_micro_batch_size_per_gpu=4", "log_interval=1", "eval_interval=3", "eval_iters=2",
    "checkpoint_factor=3", "keep_last_n=3", "precision=fp32", "warmup=0.34",
]


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
    """Run train.py to completion within ``timeout`` seconds; assert its exit code (unless ``expect`` is None)."""
    out = subprocess.run(train_command(save, data, *overrides, nproc=nproc), cwd=ROOT, env=env or train_env(),
                         capture_output=True, text=True, timeout=timeout, preexec_fn=preexec_fn)
    if expect is not None:
        assert out.returncode == expect, f"exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out


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
