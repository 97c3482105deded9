"""A sweep's view of one run directory: its state for `status` and `submit` (the files themselves and their
readers belong to :mod:`neox_dar.rundir`).

    {run}/config.yml          resolved config (written by `plan`, rewritten identically by train.py)
    {run}/run.json            the sweep's record of the run: sweep, run, axes, configs, overrides
    {run}/status.json         {"state": "running"|"done"|"interrupted"|"failed", "step", "train_iters", "reason"}
    {run}/metrics.jsonl       one JSON object per logged step; validation rows carry `valid_loss`
    {run}/checkpoints/        step_XXXXXXXX checkpoints (the newest complete one is the run's progress)
    {run}/eval/*.json         eval.perplexity results ({"step", "corpora": {name: {...}}})
    {run}/slurm_jobs.txt      SLURM job ids this run was submitted under, one per line
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..rundir import checkpoint_step, job_ids, newest_checkpoint, read_evals, read_metrics, read_status


def newest_checkpoint_step(run_dir: Path) -> int | None:
    """Step of the run's newest complete checkpoint (sizes checked, not checksums: cheap enough for a listing)."""
    found = newest_checkpoint(run_dir, checksums=False, warn=None)
    return checkpoint_step(found) if found is not None else None


def final_eval(run_dir: Path) -> dict | None:
    """The evaluation at the highest step, or None when the run has none."""
    evals = read_evals(run_dir)
    return evals[-1] if evals else None


@dataclass
class RunState:
    """What `status` shows for one run."""

    name: str
    state: str  # pending | running | interrupted | failed | done
    step: int | None
    train_iters: int | None
    loss: float | None
    valid_loss: float | None
    checkpoint: int | None
    evaluated: bool
    jobs: list[str]


def run_state(run_dir: Path, want_eval: bool = False) -> RunState:
    """State of a run from its files; a trained run that still lacks a wanted evaluation is 'evaluating'."""
    run_dir = Path(run_dir)
    status = read_status(run_dir) or {}
    rows = read_metrics(run_dir)
    train_rows = [r for r in rows if "loss" in r]
    valid_rows = [r for r in rows if "valid_loss" in r]
    state = status.get("state", "pending")
    evaluated = final_eval(run_dir) is not None
    if state == "done" and want_eval and not evaluated:
        state = "evaluating"
    step = status.get("step", train_rows[-1].get("step") if train_rows else None)
    return RunState(
        name=run_dir.name, state=state, step=step, train_iters=status.get("train_iters"),
        loss=train_rows[-1]["loss"] if train_rows else None,
        valid_loss=valid_rows[-1]["valid_loss"] if valid_rows else None,
        checkpoint=newest_checkpoint_step(run_dir), evaluated=evaluated, jobs=job_ids(run_dir))
