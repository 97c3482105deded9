"""A sweep's view of one run directory: its state for `status`, `run`, `submit` and the job script (the files
themselves and their readers belong to :mod:`neox_dar.rundir`).

    {run}/config.yml          resolved config (written by `plan`, rewritten identically by train.py)
    {run}/run.json            the sweep's record of the run: sweep, run, axes, configs, overrides
    {run}/status.json         the trainer's {"state": "running"|"done"|"interrupted"|"failed", "step", ...}, written
                              when training starts and ends
    {run}/metrics.jsonl       one JSON object per logged step: the progress while training
    {run}/run.lock            held by the trainer while it runs
    {run}/checkpoints/        step_XXXXXXXX checkpoints (the newest complete one is the run's progress)
    {run}/eval/perplexity.json  the sweep's evaluation, with the checkpoint "step" it scored
    {run}/slurm_jobs.txt      SLURM job ids this run was submitted under, one per line

A run is *trained* when the trainer said ``done`` at a step >= the config's ``train_iters`` (raising ``train_iters``
re-opens a finished run: state ``extend``), and *evaluated* when ``eval/perplexity.json`` scored its newest
checkpoint (a run trained further since is evaluated again) and holds the sweep's extra corpora. The job script
asks through :mod:`neox_dar.sweep.job`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..rundir import (CONFIG, EVAL_DIR, FINAL_EVAL, checkpoint_step, job_ids, lock_holder, newest_checkpoint,
                      read_json, read_metrics, read_status)

# SLURM job states that mean "not started yet" (anything else live is running or finishing)
WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "SUSPENDED", "RESIZING"}


def newest_checkpoint_step(run_dir: Path) -> int | None:
    """Step of the run's newest complete checkpoint (sizes checked, not checksums: cheap enough for a listing)."""
    found = newest_checkpoint(run_dir, checksums=False, warn=None)
    return checkpoint_step(found) if found is not None else None


def final_eval(run_dir: Path) -> dict | None:
    """The sweep's evaluation of the run (``eval/perplexity.json``), or None."""
    path = Path(run_dir) / EVAL_DIR / FINAL_EVAL
    return read_json(path) if path.is_file() else None


def planned_iters(run_dir: Path) -> int | None:
    """``train_iters`` of the run's config (what the sweep asks for now), None without a config."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        return None
    value = (yaml.safe_load(path.read_text()) or {}).get("train_iters")
    return int(value) if value is not None else None


@dataclass
class RunState:
    """What `status` shows for one run.

    ``state``: pending (never started), queued (a SLURM job waits for it), running, stale (the trainer's status says
    running, but no process holds the run and no job of it is alive: it died without a word), interrupted (stopped
    at a checkpoint; continue it), failed, extend (finished at fewer steps than ``train_iters`` asks now), trained
    (to be evaluated), evaluating (trained, its job is running), done."""

    name: str
    state: str
    step: int | None  # training progress: the newest logged step (status.json is written only at start and end)
    train_iters: int | None  # from the config
    loss: float | None
    valid_loss: float | None
    checkpoint: int | None
    eval_step: int | None  # the checkpoint step the sweep's evaluation scored
    jobs: dict[str, str]  # every recorded job id -> its live SLURM state, or "" when SLURM no longer holds it
    holder: str | None  # the process holding the run's lock

    @property
    def trained(self) -> bool:
        return self.state in ("trained", "evaluating", "done")

    @property
    def evaluated(self) -> bool:
        return _evaluated(self.eval_step, self.checkpoint)


def _trained(status: dict, train_iters: int | None) -> bool:
    """The trainer said done at ``train_iters`` steps or more."""
    return status.get("state") == "done" and (train_iters is None or (status.get("step") or 0) >= train_iters)


def _evaluated(eval_step: int | None, checkpoint: int | None) -> bool:
    """The evaluation scored the newest checkpoint."""
    return eval_step is not None and (checkpoint is None or eval_step == checkpoint)


def _complete(ev: dict | None, extra: Sequence[str]) -> bool:
    """The evaluation holds every extra corpus the sweep asks for."""
    return ev is not None and all(name in (ev.get("corpora") or {}) for name in extra)


def run_state(run_dir: Path, want_eval: bool = False, queue: dict[str, str] | None = None,
              extra: Sequence[str] = ()) -> RunState:
    """State of a run from its files, its lock and ``queue`` (its job ids -> live SLURM states; None: no SLURM);
    ``extra``: the sweep's extra corpora, which an evaluation must hold to count."""
    run_dir = Path(run_dir)
    status = read_status(run_dir) or {}
    rows = read_metrics(run_dir)
    train_rows = [r for r in rows if "loss" in r and "step" in r]
    valid_rows = [r for r in rows if "valid_loss" in r]
    train_iters = planned_iters(run_dir) or status.get("train_iters")
    steps = [s for s in (status.get("step"), train_rows[-1]["step"] if train_rows else None) if s is not None]
    checkpoint = newest_checkpoint_step(run_dir)
    ev = final_eval(run_dir)
    jobs = {j: (queue or {}).get(j, "") for j in job_ids(run_dir)}
    live = {s for s in jobs.values() if s}
    holder = lock_holder(run_dir)
    st = RunState(name=run_dir.name, state=status.get("state", "pending"), step=max(steps) if steps else None,
                  train_iters=train_iters, loss=train_rows[-1]["loss"] if train_rows else None,
                  valid_loss=valid_rows[-1]["valid_loss"] if valid_rows else None, checkpoint=checkpoint,
                  eval_step=ev.get("step") if _complete(ev, extra) else None, jobs=jobs, holder=holder)
    trained = _trained(status, train_iters)
    if trained:
        st.state = "done" if st.evaluated or not want_eval else "trained"
    elif st.state == "done":
        st.state = "extend"
    if holder is not None:
        st.state = "running"
    elif live and live <= WAITING:
        st.state = "queued"
    elif live:
        st.state = "evaluating" if trained and st.state == "trained" else "done" if st.state == "done" else "running"
    elif st.state == "running":
        st.state = "stale"
    return st


def needs_training(run_dir: Path) -> bool:
    return not _trained(read_status(run_dir) or {}, planned_iters(run_dir))


def needs_eval(run_dir: Path, extra: Sequence[str] = ()) -> bool:
    ev = final_eval(run_dir)
    return not (_complete(ev, extra) and _evaluated(ev.get("step"), newest_checkpoint_step(run_dir)))
