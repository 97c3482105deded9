"""Checkpoints in ``{save}/checkpoints/``: finding the newest complete one, verifying its manifest, holding it
while it is read, publishing a new one atomically, pruning old ones and cleaning up what a kill left behind."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator
import xxhash

from .files import (CHECKPOINTS, CHECKSUM, CONFIG, MODEL_CONFIG, CheckpointError, DEL_PREFIX, FAILED_PREFIX, LATEST,
                    STATE, STATE_CHECKSUM, STEP_PREFIX, TMP_PREFIX, WEIGHTS, fault_point, file_checksum, fsync_dir,
                    fsync_tree, manifest, remove_tree, write_text_atomic)

log = logging.getLogger("neox_dar.rundir")


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


def is_hf_folder(path: str | Path) -> bool:
    """A Hugging Face model folder: ``config.json`` and no neox-dar ``model.yml`` or ``config.yml`` beside it."""
    p = Path(path)
    return (p / "config.json").is_file() and not (p / MODEL_CONFIG).is_file() and not (p / CONFIG).is_file()


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


def set_aside_newer(root: Path, resumed: Path, warn: Callable[[str], Any] = log.warning) -> list[Path]:
    """Rename every checkpoint under ``root`` newer than ``resumed``, the newest complete one, which a run continues
    (so each of them failed its check), to ``failed-step_N`` (``.2``, ``.3``, ... when taken), and point ``latest``
    at ``resumed``: out of the way of later resumes, pruning (which counts complete checkpoints by their sizes only,
    and would keep a corrupt one in place of a good one) and a save of the same step; kept for inspection, each with
    a warning. Returns the new paths."""
    dirs = step_dirs(root)
    step = next((s for s, p in dirs if p == resumed), None)
    moved = []
    for s, p in dirs:
        if step is None or s <= step:
            continue
        aside, n = root / (FAILED_PREFIX + p.name), 1
        while aside.exists():
            n += 1
            aside = root / f"{FAILED_PREFIX}{p.name}.{n}"
        os.rename(p, aside)
        warn(f"set {p} aside as {aside.name} (it failed its check): kept for inspection, never resumed or pruned; "
             "delete it when done")
        moved.append(aside)
    if moved:
        fsync_dir(root)
        write_text_atomic(root / LATEST, resumed.name + "\n")
    return moved


def prune(root: Path, keep_last_n: int | None) -> list[Path]:
    """Delete every checkpoint older than the newest ``keep_last_n`` complete ones (by size; never the one
    ``latest`` names, nor one a starting run holds: :func:`hold_checkpoint`); returns what was deleted. None keeps
    every checkpoint."""
    if keep_last_n is None:
        return []
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
    files in place, can leave those). Checkpoints that fail their checksums are kept (a resume sets them aside:
    :func:`set_aside_newer`) so they can be inspected. Returns what was removed."""
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


