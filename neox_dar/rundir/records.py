"""The run's records beside its checkpoints: ``status.json``, ``metrics.jsonl``, ``eval/*.json`` and the SLURM job
ids, read and written so that a kill never leaves a torn file."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .files import EVAL_DIR, JOBS, METRICS, RunFileError, RunWriteError, STATUS, NO_SPACE, append_text, open_run_file, write_text_atomic


def read_json(path: Path) -> Any:
    """The JSON value in a run file; RunFileError (one line) naming it and how to recover when it is not valid JSON
    (a write cut short by an older version, a full disk, an edit)."""
    try:
        return json.loads(Path(path).read_text())
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise RunFileError(f"{path}: not valid JSON ({e}); {recovery(Path(path))}") from None


def recovery(path: Path) -> str:
    """How to recover from a damaged run file ``path``: what to delete and which command writes it again."""
    if path.parent.name == EVAL_DIR:
        return (f"delete it and evaluate the run again (python -m eval.perplexity RUN --out {path}, or the sweep's "
                "run --local)")
    return "restore it from a copy, or delete it and run the command that writes it again"


def write_status(run_dir: str | Path, state: str, step: int, train_iters: int, **extra) -> None:
    """``{run}/status.json`` = {"state": running|done|interrupted|failed, "step", "train_iters", ...}."""
    body = {"state": state, "step": step, "train_iters": train_iters, **extra,
            "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path, text = Path(run_dir) / STATUS, json.dumps(body) + "\n"
    try:
        write_text_atomic(path, text)
    except RunWriteError as e:
        if e.errno not in NO_SPACE or not _rewrite_in_place(path, text):
            raise


def _rewrite_in_place(path: Path, text: str) -> bool:
    """Overwrite an existing small file in its own blocks (no new space needed: a full disk still takes the final
    status); False when there is no such file or that fails too. Not atomic: the last resort only."""
    try:
        fd = open_run_file(path, os.O_WRONLY)
    except (RunFileError, RunWriteError):
        return False
    try:
        data = text.encode()
        if os.pwrite(fd, data, 0) != len(data):
            return False
        os.ftruncate(fd, len(data))
        os.fsync(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def read_status(run_dir: str | Path) -> dict | None:
    """The trainer's status.json, or None before training started."""
    p = Path(run_dir) / STATUS
    return read_json(p) if p.is_file() else None


def recorded_checkpoint(run_dir: str | Path) -> int:
    """The step of the newest checkpoint the run's status.json records (its ``checkpoint``; a status written before
    that key existed: its step when done or interrupted, which always save), 0 when it records none."""
    status = read_status(run_dir) or {}
    if "checkpoint" in status:
        return int(status["checkpoint"] or 0)
    return int(status.get("step") or 0) if status.get("state") in ("done", "interrupted") else 0


def read_metrics(run_dir: str | Path) -> list[dict]:
    """Every row of metrics.jsonl; a torn last line (a run writing right now, or killed) is left out. A row that is
    not a JSON object, or bytes that are not UTF-8, are a RunFileError naming the line."""
    p = Path(run_dir) / METRICS
    if not p.is_file():
        return []
    try:
        lines = p.read_text().splitlines()
    except UnicodeDecodeError as e:
        raise RunFileError(f"{p}: not UTF-8 text ({e}); {recovery(p)}") from None
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break
            raise RunFileError(f"{p}:{i + 1}: not valid JSON ({e})") from None
        if not isinstance(row, dict):
            raise RunFileError(f"{p}:{i + 1}: a row must be a JSON object, got {line.strip()[:40]}; {recovery(p)}")
        rows.append(row)
    return rows


def truncate_metrics(run_dir: str | Path, step: int) -> None:
    """Drop rows logged after ``step`` (by a run that died after its last checkpoint) before resuming."""
    rows = [r for r in read_metrics(run_dir) if r.get("step", 0) <= step]
    if (Path(run_dir) / METRICS).is_file():
        write_text_atomic(Path(run_dir) / METRICS, "".join(json.dumps(r) + "\n" for r in rows))


def read_evals(run_dir: str | Path) -> list[dict]:
    """All evaluation results of the run, sorted by step (results without a step sort last). A result whose
    ``corpora`` entry is not an object of metrics is a RunFileError naming the file and the corpus."""
    d = Path(run_dir) / EVAL_DIR
    if not d.is_dir():
        return []
    results = []
    for p in sorted(d.glob("*.json")):
        r = read_json(p)
        if isinstance(r, dict) and isinstance(r.get("corpora"), dict):
            for corpus, entry in r["corpora"].items():
                if not isinstance(entry, dict):
                    raise RunFileError(f"{p}: corpus '{corpus}' is {str(entry)[:40]!r}, not an object of metrics; "
                                       f"{recovery(p)}")
            results.append(dict(r, _path=str(p)))
    return sorted(results, key=lambda r: (r.get("step") is None, r.get("step") or 0))


def job_ids(run_dir: str | Path) -> list[str]:
    p = Path(run_dir) / JOBS
    return [ln.strip() for ln in p.read_text().splitlines() if ln.strip()] if p.is_file() else []


def record_job(run_dir: str | Path, job_id: str) -> None:
    path = Path(run_dir) / JOBS
    fd = open_run_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        append_text(fd, job_id + "\n", path)
    finally:
        os.close(fd)


