"""lm-evaluation-harness's command line with the ``neox_dar`` model registered.

    python -m eval.lm_eval_cli --model neox_dar --model_args checkpoint=runs/aha-70m --tasks hellaswag
    neox-dar-lm-eval run --model neox_dar --model_args checkpoint=runs/aha-70m --tasks mmlu --num_fewshot 5

lm-eval 0.4.x finds models only in its own registry (``lm_eval --include_path`` adds tasks, not models, and
there is no plugin entry point), so the plain ``lm_eval`` command cannot see ``neox_dar``. This wrapper
imports :mod:`eval.lm_eval_model` (which registers it) and then runs lm-eval's own ``cli_evaluate`` with the
same arguments; everything else (tasks, few-shot, ``--output_path``, ``--log_samples``) is lm-eval's.
From Python, ``import eval.lm_eval_model`` before ``lm_eval.simple_evaluate(model="neox_dar", ...)``.
"""

from __future__ import annotations


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    from . import lm_eval_model  # noqa: F401  (registers the "neox_dar" model)

    cli_evaluate()


if __name__ == "__main__":
    main()
