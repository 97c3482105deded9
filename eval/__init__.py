"""Evaluation of neox-dar models: rolling-window perplexity on FineWeb-Edu, C4 and WikiText-103, the papers'
``Rel. (%)`` tables, document-length figures, and an lm-evaluation-harness model for downstream tasks.

    python -m eval.perplexity CHECKPOINT --out results.json
    python -m eval.table RUN.json ... --baseline VANILLA.json
    python -m eval.doc_lengths --out doc_lengths.png
    python -m eval.lm_eval_cli --model neox_dar --model_args checkpoint=CHECKPOINT --tasks hellaswag

See docs/evaluation.md.
"""
