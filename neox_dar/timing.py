"""Side-by-side timing for the benchmarks that compare us with a peer (``bench/eval_vs_lmeval.py``,
``bench/generate_vs_hf.py``): every side run once per round, in turn, so that the machine's load falls on all of them
alike."""

from __future__ import annotations

import time
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
