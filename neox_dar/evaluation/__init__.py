"""Perplexity evaluation: corpora (:mod:`.corpora`), model loading (:mod:`.loading`), rolling windows
(:mod:`.rolling`), scoring (:mod:`.scoring`), metrics (:mod:`.metrics`), the library behind ``python -m
eval.perplexity`` (:mod:`.perplexity`), the command itself (:mod:`.cli`), its ranks under a launcher
(:mod:`.parallel`) and the papers' tables (:mod:`.tables`). See docs/evaluation.md.
"""
