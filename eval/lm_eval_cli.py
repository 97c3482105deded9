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


def main() -> None:
    import lm_eval.tasks
    from lm_eval.__main__ import cli_evaluate

    from . import lm_eval_model  # noqa: F401  (registers the "neox_dar" model)

    if local_tasks_only(sys.argv[1:]):
        builtin = lm_eval.tasks.TaskManager

        class LocalTaskManager(builtin):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **{**kwargs, "include_defaults": False})

        lm_eval.tasks.TaskManager = LocalTaskManager
    cli_evaluate()


if __name__ == "__main__":
    main()
