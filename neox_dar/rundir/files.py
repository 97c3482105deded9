"""The run directory's file names (the layout is in :mod:`neox_dar.rundir`), its errors, fault points for tests,
and safe writes: appends that say so when the disk is full, atomic replacement of a file or a whole folder, fsyncs,
checksums of files and folders."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
import xxhash



CONFIG = "config.yml"
MODEL_CONFIG = "model.yml"
STATUS = "status.json"
METRICS = "metrics.jsonl"
EVAL_DIR = "eval"
FINAL_EVAL = "perplexity.json"
RUN_META = "run.json"
JOBS = "slurm_jobs.txt"
WANDB_ID = "wandb_run_id"
WANDB_STEP = "wandb_logged_step"  # the highest step any attempt of the run sent to W&B
LOCK = "run.lock"
CHECKPOINTS = "checkpoints"
LATEST = "latest"
WEIGHTS = "model.safetensors"
STATE = "state.json"
STEP_PREFIX = "step_"
TMP_PREFIX = ".tmp-"
DEL_PREFIX = ".del-"
FAILED_PREFIX = "failed-"  # a checkpoint that failed its check when its run resumed, kept aside for inspection
CHECKSUM = "xxh3_64"
STATE_CHECKSUM = "checksum"  # state.json's checksum of its own contents

# Fault injection for the crash tests: "POINT" or "POINT:N" SIGKILLs this process the N-th time (default 1st)
# it passes POINT (save-written, save-renamed, latest-written, prune-renamed, prune-deleting); "...=SIGNAME" sends
# that signal instead (e.g. "save-written=SIGTERM": a stop request that comes while a checkpoint is written).
KILL_AT_ENV = "NEOX_DAR_KILL_AT"
_passes: dict[str, int] = {}


def fault_point(name: str) -> None:
    """SIGKILL this process here (or send it the signal named) when ``NEOX_DAR_KILL_AT`` names this point (tests
    only; a no-op otherwise)."""
    want = os.environ.get(KILL_AT_ENV)
    if not want:
        return
    want, _, sig = want.partition("=")
    point, _, count = want.partition(":")
    if point != name:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] == int(count or 1):
        os.kill(os.getpid(), getattr(signal, sig) if sig else signal.SIGKILL)


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


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


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


def save_safetensors(tensors: dict, path: str | Path, metadata: dict | None = None) -> None:
    """``safetensors.torch.save_file`` with the file's mode set from the umask, as any other file this process
    writes: safetensors 0.8 writes through a private temporary file (mode 0600), so on a shared cluster folder an
    export or a checkpoint's weights were unreadable to the group beside readable siblings."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


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


def write_output(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (its folder created first; :func:`write_text_atomic`): a
    failed write leaves an earlier file there as it was."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(path, e) from None
    write_text_atomic(path, text)


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


def check_own_folder(path: Path, option: str, marker: str, what: str) -> None:
    """RunFileError (one line) unless a command may replace the folder ``path`` whole: missing, empty, or one it wrote
    before (it holds ``marker``; ``what``: such a folder, for the message), and writable (:func:`check_writable`).
    Any other folder is never replaced: it would lose its files."""
    check_writable(path, option, folder=True)
    if path.is_dir() and any(path.iterdir()) and not (path / marker).is_file():
        raise RunFileError(f"{path} is not empty and holds no {marker} (it is not {what}): name a new or empty "
                           "folder (nothing was written)")


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
    block raises (an error, Ctrl-C), the folder is removed and ``final`` is left as it was.

    The writer holds an exclusive ``flock`` on its staging folder (which becomes ``final``) to the end, so what a
    killed writer left (SIGKILL, a SIGTERM that ended the process) is known to be dead and is removed first: its
    staging folders, and its ``.del-`` folder, renamed back when ``final`` itself is missing (killed between the
    two renames). A ``final`` that is a symbolic link is written through: the folder it points to is replaced, the
    link kept."""
    final = Path(final).absolute()  # "." has no name to put beside
    if final.is_symlink():
        final = final.resolve()
    _remove_dead_writers(final)
    tmp = final.with_name(f"{TMP_PREFIX}{final.name}.{os.getpid()}")
    tmp.mkdir(parents=True)
    lock = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if keep and final.is_dir():
                shutil.copytree(final, tmp, symlinks=True, dirs_exist_ok=True)
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
    finally:
        os.close(lock)


def _remove_dead_writers(final: Path) -> None:
    """Remove the ``.tmp-<name>.<pid>`` folders beside ``final`` that no live :func:`staged_dir` holds locked, and
    its ``.del-<name>.<pid>`` folders unless a live writer (its lock now on ``final``) is deleting them; a ``.del-``
    folder is renamed back when ``final`` is missing."""
    from .lock import flock_held  # (lock.py imports this module)

    if not final.parent.is_dir():
        return
    for p in sorted(final.parent.iterdir(), key=lambda p: not p.name.startswith(DEL_PREFIX)):
        prefix, dot, pid = p.name.rpartition(".")
        if not (dot and pid.isdigit() and p.is_dir() and prefix in (f"{TMP_PREFIX}{final.name}",
                                                                     f"{DEL_PREFIX}{final.name}")):
            continue
        if prefix.startswith(TMP_PREFIX):
            if not flock_held(p):
                shutil.rmtree(p, ignore_errors=True)
        elif not final.exists():
            os.rename(p, final)
        elif not flock_held(final):
            shutil.rmtree(p, ignore_errors=True)


