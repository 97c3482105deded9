"""docs/training.md's one-GPU smoke recipe (issue 37, item 5) runs as written on the CPU at a tiny scale: the same
command with configs/tiny.yml in place of the 160M config and 4 steps; it ends with the summary line (tokens/s, MFU
-- n/a on a CPU, said so -- and the peak memory, resident memory on a CPU)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from neox_dar.training.metrics import summary_line

from trainrun import ROOT, train_env

RECIPE_START = "python train.py configs/pythia-160m.yml"


def recipe() -> list[str]:
    text = re.sub(r"\\\n\s*", " ", (ROOT / "docs" / "training.md").read_text())  # continued lines joined
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(RECIPE_START)]
    assert len(lines) == 1, f"docs/training.md: one command starting with `{RECIPE_START}`, found {lines}"
    return shlex.split(lines[0])


def test_the_smoke_recipe_prints_tokens_per_second_mfu_and_peak_memory(tmp_path, tokenized_sample):
    words = recipe()
    assert "--max-epochs" in words and "overwrite=true" in words and "train_iters=100" in words
    words[words.index("configs/pythia-160m.yml")] = "configs/tiny.yml"
    swap = {"data_path": tokenized_sample, "save": str(tmp_path / "smoke")}
    words = [f"{w.split('=')[0]}={swap[w.split('=')[0]]}" if w.split("=")[0] in swap else w for w in words]
    tiny = ["train_iters=4", "log_interval=2", "seq_length=32", "train_batch_size=8", "train_micro_batch_size_per_gpu=4"]
    out = subprocess.run([sys.executable, *words[1:], *tiny], cwd=ROOT, env=train_env(), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert "warning: token budget" not in text  # --max-epochs says the repeats are intended
    summary = [ln for ln in text.splitlines() if ln.startswith("summary: ")]
    assert len(summary) == 1, text[-3000:]
    assert re.fullmatch(r"summary: 2 steps after the first log interval: [\d,]+ tokens/s, [\d.e+-]+ TFLOP/s per "
                        r"device, MFU n/a \(no peak FLOP/s known for this device and precision: set peak_flops\), "
                        r"peak memory [\d.]+ GB RSS \(the process's resident memory: no GPU\)", summary[0]), summary[0]


def test_the_summary_line_on_a_gpu_gives_mfu_and_gpu_memory(monkeypatch):
    """The GPU wording, from stand-in numbers (no GPU here): MFU from the peak, memory allocated and reserved; the
    first interval (warm-up) is left out, unless it is the only one."""
    import neox_dar.training.metrics as metrics

    monkeypatch.setattr(metrics, "memory_gb", lambda device: {"mem_allocated_gb": 10.0, "mem_reserved_gb": 12.5})
    line = summary_line([(10, 100.0), (10, 2.0), (10, 2.0)], 32, 2048, 1, 1e9, 1e15, "cuda")
    assert line == ("summary: 20 steps after the first log interval: 327,680 tokens/s, 328 TFLOP/s per device, "
                    "MFU 32.8%, peak memory 10.00 GB allocated, 12.50 GB reserved on the GPU")
    assert summary_line([(5, 1.0)], 1, 10, 1, 1e9, None, "cuda").startswith(
        "summary: 5 steps (one log interval: the first step's warm-up in it): 50 tokens/s")
