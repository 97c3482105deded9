"""Progress bars that stay readable in batch logs.

On a terminal, :func:`progress_bar` is tqdm's bar, refreshed in place several times a second. When the stream is not
a terminal (a SLURM log, CI, ``2> file``), carriage-return refreshes would pile up into one ever-growing line, so it is
a :class:`LogProgress` instead: one whole line (``\\n``-terminated, no ``\\r``) every :data:`LOG_INTERVAL` seconds and
a last one when it closes, each in tqdm's format, e.g. ``scoring:  45%|####5     | 450/1.00k [00:12<00:15,
36.6tok/s, docs=3/10]``.
"""

from __future__ import annotations

import inspect
import sys
from time import monotonic
from typing import IO, Any, Iterable, Iterator

from tqdm import tqdm

LOG_INTERVAL = 30.0  # seconds between two progress lines in a log
TQDM_KEYS = frozenset(inspect.signature(tqdm.__init__).parameters) - {"self", "kwargs"}


class LogProgress:
    """tqdm's interface as :func:`progress_bar`'s users call it (``update``, ``set_postfix``, ``set_postfix_str``,
    ``close``, ``n``, ``total``, iteration, ``with``), written as whole lines: one when ``interval`` seconds have
    passed since the last line (checked at each update), and one when it closes (unless ``leave=False`` and no line
    was written yet: a short transient bar leaves nothing; nor does one closed within ``delay`` seconds, as tqdm's
    ``delay``). ``disable=True`` writes nothing."""

    def __init__(self, iterable: Iterable | None = None, desc: str | None = None, total: float | None = None,
                 leave: bool | None = True, file: IO[str] | None = None, unit: str = "it", unit_scale: bool = False,
                 disable: bool = False, initial: float = 0, postfix: dict | str | None = None,
                 interval: float = LOG_INTERVAL, delay: float = 0.0, **_tqdm_only: Any):
        unknown = set(_tqdm_only) - TQDM_KEYS
        if unknown:
            raise TypeError(f"progress_bar: unknown argument(s) {', '.join(sorted(unknown))}")
        self.iterable, self.desc, self.unit, self.unit_scale = iterable, desc or "", unit, unit_scale
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.n, self.leave, self.disable = total, initial, leave, disable
        self.file = file if file is not None else sys.stderr
        self.interval, self.postfix = interval, ""
        if isinstance(postfix, dict):
            self.set_postfix(postfix)
        elif postfix is not None:
            self.set_postfix_str(postfix)
        self.start = self.last_line = monotonic()
        self.lines, self.delay = 0, delay

    def line(self) -> str:
        """The bar's state as one line (tqdm's meter with an ASCII bar)."""
        return tqdm.format_meter(self.n, self.total, monotonic() - self.start, prefix=self.desc, unit=self.unit,
                                 unit_scale=self.unit_scale, postfix=self.postfix or None, ascii=True)

    def _write(self) -> None:
        self.file.write(self.line() + "\n")
        self.file.flush()
        self.lines += 1
        self.last_line = monotonic()

    def update(self, n: float = 1) -> None:
        self.n += n
        if not self.disable and monotonic() - self.last_line >= self.interval:
            self._write()

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in {**(ordered_dict or {}), **kwargs}.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = str(s)

    def close(self) -> None:
        shown = self.lines or monotonic() - self.start >= self.delay  # tqdm's delay: nothing for short work
        if not self.disable and shown and (self.leave or self.lines):
            self._write()
        self.disable = True  # a second close writes nothing

    def __iter__(self) -> Iterator:
        for item in self.iterable:
            yield item
            self.update()
        self.close()

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(**kwargs) -> tqdm | LogProgress:
    """A progress bar on ``file`` (default stderr), with tqdm's keyword arguments: tqdm's own bar on a terminal
    (refreshed every ``mininterval`` s, default 0.1), else a :class:`LogProgress` (a line every ``mininterval`` s,
    default :data:`LOG_INTERVAL`)."""
    stream = kwargs.get("file") or sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        kwargs.setdefault("mininterval", 0.1)
        kwargs.setdefault("dynamic_ncols", True)
        return tqdm(**kwargs)
    return LogProgress(interval=kwargs.pop("mininterval", LOG_INTERVAL), **kwargs)
