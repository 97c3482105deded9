"""SIGTERM / SIGUSR1 (SLURM preemption, ``scancel --signal``): checkpoint at the next step boundary, then exit 3."""

from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_INTERRUPTED = 3


class StopRequest:
    """Records the first stop signal; the loop polls :attr:`received` (and all-reduces it) every step."""

    def __init__(self):
        self.received: str | None = None
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name

    def restore(self) -> None:
        """Put back the handlers that were there before."""
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}
