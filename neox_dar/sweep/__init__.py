"""Config-grid sweeps: plan runs from a sweep file, run them here or on SLURM, follow their state.

See ``python -m neox_dar.sweep --help`` and docs/experiments.md.
"""

from .errors import SweepError
from .rundir import RunState, final_eval, run_state
from .slurm import SlurmSettings, job_script, render
from .planning import PlannedRun, plan, plan_row, write_plan
from .spec import RunSpec, Sweep, load_sweep, parse_sweep

__all__ = [
    "PlannedRun", "RunSpec", "RunState", "SlurmSettings", "Sweep", "SweepError", "final_eval", "job_script",
    "load_sweep", "parse_sweep", "plan", "plan_row", "render", "run_state", "write_plan",
]
