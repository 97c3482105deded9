"""What the SLURM job script (slurm/sweep.sbatch) asks about its run directory, as exit codes.

    python -m neox_dar.sweep.job needs-training RUN_DIR            # exit 0: train it, 10: trained to train_iters
    python -m neox_dar.sweep.job needs-eval RUN_DIR [EXTRA ...]    # exit 0: evaluate it, 10: evaluated (newest
                                                                   # checkpoint, the extra corpora held)

Any other exit (2: a run file it cannot read, named in one line; 1: Python's own failure, an import error) is no
answer, and the job fails rather than skipping the step.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..rundir import RunFileError
from .rundir import needs_eval, needs_training

NOT_NEEDED = 10
"""The exit code of "done already": apart from Python's own 1, so a failure is never read as nothing to do."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) == 2 and args[0] == "needs-training":
            return 0 if needs_training(Path(args[1])) else NOT_NEEDED
        if len(args) >= 2 and args[0] == "needs-eval":
            return 0 if needs_eval(Path(args[1]), args[2:]) else NOT_NEEDED
    except (RunFileError, OSError) as e:
        print(f"neox_dar.sweep.job: {e}", file=sys.stderr)
        return 2
    print("usage: python -m neox_dar.sweep.job needs-training RUN_DIR | needs-eval RUN_DIR [EXTRA ...]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
