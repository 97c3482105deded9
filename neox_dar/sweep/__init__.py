"""Config-grid sweeps: plan runs from a sweep file, run them here or on SLURM, follow their state.

See ``python -m neox_dar.sweep --help`` and docs/experiments.md.

The names below are imported when first used (PEP 562), so a command that needs one submodule (``python -m
neox_dar.sweep.job``, run by every SLURM job step) does not import the planner and torch with it.
"""

from __future__ import annotations

import importlib

_FROM = {
    "SweepError": "errors", "RunState": "rundir", "final_eval": "rundir", "run_state": "rundir",
    "SlurmSettings": "slurm", "job_script": "slurm", "render": "slurm", "PlannedRun": "planning", "plan": "planning",
    "plan_row": "planning", "write_plan": "planning", "RunSpec": "spec", "Sweep": "spec", "load_sweep": "spec",
    "parse_sweep": "spec",
}
__all__ = sorted(_FROM)


def __getattr__(name: str):
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_FROM[name]}", __name__), name)
