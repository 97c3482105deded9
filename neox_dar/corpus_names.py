"""The evaluation corpora by name: a leaf the config validates ``eval_perplexity.corpora`` against without
importing the evaluation (:mod:`neox_dar.evaluation.corpora` loads them)."""

CORPORA = ("fineweb_edu", "c4", "wikitext103")  # the papers' tables, Rel. (%), sweeps and in-training evaluation
EXTRA_CORPORA = ("enwik8",)  # scored on request (eval.perplexity --corpora), e.g. for byte-level models
ALL_CORPORA = CORPORA + EXTRA_CORPORA
