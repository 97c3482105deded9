"""Reading one run directory as the trainer and the evaluator leave it.

    {run}/config.yml          resolved config (written by `plan`, rewritten identically by train.py)
    {run}/run.json            the sweep's record of the run: sweep, run, axes, configs, overrides
    {run}/status.json         {"state": "running"|"done"|"interrupted"|"failed", "step": N, "train_iters": M}
    {run}/metrics.jsonl       one JSON object per logged step; validation rows carry `valid_loss`
    {run}/checkpoints/latest  name of the newest complete checkpoint (step_XXXXXXXX)
    {run}/eval/*.json         eval.perplexity results ({"step", "corpora": {name: {...}}})
    {run}/slurm_jobs.txt      SLURM job ids this run was submitted under, one per line
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATUS = "status.json"
METRICS = "metrics.jsonl"
EVAL_DIR = "eval"
FINAL_EVAL = "perplexity.json"
JOBS = "slurm_jobs.txt"


class RunFileError(ValueError):
    """A run file that exists but cannot be read, named with its path."""


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RunFileError(f"{path}: not valid JSON ({e})") from None


def read_status(run_dir: Path) -> dict | None:
    """The trainer's status.json, or None before training started."""
    p = Path(run_dir) / STATUS
    return read_json(p) if p.is_file() else None


def read_metrics(run_dir: Path) -> list[dict]:
    """Every row of metrics.jsonl; a torn last line (a run writing right now) is left out."""
    p = Path(run_dir) / METRICS
    if not p.is_file():
        return []
    lines = p.read_text().splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break
            raise RunFileError(f"{p}:{i + 1}: not valid JSON ({e})") from None
    return rows


def checkpoint_step(run_dir: Path) -> int | None:
    """Step of the newest complete checkpoint (from checkpoints/latest), or None."""
    latest = Path(run_dir) / "checkpoints" / "latest"
    if not latest.is_file():
        return None
    m = re.search(r"(\d+)$", latest.read_text().strip())
    return int(m.group(1)) if m else None


def read_evals(run_dir: Path) -> list[dict]:
    """All eval.perplexity results of the run, sorted by step (results without a step sort last)."""
    d = Path(run_dir) / EVAL_DIR
    if not d.is_dir():
        return []
    results = []
    for p in sorted(d.glob("*.json")):
        r = read_json(p)
        if isinstance(r, dict) and isinstance(r.get("corpora"), dict):
            r = dict(r, _path=str(p))
            results.append(r)
    return sorted(results, key=lambda r: (r.get("step") is None, r.get("step") or 0))


def final_eval(run_dir: Path) -> dict | None:
    """The evaluation at the highest step, or None when the run has none."""
    evals = read_evals(run_dir)
    return evals[-1] if evals else None


def job_ids(run_dir: Path) -> list[str]:
    p = Path(run_dir) / JOBS
    return [ln.strip() for ln in p.read_text().splitlines() if ln.strip()] if p.is_file() else []


def record_job(run_dir: Path, job_id: str) -> None:
    with open(Path(run_dir) / JOBS, "a") as f:
        f.write(job_id + "\n")


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
        checkpoint=checkpoint_step(run_dir), evaluated=evaluated, jobs=job_ids(run_dir))
