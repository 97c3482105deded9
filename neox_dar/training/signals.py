"""SIGTERM / SIGUSR1 (SLURM preemption, ``scancel --signal``) and a first Ctrl-C (SIGINT) in the training loop:
checkpoint at the next step boundary, then exit 3. A second Ctrl-C aborts at once."""

from __future__ import annotations

import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_INTERRUPTED = 3

_early: dict = {}  # catch_stops_early's record: "received" (the first signal's name), "previous" (the handlers)


def catch_stops_early() -> None:
    """Record SIGTERM/SIGUSR1 from the first line of ``train.py`` on, until :class:`StopRequest` takes them over: a
    stop that arrives while the trainer starts (imports, checks, process group) then stops the run at its first step
    with a checkpoint, instead of being ignored (a trainer started by torchrun under slurm/launch_node.sh inherits
    USR1 ignored) or killing the start (TERM). :func:`release_early_stops` puts the handlers back."""
    if threading.current_thread() is threading.main_thread() and "previous" not in _early:
        def record(signum, frame) -> None:
            _early.setdefault("received", signal.Signals(signum).name)

        _early["previous"] = {s: signal.signal(s, record) for s in STOP_SIGNALS}


def release_early_stops() -> None:
    """Put back the handlers :func:`catch_stops_early` replaced, if no :class:`StopRequest` took them over."""
    for s, h in _early.pop("previous", {}).items():
        signal.signal(s, h)
    _early.pop("received", None)


class StopRequest:
    """Records the first stop signal (one :func:`catch_stops_early` recorded included); the loop polls
    :attr:`received` (and all-reduces it) every step. SIGINT (Ctrl-C) stops the same way the first time, with a
    line saying so; a second one raises KeyboardInterrupt (abort, the steps since the last checkpoint lost)."""

    def __init__(self):
        self.received: str | None = _early.pop("received", None)
        self._previous = _early.pop("previous", {})  # the handlers before catch_stops_early's, for restore
        if threading.current_thread() is threading.main_thread():
            for s in (*STOP_SIGNALS, signal.SIGINT):
                self._previous.setdefault(s, signal.signal(s, self._handle))

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT:
            if self.received == "SIGINT":
                raise KeyboardInterrupt
            print("\nCtrl-C: stopping at the end of this step with a checkpoint (Ctrl-C again: abort now, losing the "
                  "steps since the last checkpoint)", file=sys.stderr, flush=True)
        if self.received is None:
            self.received = signal.Signals(signum).name

    def restore(self) -> None:
        """Put back the handlers that were there before."""
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}
