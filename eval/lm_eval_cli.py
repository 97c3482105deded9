"""lm-evaluation-harness's command line with the ``neox_dar`` model registered.

    python -m eval.lm_eval_cli --model neox_dar --model_args checkpoint=runs/aha-70m --tasks hellaswag
    neox-dar-lm-eval run --model neox_dar --model_args checkpoint=runs/aha-70m --tasks mmlu --num_fewshot 5

lm-eval 0.4.x finds models only in its own registry (``lm_eval --include_path`` adds tasks, not models, and
there is no plugin entry point), so the plain ``lm_eval`` command cannot see ``neox_dar``. This wrapper
imports :mod:`eval.lm_eval_model` (which registers it) and then runs lm-eval's own ``cli_evaluate`` with the
same arguments; everything else (tasks, few-shot, ``--output_path``, ``--log_samples``) is lm-eval's.
From Python, ``import eval.lm_eval_model`` before ``lm_eval.simple_evaluate(model="neox_dar", ...)``.

When every ``--tasks`` name is found in ``--include_path`` (and every task a group of them lists), lm-eval's task
manager indexes that folder alone, not lm-eval's ~14,000 built-in task YAML files as well (~10 s per run; the
rule of :func:`eval.local_tasks.task_manager`); a ``--config`` file, a task path or any other task keeps lm-eval's
own index.
"""

from __future__ import annotations

import argparse
import sys

from neox_dar.notices import one_line_notices


def local_tasks_only(argv: list[str]) -> bool:
    """Whether the lm-eval arguments ``argv`` name only tasks found in their ``--include_path``."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--tasks", "-t", nargs="+", default=None)
    p.add_argument("--include_path", default=None)
    p.add_argument("--config", "-C", default=None)
    try:
        args, _ = p.parse_known_args(argv)
    except SystemExit:  # lm-eval's own parser says what is wrong
        return False
    if not args.tasks or args.config:
        return False
    from .local_tasks import local_task_manager

    names = [t.strip() for item in args.tasks for t in item.split(",") if t.strip()]
    return bool(names) and local_task_manager(names, args.include_path) is not None


def count_problem(argv: list[str]) -> str | None:
    """What is wrong with ``--num_fewshot`` or ``--limit`` in ``argv`` (lm-eval runs a negative shot count as 0 and
    records it, and says of ``--limit 0`` only that a task found no documents), or None."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--num_fewshot", "-f", type=int, default=None)
    p.add_argument("--limit", "-L", type=float, default=None)
    try:
        args, _ = p.parse_known_args(argv)
    except SystemExit:  # lm-eval's own parser says what is wrong
        return None
    if args.num_fewshot is not None and args.num_fewshot < 0:
        return f"--num_fewshot must be >= 0, got {args.num_fewshot}"
    if args.limit is not None and args.limit <= 0:
        return f"--limit must be > 0 (a count of documents, or a fraction below 1), got {args.limit:g}"
    return None


def fail(problem: str) -> None:
    """One line on stderr, exit status 2 (as the project's other commands)."""
    print(f"eval.lm_eval_cli: error: {problem}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    one_line_notices()  # this package's warnings as `warning: ...`, one line
    import lm_eval.tasks
    from lm_eval.__main__ import cli_evaluate

    from neox_dar.config import ConfigError
    from neox_dar.rundir import CheckpointError
    from neox_dar.tokenizer import TokenizerError

    from . import lm_eval_model  # noqa: F401  (registers the "neox_dar" model)

    if problem := count_problem(sys.argv[1:]):
        fail(problem)
    if local_tasks_only(sys.argv[1:]):
        builtin = lm_eval.tasks.TaskManager

        class LocalTaskManager(builtin):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **{**kwargs, "include_defaults": False})

        lm_eval.tasks.TaskManager = LocalTaskManager
    try:
        cli_evaluate()
    except (ValueError, FileNotFoundError, CheckpointError, ConfigError, TokenizerError) as e:
        # a user's mistake (an unknown task or model_args key, a missing checkpoint, a bad dtype): one line
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except TypeError as e:  # lm-eval's: a key both in --model_args and a flag of its own (device=, batch_size=)
        if "got multiple values for keyword argument" not in str(e):
            raise
        key = str(e).rsplit(" ", 1)[-1].strip("'")
        fail(f"{key} is given twice: as --{key} (or its default) and in --model_args; give it in one place")


if __name__ == "__main__":
    main()
