"""Timing for the benchmarks: side by side for those that compare us with a peer (``bench/eval_vs_lmeval.py``,
``bench/generate_vs_hf.py``: every side run once per round, in turn, so that the machine's load falls on all of them
alike), of a child process whose output is read as it comes (``bench/quickstart.py``, ``bench/startup.py``), and of
one call's host and device time (``bench/attention.py``, ``bench/decode.py``: :func:`host_ms`,
:func:`launch_profile`)."""

from __future__ import annotations

import resource
import statistics
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable


def interleaved(sides: dict[str, Callable[[], Any]], warmup: int, repeats: int, label: str = ""
                ) -> tuple[dict[str, dict[str, list[float]]], dict[str, Any]]:
    """Run ``warmup + repeats`` rounds of every side in order, printing one line per round. Returns each side's
    ``{"wall_s": [...], "cpu_s": [...]}`` over the ``repeats`` timed rounds (process CPU time: this process's
    threads) and each side's result of the last round."""
    times = {name: {"wall_s": [], "cpu_s": []} for name in sides}
    results: dict[str, Any] = {}
    for rnd in range(warmup + repeats):
        line = []
        for name, fn in sides.items():
            w0, c0 = time.perf_counter(), time.process_time()
            results[name] = fn()
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            if rnd >= warmup:
                times[name]["wall_s"].append(wall)
                times[name]["cpu_s"].append(cpu)
            line.append(f"{name} {wall:.2f} s wall / {cpu:.2f} s CPU")
        print(f"{label}{'warm-up' if rnd < warmup else f'round {rnd - warmup + 1}'}: " + ", ".join(line), flush=True)
    return times, results


@dataclass
class ChildRun:
    """What :func:`run_child` saw: exit status, the output lines, wall seconds, and CPU seconds (user + system) of
    the child and everything it waited for."""

    returncode: int
    lines: list[str]
    wall_s: float
    cpu_s: float

    def tail(self, chars: int = 3000) -> str:
        return "".join(self.lines)[-chars:]


def run_child(cmd: list[str], on_line: Callable[[str, float], None] | None = None, **popen: Any) -> ChildRun:
    """Run ``cmd`` (stdout and stderr merged, text), calling ``on_line(line, seconds since the start)`` for each line
    as it comes; ``popen`` goes to :class:`subprocess.Popen` (``cwd``, ``env``). The CPU time is the difference of
    ``RUSAGE_CHILDREN`` around the run: run one child at a time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)
    lines = []
    for text in proc.stdout:
        lines.append(text)
        if on_line is not None:
            on_line(text, time.perf_counter() - t0)
    rc = proc.wait()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return ChildRun(rc, lines, wall, cpu)


def host_ms(fn, device, calls: int = 10) -> float:
    """Median milliseconds the host takes to return from ``fn()`` with ``device`` idle at the start (synchronized
    before each call, not after): on the GPU the time to issue the call's work. Near the call's device-timed
    milliseconds, the host sets the pace; well below, the device does. On CPU the call's wall time."""
    from .provenance import synchronize

    times = []
    for _ in range(calls):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    synchronize(device)
    return statistics.median(times)


def launch_profile(fn, device, top: int = 12) -> dict:
    """``fn()`` once more (it has run already: tuned, compiled) under torch's profiler. On the GPU: every CUDA
    kernel it launched, with its launches and device microseconds, their sums, and the call's wall microseconds to
    the end of its last kernel; a wall time well above the kernels' sum is time the device waits for the host
    (launch path, allocations, synchronizations; the profiler's own per-op cost is in the wall time too). On CPU
    the same for the aten ops (the interpreter's kernels are Python), which checks the plumbing only. ``kernels``:
    the ``top`` longest. ``host``: the ``top`` host events by their own CPU microseconds (aten ops and, on a GPU, the
    CUDA runtime's calls: a ``cudaStreamSynchronize`` or a library's planning shows there)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from .provenance import synchronize

    gpu = device.type == "cuda"
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])) as prof:
        start = time.perf_counter()
        fn()
        synchronize(device)
        wall_us = (time.perf_counter() - start) * 1e6

    events = prof.key_averages()

    def longest(device_type, field: str) -> list[tuple[str, int, float]]:  # (name, count, us), longest first
        return sorted(((e.key, e.count, round(getattr(e, field), 1)) for e in events if e.device_type == device_type),
                      key=lambda x: -x[2])

    host = longest(DeviceType.CPU, "self_cpu_time_total")
    kernels = longest(DeviceType.CUDA, "self_device_time_total") if gpu else host
    return {"what": "CUDA kernels" if gpu else "aten ops (CPU)", "wall_us": round(wall_us, 1),
            "launches": sum(n for _, n, _ in kernels), "kernel_us": round(sum(us for _, _, us in kernels), 1),
            "kernels": [{"name": k, "launches": n, "us": us} for k, n, us in kernels[:top]],
            "host": [{"name": k, "calls": n, "us": us} for k, n, us in host[:top]]}
