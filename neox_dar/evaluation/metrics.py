"""Perplexity metrics of a corpus from summed negative log-likelihood (token, word and byte perplexity, bits per
byte: the DAR paper's Table 1 quantities; words and bytes counted as lm-evaluation-harness counts them).

    token_perplexity = exp(NLL / tokens)      word_perplexity = exp(NLL / words)
    byte_perplexity  = exp(NLL / bytes)       bits_per_byte   = NLL / (bytes * ln 2)

Words and bytes are counted as lm-evaluation-harness counts them for ``loglikelihood_rolling`` tasks:
``len(re.split(r"\\s+", text))`` and ``len(text.encode("utf-8"))``.
"""

from __future__ import annotations

import math
import re

_WHITESPACE = re.compile(r"\s+")


def count_words(text: str) -> int:
    """lm-eval's word count: pieces of ``text`` split on whitespace runs (leading/trailing runs count too)."""
    return len(_WHITESPACE.split(text))


def count_bytes(text: str) -> int:
    """lm-eval's byte count: UTF-8 length."""
    return len(text.encode("utf-8"))


def corpus_metrics(nll: float, tokens: int, words: int, n_bytes: int, documents: int) -> dict:
    """The results-JSON entry of one corpus from its totals (NLL in nats)."""
    if min(tokens, words, n_bytes) <= 0:
        raise ValueError(f"cannot form perplexities from tokens={tokens}, words={words}, bytes={n_bytes}")
    return {
        "nll": nll,
        "tokens": tokens,
        "words": words,
        "bytes": n_bytes,
        "token_perplexity": math.exp(nll / tokens),
        "word_perplexity": math.exp(nll / words),
        "byte_perplexity": math.exp(nll / n_bytes),
        "bits_per_byte": nll / (n_bytes * math.log(2)),
        "documents": documents,
    }
