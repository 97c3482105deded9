"""Progress bars that stay readable in batch logs.

On a terminal the bar refreshes several times a second; when stderr is a file (SLURM logs, CI) it refreshes
every 30 s, so a long job's log gets a line's worth of updates, not thousands.
"""

from __future__ import annotations

import sys

from tqdm import tqdm


def progress_bar(**kwargs) -> tqdm:
    """``tqdm(**kwargs)`` with ``mininterval`` chosen for a terminal or a log file (unless given)."""
    kwargs.setdefault("mininterval", 0.1 if sys.stderr.isatty() else 30.0)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(**kwargs)
