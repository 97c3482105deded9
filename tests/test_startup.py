"""train.py says where its start-up goes: one line after the first optimizer step with the time per phase, which
add up to the total (issue 28 item 2); and the engine's start imports none of torch's compiler (inductor)."""

from __future__ import annotations

import subprocess
import sys

from neox_dar.training import startup

from trainrun import ROOT, train, train_env

PHASES = ["imports", "config", "process group", "run directory", "data index", "engine", "checkpoint and logs",
          "first step"]


def test_one_startup_line_with_every_phase(tokenized_sample, tmp_path):
    out = train(tmp_path / "run", tokenized_sample, "train_iters=2", "eval_interval=0")
    lines = [line for line in out.stdout.splitlines() if line.startswith(startup.PREFIX)]  # the run's log lines
    assert len(lines) == 1, out.stdout[-3000:] + out.stderr[-3000:]
    parsed = startup.parse(lines[0])
    assert parsed["from"] == "launch" and list(parsed["phases"]) == PHASES
    assert 0 < parsed["cpu_s"] and abs(sum(parsed["phases"].values()) - parsed["total_s"]) <= 0.05 * len(PHASES)
    assert out.stdout.index(startup.PREFIX) < out.stdout.index("step 1/2 | loss")


def test_phases_add_up_and_repeat():
    before = list(startup._marks)
    try:
        startup._marks.clear()
        for name in ("imports", "config", "imports", "first step"):
            startup.mark(name)
        parsed = startup.parse("noise\n" + startup.line() + "\nmore")
        assert list(parsed["phases"]) == ["imports", "config", "first step"]  # a repeated phase adds up
        assert abs(sum(startup.phases().values()) - (startup._marks[-1][1] - startup._START)) < 1e-9
    finally:
        startup._marks[:] = before
    assert startup.parse("no such line") is None


ENGINE = """
import sys, torch
from neox_dar.config import load_config
from neox_dar.training.batches import micro_batch_loss
from neox_dar.training.distributed import init_distributed
from neox_dar.training.engine import build_engine
info = init_distributed()  # as train.py: a one-rank group, DeepSpeed's CPU shm op never built
cfg = load_config("configs/tiny.yml", overrides=["seq_length=16", "train_batch_size=1",
                                                 "train_micro_batch_size_per_gpu=1", "zero_optimization.stage=1"])
engine, model, _ = build_engine(cfg, info)
x = torch.randint(0, 50000, (1, 17))
engine.backward(micro_batch_loss(engine, x[:, :-1], x[:, 1:]))
engine.step()
print("inductor" if "torch._inductor.compile_fx" in sys.modules else "no inductor")
"""


def test_engine_and_first_step_import_no_inductor():
    """DeepSpeed's ZeRO optimizer imports its Muon module, which torch.compile's its kernels at import (torch's
    inductor: a second or more of every start); build_engine imports it with DeepSpeed's compile() a no-op."""
    out = subprocess.run([sys.executable, "-c", ENGINE], cwd=ROOT, env=train_env(LOCAL_RANK="0"),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "no inductor", out.stdout
