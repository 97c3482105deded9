"""Rolling-window perplexity of a checkpoint on FineWeb-Edu, C4 and WikiText-103 (and enwik8's test split).

    python -m eval.perplexity CHECKPOINT [options]                            # one process
    torchrun --nproc_per_node 8 -m eval.perplexity CHECKPOINT [options]      # every GPU of the node, same results

The command is :mod:`neox_dar.evaluation.cli` (``--help`` lists the options); see docs/evaluation.md.
"""

from __future__ import annotations

import sys

from neox_dar.evaluation.cli import build_parser, log_to_wandb, main, write_output

__all__ = ["build_parser", "log_to_wandb", "main", "write_output"]

if __name__ == "__main__":
    sys.exit(main())
