"""The trainer's lock on a run directory (``run.lock``, an flock with the holder's host, pid and start time), and
who holds it."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from .files import CheckpointError, LOCK, RunFileError, open_run_file, write_error


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
