"""train.py runs forked from one process per test worker that imported torch, dynamo, DeepSpeed and train.py's
modules once (:func:`run_forked`; scripts/forked.py), for :func:`trainrun.train`.

A fresh ``python train.py`` spends about 2.5 s of CPU importing those before its first line of work (dynamo alone
~1.1 s: torch's optimizer imports it when it is built); a tiny test run trains for well under a second, and the
suite starts about a hundred of them. A child forked from the server is ``python train.py ARGS`` run in the same
folder with the same environment, minus the imports: ``sys.argv``, the working folder, the standard streams (files
the caller reads) and default signal handlers are its own, and train.py runs as ``__main__``. The server serves one
run at a time, answers with the child's pid (so a timeout kills it) and then its exit status; it leaves when its
worker closes its stdin. It serves a run whose environment is its own, or differs only in variables the trainer
reads while it runs (:data:`RUNTIME_ENV`): an imported module may have read others at import (``TRITON_INTERPRET``
decides what ``@triton.jit`` builds), so any other run is a process of its own. train.py's start-up line counts
from the server's launch (its imports happened there).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what a run's environment may hold that the server's does not: variables read only while training runs (pytest
# names the running test in PYTEST_CURRENT_TEST, another value in every test)
RUNTIME_ENV = frozenset({"NEOX_DAR_KILL_AT", "PYTEST_CURRENT_TEST"})
PRELOAD = ("torch", "torch._dynamo", "deepspeed", "neox_dar.training.loop", "neox_dar.training.checks",
           "neox_dar.training.distributed")

SERVER = r"""
import json, os, signal, sys, traceback

sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "scripts")]
from forked import preload, run_script

preload(sys.argv[1].split(","), ["train.py"])
replies = os.fdopen(int(sys.argv[2]), "w", buffering=1)  # the pipe the caller reads
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: `python train.py ARGS` in request["cwd"]
        try:
            os.chdir(request["cwd"])
            for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            for key, value in request["env"].items():  # variables the trainer reads while it runs
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            run_script(request["argv"])  # leaves the process
        except BaseException:  # the set-up failed: the child leaves too, never returning to this loop
            traceback.print_exc()
            os._exit(1)
    replies.write(f"{pid}\n")
    replies.write(f"{os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}\n")
"""


class _Server:
    def __init__(self, env: dict):
        self.env = env
        read, write = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, ",".join(PRELOAD), str(write)], cwd=ROOT,
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, text=True, pass_fds=(write,))
        os.close(write)
        self.replies, self.pending = read, b""
        atexit.register(self.close)

    def reply(self, timeout: float | None) -> str | None:
        """The server's next line; None after ``timeout`` seconds; RuntimeError when it is gone. The pipe is read
        unbuffered into ``pending``: both of a run's lines may arrive in one read, and a buffered file would hold the
        second where ``select`` cannot see it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.replies], [], [], left)[0]:
                return None
            chunk = os.read(self.replies, 4096)
            if not chunk:
                raise RuntimeError(f"the fork server exited ({self.proc.poll()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def close(self) -> None:
        """Stop the server (it leaves when its stdin closes); idempotent (also registered to run at exit)."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        if self.replies is not None:
            os.close(self.replies)
            self.replies = None


_server: _Server | None = None


def _changed(env: dict, base: dict) -> dict:
    """The variables whose value in ``env`` differs from ``base``'s (None: unset in ``env``)."""
    return {k: env.get(k) for k in {*env, *base} if env.get(k) != base.get(k)}


def run_forked(argv: list[str], env: dict, timeout: float, server_env: dict) -> subprocess.CompletedProcess | None:
    """``python train.py ARGS`` (``argv``: ``["train.py", *ARGS]``) forked from this worker's server, as
    ``subprocess.run(..., cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)`` would run it; None when
    ``env`` differs from ``server_env`` (the environment of a usual run, which the server is started with) in more
    than :data:`RUNTIME_ENV` (run it as a process of its own). A server whose environment is no longer
    ``server_env`` (a test changed this process's) is replaced."""
    global _server
    if set(_changed(env, server_env)) - RUNTIME_ENV:
        return None
    if _server is not None and set(_changed(_server.env, server_env)) - RUNTIME_ENV:
        _server.close()
        _server = None
    if _server is None or _server.proc.poll() is not None:
        _server = _Server(server_env)
    changed = _changed(env, _server.env)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        _server.proc.stdin.write(json.dumps({"argv": argv, "cwd": str(ROOT), "stdout": str(out),
                                             "stderr": str(err), "env": changed}) + "\n")
        _server.proc.stdin.flush()
        pid = int(_server.reply(60))
        code = _server.reply(timeout)
        if code is None:
            os.kill(pid, signal.SIGKILL)
            _server.reply(60)
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess([sys.executable, *argv], int(code), out.read_text(), err.read_text())
