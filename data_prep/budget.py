"""Token budgets: dealing the document stream out to the output files, in order.

Outputs are filled one after the other (``data_prep.tokenize``: the held-out validation file
first when ``--valid-tokens`` is given, then the training file with ``--max-tokens``). Each output
takes whole documents while they fit in its budget; the first document that does not fit is cut so
the output holds exactly its budget (the cut document keeps its first tokens; its tail, with the
EOD, is dropped and goes nowhere), and the next output starts at the following document. So no
document is in two outputs. An output without a budget (None) takes every remaining document.
"""

from __future__ import annotations

import numpy as np

# A segment of one shard for one output: (output index, first document, sizes [n] of the documents taken,
# the last possibly cut short).
Segment = tuple[int, int, np.ndarray]


class Budget:
    def __init__(self, budgets: list[int | None]):
        self.budgets = budgets
        self.filled = [0] * len(budgets)  # tokens dealt to each output so far
        self.truncated = [False] * len(budgets)  # whether its last document was cut
        self.out = 0  # the output being filled

    @property
    def full(self) -> bool:
        """Every output has its budget (never, when the last has none)."""
        return self.out == len(self.budgets)

    def deal(self, sizes: np.ndarray) -> list[Segment]:
        """Deal the next shard's documents (tokens per document, [D]); returns its segments, in order."""
        segments: list[Segment] = []
        start = 0
        while start < len(sizes) and not self.full:
            rest = np.asarray(sizes[start:], dtype=np.int64)
            budget = self.budgets[self.out]
            room = None if budget is None else budget - self.filled[self.out]
            ends = np.cumsum(rest)
            whole = len(rest) if room is None else int(np.searchsorted(ends, room, side="right"))
            taken = rest[:whole]
            cut = 0 if whole == len(rest) else room - (int(ends[whole - 1]) if whole else 0)
            if cut > 0:
                taken = np.append(taken, cut)
                self.truncated[self.out] = True
            if len(taken):
                segments.append((self.out, start, taken))
            self.filled[self.out] += int(taken.sum())
            start += len(taken)
            if room is not None and self.filled[self.out] == budget:
                self.out += 1
        return segments
