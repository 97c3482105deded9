"""Where a trainer's start-up goes: the time from the process's launch to its first optimizer step, by phase.

``train.py`` and the training loop call :func:`mark` at the end of each phase; after the first optimizer step rank 0
logs :func:`line` once, e.g. ``start-up: 9.8 s from launch to the first optimizer step, 6.0 s of it on the CPU
(imports 4.1 s, config 0.2 s, process group 0.3 s, run directory 0.1 s, data index 0.4 s, engine 3.0 s, checkpoint
and logs 0.1 s, first step 1.6 s)``. Each phase runs from the previous mark to its own, the first from the process's
creation (Linux: ``/proc/self/stat`` against ``/proc/uptime``; elsewhere from the moment this module was imported,
and the line says so), so the phases add up to the total. ``bench/startup.py`` reads the line.
"""

from __future__ import annotations

import os
import re
import time

PREFIX = "start-up: "
LINE = re.compile(r"start-up: ([\d.]+) s from (.+) to the first optimizer step, ([\d.]+) s of it on the CPU \((.*)\)")


def _seconds_since_launch() -> float | None:
    """Seconds since this process was created (Linux), None where /proc does not tell."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, after the comm field
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


_since = _seconds_since_launch()
_FROM_LAUNCH = _since is not None
_START = time.monotonic() - (_since or 0.0)
_marks: list[tuple[str, float, float]] = []  # (phase, monotonic time, process CPU time) at its end


def mark(phase: str) -> None:
    """The phase ``phase`` ends now (it began at the previous mark, or at launch)."""
    _marks.append((phase, time.monotonic(), time.process_time()))


def phases() -> dict[str, float]:
    """Seconds per phase, in order (a phase marked twice adds up)."""
    out: dict[str, float] = {}
    previous = _START
    for name, t, _ in _marks:
        out[name] = out.get(name, 0.0) + t - previous
        previous = t
    return out


def line() -> str:
    """The one start-up line: the wall time to the last mark, the process's CPU time by then (all its threads), and
    each phase's wall time, in seconds."""
    parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases().items())
    _, end, cpu = _marks[-1] if _marks else ("", time.monotonic(), time.process_time())
    origin = "launch" if _FROM_LAUNCH else "the start-up clock's import (no /proc: the interpreter's start is unknown)"
    return (f"{PREFIX}{end - _START:.1f} s from {origin} to the first optimizer step, {cpu:.1f} s of it on the CPU "
            f"({parts})")


def parse(text: str) -> dict | None:
    """The start-up line in ``text`` (a trainer's stderr) -> ``{"total_s", "from", "cpu_s", "phases": {name: s}}``;
    None when there is none."""
    m = LINE.search(text)
    if m is None:
        return None
    phases = {}
    for part in m.group(4).split(", "):
        name, seconds, _ = part.rsplit(" ", 2)
        phases[name] = float(seconds)
    return {"total_s": float(m.group(1)), "from": m.group(2), "cpu_s": float(m.group(3)), "phases": phases}
