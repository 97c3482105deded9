"""What the SLURM job script (slurm/sweep.sbatch) asks about its run directory, as exit codes.

    python -m neox_dar.sweep.job needs-training RUN_DIR            # exit 0: train it, 1: trained to train_iters
    python -m neox_dar.sweep.job needs-eval RUN_DIR [EXTRA ...]    # exit 0: evaluate it, 1: evaluated (newest
                                                                   # checkpoint, the extra corpora held)
"""

from __future__ import annotations

import sys
from pathlib import Path

from .rundir import needs_eval, needs_training


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "needs-training":
        return 0 if needs_training(Path(args[1])) else 1
    if len(args) >= 2 and args[0] == "needs-eval":
        return 0 if needs_eval(Path(args[1]), args[2:]) else 1
    print("usage: python -m neox_dar.sweep.job needs-training RUN_DIR | needs-eval RUN_DIR [EXTRA ...]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
