"""Config-grid sweeps: plan runs from a sweep file, run them here or on SLURM, follow their state.

See ``python -m neox_dar.sweep --help`` and docs/experiments.md.
"""

from .rundir import RunState, final_eval, read_metrics, read_status, run_state
from .slurm import SlurmSettings, job_script, render
from .spec import PlannedRun, RunSpec, Sweep, SweepError, describe, load_sweep, parse_sweep, plan, write_plan

__all__ = [
    "PlannedRun", "RunSpec", "RunState", "SlurmSettings", "Sweep", "SweepError", "describe", "final_eval",
    "job_script", "load_sweep", "parse_sweep", "plan", "read_metrics", "read_status", "render", "run_state",
    "write_plan",
]
