"""The papers' tables and figures, recomputed from a sweep's run directories.

    python -m neox_dar.report configs/sweeps/dar-table1.yml      # or runs/dar-table1, or any dir of runs
"""

from ..evaluation.corpora import CORPORA

from .collect import RunRecord, collect
from .tables import Table, build_table, relative_percent, to_latex, to_markdown

__all__ = ["CORPORA", "RunRecord", "Table", "build_table", "collect", "relative_percent", "to_latex", "to_markdown"]
