"""Throughput, model FLOP utilisation and memory of the training loop.

MFU = achieved model FLOP/s per device / peak FLOP/s per device, with model FLOPs from
:func:`neox_dar.model.flops_per_token` (6N + attention; recomputation from activation checkpointing is not
counted, as in PaLM's MFU). Peak: ``peak_flops`` from the config, else the dense bf16/fp16 tensor-core peak of
the detected GPU (table below); unknown devices and CPUs report no MFU unless ``peak_flops`` is set.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

# Dense (no sparsity) bf16/fp16 tensor-core peaks per device, FLOP/s, from the vendors' data sheets.
# Matched in order against torch.cuda.get_device_name(); first match wins.
PEAK_BF16_FLOPS = (
    ("H200", 989e12),
    ("GH200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),       # SXM
    ("H800", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("A6000", 155e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("V100", 125e12),       # fp16 only
    ("MI300X", 1307e12),
    ("MI250X", 383e12),
)


def peak_flops(configured: float | None, device: torch.device, dtype_name: str) -> float | None:
    """Peak FLOP/s per device for MFU: the configured value, else the table's for a bf16/fp16 GPU, else None."""
    if configured is not None:
        return configured
    if device.type != "cuda" or dtype_name not in ("bf16", "fp16"):
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16_FLOPS:
        if key in name:
            return value
    return None


def memory_gb(device: torch.device) -> dict[str, float]:
    """Peak allocated and reserved GPU memory (GB), or the process's peak resident memory on CPU."""
    if device.type == "cuda":
        return {"mem_allocated_gb": torch.cuda.max_memory_allocated(device) / 1e9,
                "mem_reserved_gb": torch.cuda.max_memory_reserved(device) / 1e9}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return {"mem_rss_gb": rss * (1 if sys.platform == "darwin" else 1024) / 1e9}


def throughput(steps: int, seconds: float, global_batch: int, seq_length: int, world_size: int,
               flops_per_token: float, peak: float | None) -> dict[str, float]:
    """tokens/s and samples/s (global), TFLOP/s per device and MFU over ``steps`` optimizer steps."""
    samples_per_sec = steps * global_batch / seconds
    tokens_per_sec = samples_per_sec * seq_length
    tflops = flops_per_token * tokens_per_sec / world_size / 1e12
    out = {"iter_time_s": seconds / steps, "samples_per_sec": samples_per_sec, "tokens_per_sec": tokens_per_sec,
           "tflops_per_device": tflops}
    if peak:
        out["mfu"] = tflops * 1e12 / peak
    return out


def summary_line(timed: list[tuple[int, float]], global_batch: int, seq_length: int, world_size: int,
                 flops_per_token: float, peak: float | None, device: torch.device) -> str:
    """The line a run ends with: tokens/s, TFLOP/s per device and MFU over its log intervals (``timed``: steps and
    seconds of each) after the first, which holds the first step's warm-up (all of them when there is only one), and
    this process's peak memory (GPU: allocated and reserved; CPU: resident)."""
    steady = timed[1:] if len(timed) > 1 else timed
    steps = sum(n for n, _ in steady)
    t = throughput(steps, sum(s for _, s in steady), global_batch, seq_length, world_size, flops_per_token, peak)
    mfu = (f"MFU {100 * t['mfu']:.1f}%" if "mfu" in t
           else "MFU n/a (no peak FLOP/s known for this device and precision: set peak_flops)")
    mem = memory_gb(device)
    memory = (f"peak memory {mem['mem_allocated_gb']:.2f} GB allocated, {mem['mem_reserved_gb']:.2f} GB reserved on "
              "the GPU" if "mem_allocated_gb" in mem
              else f"peak memory {mem['mem_rss_gb']:.2f} GB RSS (the process's resident memory: no GPU)")
    which = "after the first log interval" if len(timed) > 1 else "(one log interval: the first step's warm-up in it)"
    return (f"summary: {steps} steps {which}: {t['tokens_per_sec']:,.0f} tokens/s, {t['tflops_per_device']:.3g} "
            f"TFLOP/s per device, {mfu}, {memory}")


def attention_stat_metrics(stats: dict[str, torch.Tensor]) -> dict:
    """``layer{l}/{name}`` per-head tensors -> ``{name}/layer{l}``: per-head lists and ``{name}``: overall mean."""
    out: dict = {}
    by_name: dict[str, list[torch.Tensor]] = {}
    for key, value in stats.items():
        layer, name = key.split("/", 1)
        v = value.detach().float().reshape(-1).cpu()
        out[f"{name}/{layer}"] = v.tolist()
        by_name.setdefault(name, []).append(v)
    for name, values in by_name.items():
        out[name] = torch.cat(values).mean().item()
    return out


class IntervalClock:
    """The training seconds of the current log interval: wall time since it began, less the time spent in
    :meth:`paused` blocks (validation, corpus evaluation, checkpoints: they are not steps, and counting them, or
    restarting the clock after them while keeping the interval's steps, put tokens/s off)."""

    def __init__(self, now: Callable[[], float] = time.time):
        self.now = now
        self.restart()

    def restart(self) -> None:
        self.start, self.away = self.now(), 0.0

    @contextmanager
    def paused(self) -> Iterator[None]:
        began = self.now()
        try:
            yield
        finally:
            self.away += self.now() - began

    def seconds(self) -> float:
        return self.now() - self.start - self.away
