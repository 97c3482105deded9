"""Perplexity metrics of a corpus from summed negative log-likelihood (token, word and byte perplexity, bits per
byte: the DAR paper's Table 1 quantities; words and bytes counted as lm-evaluation-harness counts them; and bits per
character, the MSWA paper's enwik8 metric).

    token_perplexity = exp(NLL / tokens)      word_perplexity = exp(NLL / words)
    byte_perplexity  = exp(NLL / bytes)       bits_per_byte   = NLL / (bytes * ln 2)
    bits_per_char    = NLL / (chars * ln 2)

Words and bytes are counted as lm-evaluation-harness counts them for ``loglikelihood_rolling`` tasks:
``len(re.split(r"\\s+", text))`` and ``len(text.encode("utf-8"))``; characters are Unicode code points,
``len(text)``. enwik8's "characters" in the literature (and the MSWA paper's Table 2 and 3) are its bytes: there
``bits_per_byte`` is the published bpc, and ``bits_per_char`` equals it for ASCII text only.
"""

from __future__ import annotations

import math
import re

_WHITESPACE = re.compile(r"\s+")


def count_words(text: str) -> int:
    """lm-eval's word count: pieces of ``text`` split on whitespace runs (leading/trailing runs count too)."""
    return len(_WHITESPACE.split(text))


def count_bytes(text: str) -> int:
    """lm-eval's byte count: UTF-8 length (a raw byte corpus's surrogate escapes count as the bytes they stand for)."""
    return len(text.encode("utf-8", "surrogateescape"))


def count_chars(text: str) -> int:
    """Characters: Unicode code points (a surrogate escape of a raw byte corpus is one)."""
    return len(text)


def corpus_metrics(nll: float, tokens: int, words: int, n_bytes: int, documents: int,
                   chars: int | None = None) -> dict:
    """The results-JSON entry of one corpus from its totals (NLL in nats); ``chars`` adds ``chars`` and
    ``bits_per_char``."""
    if min(tokens, words, n_bytes, 1 if chars is None else chars) <= 0:
        raise ValueError(f"cannot form perplexities from tokens={tokens}, words={words}, bytes={n_bytes}, "
                         f"chars={chars}")
    per_char = {} if chars is None else {"chars": chars, "bits_per_char": nll / (chars * math.log(2))}
    return {
        "nll": nll,
        "tokens": tokens,
        "words": words,
        "bytes": n_bytes,
        "token_perplexity": math.exp(nll / tokens),
        "word_perplexity": math.exp(nll / words),
        "byte_perplexity": math.exp(nll / n_bytes),
        "bits_per_byte": nll / (n_bytes * math.log(2)),
        **per_char,
        "documents": documents,
    }
