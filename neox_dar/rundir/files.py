"""The run directory: the one owner of every file name in it, of atomic writes and of checkpoint integrity.

    {save}/config.yml                   the run's resolved config (written when training starts)
    {save}/status.json                  {"state": running|done|interrupted|failed, "step", "train_iters",
                                         "checkpoint" (the newest checkpoint's step, 0: none yet),
                                         "reason" (failed), "updated_at"}
    {save}/metrics.jsonl                one JSON object per logged step (training and validation rows)
    {save}/eval/*.json                  rolling-window evaluations ({"step", "corpora": {...}})
    {save}/run.json                     a sweep's record of the run (sweep, run, axes, configs, overrides)
    {save}/slurm_jobs.txt               SLURM job ids the run was submitted under, one per line
    {save}/wandb_run_id                 the W&B run id (a resumed run continues the same W&B run)
    {save}/run.lock                     held (flock) by the trainer writing the run: {"host", "pid", "since"}
    {save}/checkpoints/step_XXXXXXXX/   one complete checkpoint:
        model.safetensors               consolidated fp32 weights (Hugging Face names)
        model.yml                       the model section of the config alone (all that building the model needs)
        config.yml                      the resolved config of the run
        state.json                      step, consumed samples, provenance, and the manifest: every file of the
                                        checkpoint with its size and xxh3-64 checksum (written last), and the
                                        xxh3-64 checksum of its own contents
        rng_rankNNNNN.pt, DeepSpeed's model and optimizer files
    {save}/checkpoints/latest           name of the newest complete checkpoint (for people and external tools)
    {save}/checkpoints/.tmp-step_X/     a checkpoint being written; renamed to step_X once complete
    {save}/checkpoints/.del-step_X/     a checkpoint being deleted; renamed first, so a kill never leaves a
                                        half-deleted step_X behind

A checkpoint is *complete* when every file its manifest lists is there with the recorded size and checksum.
Resuming, evaluation and conversion all find checkpoints through :func:`newest_checkpoint` /
:func:`resolve_checkpoint` and refuse one that fails the check, saying why.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import shutil
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import xxhash

log = logging.getLogger("neox_dar.rundir")

CONFIG = "config.yml"
MODEL_CONFIG = "model.yml"
STATUS = "status.json"
METRICS = "metrics.jsonl"
EVAL_DIR = "eval"
FINAL_EVAL = "perplexity.json"
RUN_META = "run.json"
JOBS = "slurm_jobs.txt"
WANDB_ID = "wandb_run_id"
LOCK = "run.lock"
CHECKPOINTS = "checkpoints"
LATEST = "latest"
WEIGHTS = "model.safetensors"
STATE = "state.json"
STEP_PREFIX = "step_"
TMP_PREFIX = ".tmp-"
DEL_PREFIX = ".del-"
CHECKSUM = "xxh3_64"
STATE_CHECKSUM = "checksum"  # state.json's checksum of its own contents

# Fault injection for the crash tests: "POINT" or "POINT:N" SIGKILLs this process the N-th time (default 1st)
# it passes POINT (save-written, save-renamed, latest-written, prune-renamed, prune-deleting).
KILL_AT_ENV = "NEOX_DAR_KILL_AT"
_passes: dict[str, int] = {}


def fault_point(name: str) -> None:
    """SIGKILL this process here when ``NEOX_DAR_KILL_AT`` names this point (tests only; a no-op otherwise)."""
    want = os.environ.get(KILL_AT_ENV)
    if not want:
        return
    point, _, count = want.partition(":")
    if point != name:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] == int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)


class CheckpointError(ValueError):
    """A checkpoint that exists but cannot be used (incomplete, corrupt, untrusted, mismatched); one line."""


class RunFileError(ValueError):
    """A run file that exists but cannot be read, or cannot be written as a file (a symbolic link or a directory
    where a file belongs), named with its path."""


class RunWriteError(OSError):
    """A write into a run directory that failed (a full disk, a quota, a file-size limit, no permission): one line
    naming the path, the reason and the free space there."""

    def __str__(self) -> str:
        return self.strerror


def write_error(path: str | Path, e: OSError) -> RunWriteError:
    """The one-line :class:`RunWriteError` for a failed write of ``path``."""
    return RunWriteError(e.errno, f"cannot write {path}: {e.strerror or e} ({free_space(Path(path).parent)})")


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def open_run_file(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` for a file of a run directory that never follows a symbolic link (a link planted there would
    make the trainer overwrite its target): RunFileError for a link or a directory, RunWriteError for the rest."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunFileError(f"{path} is a symbolic link; the run directory's files are never followed through "
                               "links: remove it") from None
        if e.errno == errno.EISDIR:
            raise RunFileError(f"{path} is a directory where the run keeps a file: remove it") from None
        raise write_error(path, e) from None


def append_text(fd: int, text: str, path: str | Path) -> None:
    """Append all of ``text`` to the open run file ``fd`` (RunWriteError naming ``path`` when it cannot)."""
    data = text.encode()
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError as e:
        raise write_error(path, e) from None


# ----------------------------------------------------------------------------------------------
# files


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync, then ``os.replace`` it into place.

    The temporary file is created afresh (a link planted under its name is removed, never followed) and
    ``os.replace`` replaces a link at ``path`` itself, not its target. On failure (a full disk, Ctrl-C) the temporary
    file is removed; an OSError is raised as RunWriteError, naming ``path`` and the free space there."""
    path = Path(path)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)  # O_EXCL: never via a link
        try:
            append_text(fd, text, path)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:  # an OSError, or Ctrl-C
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, RunWriteError):
            raise write_error(path, e) from None
        raise


def check_writable(path: str | Path, option: str, folder: bool = False) -> None:
    """RunFileError (one line naming ``option``) unless ``path`` can be written, checked before any work: a file
    (``folder``: a folder) or nothing at ``path``, the nearest existing folder above it a folder this process may
    write (the missing ones are created when it is written), an existing file writable too."""
    p = Path(path)
    if p.exists() and p.is_dir() != folder:
        raise RunFileError(f"{option} {p} is a {'file' if folder else 'directory'}: name a "
                           f"{'folder' if folder else 'file'} to write")
    above = p.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise RunFileError(f"{option} {p}: {above} is a file, not a folder")
    if not os.access(above, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise RunFileError(f"{option} {p} is not writable (no permission on {p if p.exists() else above})")


def free_space(path: str | Path) -> str:
    """``"N GiB free on PATH"`` for the file system holding ``path`` (its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        usage = shutil.disk_usage(p)
    except OSError:
        return f"free space on {p} unknown"
    return f"{usage.free / 2**30:.2f} GiB free on {p}"


def file_checksum(path: str | Path, chunk: int = 1 << 24) -> str:
    """xxh3-64 of a file's bytes as 16 hex digits (several GB/s, so a checkpoint adds seconds at most)."""
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def manifest(directory: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size", "xxh3_64"}}`` of every file under ``directory``, sorted."""
    return {str(f.relative_to(directory)): {"size": f.stat().st_size, CHECKSUM: file_checksum(f)}
            for f in sorted(directory.rglob("*")) if f.is_file()}


def fsync_tree(d: Path) -> None:
    for f in sorted(d.rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(d)


def remove_tree(path: Path) -> None:
    """Delete a directory by renaming it to ``.del-<name>`` first, then removing it; a kill in between leaves a
    ``.del-*`` leftover that :func:`clean_leftovers` removes, never a half-deleted directory under its name."""
    doomed = path.with_name(DEL_PREFIX + path.name)
    if doomed.exists():
        shutil.rmtree(doomed)
    os.rename(path, doomed)
    fault_point("prune-renamed")
    shutil.rmtree(doomed)


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold SIGINT (Ctrl-C) and SIGTERM back until the block ends (they arrive then): the renames that swap a new
    output into place happen all or not at all."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextmanager
def staged_dir(final: str | Path, keep: bool = False) -> Iterator[Path]:
    """A fresh folder ``.tmp-<name>.<pid>`` beside ``final`` (with ``keep``: a copy of ``final`` as it is) to build
    ``final``'s new contents in. When the block completes, the folder replaces ``final``: the old one is renamed
    to ``.del-<name>``, the new one renamed into place (:func:`uninterrupted`), then the old one deleted; when the
    block raises (an error, Ctrl-C), the folder is removed and ``final`` is left as it was."""
    final = Path(final).absolute()  # "." has no name to put beside
    tmp = final.with_name(f"{TMP_PREFIX}{final.name}.{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        if keep and final.is_dir():
            shutil.copytree(final, tmp, symlinks=True)
        else:
            tmp.mkdir(parents=True)
        yield tmp
        fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = final.with_name(f"{DEL_PREFIX}{final.name}.{os.getpid()}")
    with uninterrupted():
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
    fsync_dir(final.parent)
    if old.exists():
        shutil.rmtree(old)


# ----------------------------------------------------------------------------------------------
# checkpoints


def step_dir_name(step: int) -> str:
    """``step_00001000`` for step 1000."""
    return f"{STEP_PREFIX}{step:08d}"


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def step_dirs(root: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step_*`` directory directly under ``root``, newest first."""
    root = Path(root)
    found = []
    for p in root.glob(STEP_PREFIX + "*") if root.is_dir() else ():
        suffix = p.name[len(STEP_PREFIX):]
        if p.is_dir() and suffix.isdigit():
            found.append((int(suffix), p))
    return sorted(found, reverse=True)


def read_state(step_dir: str | Path) -> dict:
    """A checkpoint's ``state.json``; CheckpointError (saying what is wrong, not where) when missing, unreadable, or
    changed since it was written (its checksum; a ``state.json`` written before it had one is taken as it is)."""
    path = Path(step_dir) / STATE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"no {STATE}") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"unreadable {STATE} ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or not isinstance(state.get("files"), dict):
        raise CheckpointError(f"{STATE} holds no manifest ('files')")
    if STATE_CHECKSUM in state and state[STATE_CHECKSUM] != state_checksum(state):
        raise CheckpointError(f"{STATE} is corrupt (its {CHECKSUM} checksum differs from its contents)")
    return state


def verify(step_dir: str | Path, checksums: bool = True) -> str | None:
    """None when ``step_dir`` is a complete checkpoint, else why not: no, unreadable or changed ``state.json``, a
    ``step_N`` name that differs from its step, a missing file, a size or (with ``checksums``) checksum that
    differs from the manifest. A manifest without checksums (written
    before they were recorded) is checked by size only."""
    d = Path(step_dir)
    try:
        state = read_state(d)
    except CheckpointError as e:
        return str(e)
    files = state["files"]
    named = d.name[len(STEP_PREFIX):] if d.name.startswith(STEP_PREFIX) else ""
    if named.isdigit() and state.get("step") != int(named):
        return f"its name says step {int(named)} but its {STATE} says step {state.get('step')}"
    if WEIGHTS not in files:
        return f"its manifest lists no {WEIGHTS}"
    for rel, entry in files.items():
        f = d / rel
        size, digest = (entry, None) if isinstance(entry, int) else (entry.get("size"), entry.get(CHECKSUM))
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != size:
            return f"{rel} has {f.stat().st_size} bytes, the manifest says {size}"
        if checksums and digest is not None and file_checksum(f) != digest:
            return f"{rel} is corrupt (its {CHECKSUM} checksum differs from the manifest)"
    return None


def newest_checkpoint(run_dir: str | Path, checksums: bool = True,
                      warn: Callable[[str], Any] | None = log.warning) -> Path | None:
    """The newest complete checkpoint of a run directory (or of its ``checkpoints`` directory), or None.

    Incomplete or corrupt ones are skipped, each with a warning saying why."""
    p = Path(run_dir)
    root = p / CHECKPOINTS if (p / CHECKPOINTS).is_dir() else p
    for _, d in step_dirs(root):
        reason = verify(d, checksums)
        if reason is None:
            return d
        if warn is not None:
            warn(f"skipping checkpoint {d}: {reason}")
    return None


def is_checkpoint_dir(path: str | Path) -> bool:
    """A directory that is itself one checkpoint (a step directory or a weights folder), not a run directory: one
    with a ``checkpoints`` directory is a run's, whatever weights lie beside it (an older version's import or
    export into the run directory)."""
    p = Path(path)
    if (p / CHECKPOINTS).is_dir():
        return False
    return (p / STATE).is_file() or (p / WEIGHTS).is_file() or p.name.startswith(STEP_PREFIX)


def resolve_checkpoint(path: str | Path, checksums: bool = True,
                       warn: Callable[[str], Any] | None = log.warning) -> Path:
    """The checkpoint ``path`` names, verified against its manifest: ``path`` itself when it is one checkpoint
    directory, else the newest complete one under a run (never weights at its root) or ``checkpoints`` directory.
    CheckpointError (one line) when there is none or the named one fails the check. A weights folder without a
    manifest (``save_weights`` of an older version) is accepted as it is."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint not found: {p}")
    if is_checkpoint_dir(p):
        if not (p / STATE).is_file() and (p / WEIGHTS).is_file() and not p.name.startswith(STEP_PREFIX):
            return p
        reason = verify(p, checksums)
        if reason is not None:
            raise CheckpointError(f"refusing checkpoint {p}: {reason}")
        return p
    found = newest_checkpoint(p, checksums, warn)
    if found is None:
        raise CheckpointError(f"no complete checkpoint under {p}")
    return found


@dataclass
class CheckpointHold:
    """A shared ``flock`` on one checkpoint directory, held while a run reads it: :func:`prune` (of the run that
    writes it) leaves a held checkpoint alone until the next prune."""

    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _hold(step_dir: Path) -> int | None:
    """A shared flock on ``step_dir`` still under its name, or None when it was renamed away (a prune) first."""
    try:
        fd = os.open(step_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:  # a file system without flock: no protection, as before
        pass
    try:
        same = os.stat(step_dir).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        same = False
    if not same:
        os.close(fd)
        return None
    return fd


def hold_checkpoint(path: str | Path, attempts: int = 3, warn: Callable[[str], Any] | None = log.warning
                    ) -> CheckpointHold:
    """:func:`resolve_checkpoint`, held (:class:`CheckpointHold`) so that a concurrent prune cannot delete it while
    it is read; a checkpoint pruned between being chosen and held is chosen again (the next newest). CheckpointError
    (one line) when that keeps happening."""
    for _ in range(attempts):
        found = resolve_checkpoint(path, warn=warn)
        fd = _hold(found)
        if fd is not None:
            return CheckpointHold(found, fd)
    raise CheckpointError(f"the checkpoints of {path} were deleted while this run opened them ({attempts} times; is "
                          "the run writing them still pruning?): start again")


@contextmanager
def held_checkpoint(path: str | Path) -> Iterator[Path]:
    """:func:`hold_checkpoint` for the length of a block, which gets the checkpoint's directory: a command that
    reads a checkpoint of a run still training (its weights, then its tokenizer) reads it whole, never a checkpoint
    pruned half-way."""
    held = hold_checkpoint(path)
    try:
        yield held.path
    finally:
        held.release()


def _prunable(step_dir: Path) -> int | None:
    """An exclusive flock on ``step_dir`` (held while it is renamed away), or None when a reader holds it."""
    fd = os.open(step_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:  # a file system without flock
        pass
    return fd


def checkpoint_step(step_dir: str | Path) -> int | None:
    """The training step of a checkpoint directory (its manifest's ``step``, else its ``step_N`` name)."""
    d = Path(step_dir)
    try:
        step = read_state(d).get("step")
        if step is not None:
            return int(step)
    except CheckpointError:
        pass
    suffix = d.name[len(STEP_PREFIX):] if d.name.startswith(STEP_PREFIX) else ""
    return int(suffix) if suffix.isdigit() else None


def state_checksum(state: dict) -> str:
    """xxh3-64 of a ``state.json``'s contents other than its own ``"checksum"`` (keys sorted)."""
    body = {k: v for k, v in state.items() if k != STATE_CHECKSUM}
    return xxhash.xxh3_64_hexdigest(json.dumps(body, sort_keys=True).encode())


def write_manifest(directory: Path, meta: dict) -> None:
    """Write ``state.json`` = ``meta`` + the manifest of every other file in ``directory`` + the checksum of all that
    (:func:`state_checksum`); call it last."""
    files = {k: v for k, v in manifest(directory).items() if k != STATE}
    state = {**{k: v for k, v in meta.items() if k != STATE_CHECKSUM}, "files": files}
    (directory / STATE).write_text(json.dumps({**state, STATE_CHECKSUM: state_checksum(state)}, indent=1) + "\n")


def publish(tmp: Path, final: Path) -> None:
    """Move a complete checkpoint ``tmp`` (manifest written) to ``final``, replacing a checkpoint of the same
    step (it is renamed aside and deleted only after the new one is in place), then point ``latest`` at it."""
    fsync_tree(tmp)
    fault_point("save-written")
    old = final.with_name(DEL_PREFIX + final.name)
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    fault_point("save-renamed")
    write_text_atomic(final.parent / LATEST, final.name + "\n")
    fault_point("latest-written")
    if old.exists():
        shutil.rmtree(old)


def prune(root: Path, keep_last_n: int) -> list[Path]:
    """Delete every checkpoint older than the newest ``keep_last_n`` complete ones (by size; never the one
    ``latest`` names, nor one a starting run holds: :func:`hold_checkpoint`); returns what was deleted."""
    latest = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
    complete = [p for _, p in step_dirs(root) if verify(p, checksums=False) is None]
    if len(complete) <= keep_last_n:
        return []
    oldest_kept = checkpoint_step(complete[keep_last_n - 1])
    removed = []
    for step, p in step_dirs(root):
        if p.name != latest and step < oldest_kept:
            fd = _prunable(p)
            if fd is None:
                log.info("kept %s for now: a starting run is reading it", p)
                continue
            try:
                fault_point("prune-deleting")
                remove_tree(p)
            finally:
                os.close(fd)
            removed.append(p)
    return removed


def clean_leftovers(root: Path, warn: Callable[[str], Any] = log.warning) -> list[Path]:
    """Remove what a killed save or deletion left under a checkpoints directory: ``.tmp-*`` and ``.del-*``
    entries, and ``step_*`` directories without a manifest (only a deletion by an older version, which removed
    files in place, can leave those). Checkpoints that fail their checksums are kept (and skipped when resuming)
    so they can be inspected. Returns what was removed."""
    removed = []
    if not root.is_dir():
        return removed
    for p in sorted(root.iterdir()):
        leftover = p.name.startswith((TMP_PREFIX, DEL_PREFIX)) or (
            p.is_dir() and p.name.startswith(STEP_PREFIX) and not (p / STATE).is_file())
        if leftover:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            warn(f"removed the leftover of an interrupted checkpoint write or deletion: {p}")
            removed.append(p)
    return removed


# ----------------------------------------------------------------------------------------------
# status, metrics, evaluations, jobs


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
        if e.errno not in _NO_SPACE or not _rewrite_in_place(path, text):
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
    """Every row of metrics.jsonl; a torn last line (a run writing right now, or killed) is left out."""
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


def truncate_metrics(run_dir: str | Path, step: int) -> None:
    """Drop rows logged after ``step`` (by a run that died after its last checkpoint) before resuming."""
    rows = [r for r in read_metrics(run_dir) if r.get("step", 0) <= step]
    if (Path(run_dir) / METRICS).is_file():
        write_text_atomic(Path(run_dir) / METRICS, "".join(json.dumps(r) + "\n" for r in rows))


def read_evals(run_dir: str | Path) -> list[dict]:
    """All evaluation results of the run, sorted by step (results without a step sort last)."""
    d = Path(run_dir) / EVAL_DIR
    if not d.is_dir():
        return []
    results = []
    for p in sorted(d.glob("*.json")):
        r = read_json(p)
        if isinstance(r, dict) and isinstance(r.get("corpora"), dict):
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


# ----------------------------------------------------------------------------------------------
# the trainer's lock


class RunLockedError(CheckpointError):
    """The run directory is held by another trainer (one line naming the holder)."""


@dataclass
class RunLock:
    """An exclusive ``flock`` on ``{save}/run.lock``; the kernel releases it when the holding process exits, however
    it exits, so a killed trainer never leaves a stale lock."""

    path: Path
    fd: int

    def record(self) -> None:
        """Write the holder (host, pid, start time) into the lock file, once the run is known to start: a trainer
        that refuses the directory leaves the file as it found it."""
        holder = {"host": socket.gethostname(), "pid": os.getpid(),
                  "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        data = (json.dumps(holder) + "\n").encode()
        try:  # written over the old holder before the file is cut to length: no new space on a full disk
            os.pwrite(self.fd, data, 0)
            os.ftruncate(self.fd, len(data))
        except OSError as e:
            raise write_error(self.path, e) from None

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _holder_text(path: Path) -> str:
    try:
        h = json.loads(path.read_text())
        return f"pid {h['pid']} on {h['host']} since {h['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def lock_run_dir(run_dir: str | Path) -> RunLock:
    """Hold ``{run}/run.lock`` for this process (:meth:`RunLock.record` then writes the holder into it).

    RunLockedError when another process holds it: two trainers writing one run directory would interleave their
    checkpoints and metrics. RunFileError (one line) when ``run_dir`` is a file or cannot be created, or
    ``run.lock`` is a symbolic link or a directory. (On a network file system the lock is as good as its
    ``flock`` support: NFSv4 and Lustre mounted with ``flock`` honour it across nodes.)"""
    d = Path(run_dir)
    if d.exists() and not d.is_dir():
        raise RunFileError(f"save={d} is a file, not a directory: name a directory for the run")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunFileError(f"cannot create the run directory {d}: {e.strerror or e}") from None
    path = d / LOCK
    fd = open_run_file(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunLockedError(f"{d} is in use by another trainer ({_holder_text(path)}); wait for it to finish or "
                             "stop it (a run directory takes one trainer at a time)") from None
    return RunLock(path, fd)


def flock_held(path: str | Path) -> bool:
    """Whether some process holds an exclusive ``flock`` on ``path`` (False when it does not exist; nothing is
    changed: the probe is a shared lock, released at once)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def lock_holder(run_dir: str | Path) -> str | None:
    """Who holds the run's lock (``"pid N on HOST since T"``), or None when no process does (nothing is changed)."""
    path = Path(run_dir) / LOCK
    return _holder_text(path) if flock_held(path) else None
