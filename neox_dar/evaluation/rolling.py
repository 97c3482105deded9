"""Rolling windows: split one document's tokens into model inputs so that every token is scored exactly once.

The default reproduces lm-evaluation-harness ``loglikelihood_rolling`` token for token:
``[make_disjoint_window(x) for x in get_rolling_token_windows(tokens, prefix_token, max_length, context_len=1)]``.
Write the stream as ``x = [prefix] + tokens``; token ``tokens[j]`` is predicted from ``x[:j+1]``.

* The first window feeds ``x[0 : n]`` and scores ``tokens[0 : n]``, ``n = min(max_length, N)``.
* Every later window scores the next ``stride`` unscored tokens ``tokens[p : q]`` (fewer at the end) and feeds
  the ``max_length`` stream tokens that end just before the last target, ``x[q - max_length : q]``.

With ``stride = max_length`` (the default) this is lm-eval's rule: consecutive windows share no target, and a
target early in a window sees little context. A smaller ``stride`` is the Hugging Face "perplexity with a
sliding window" recipe: each later window re-reads ``max_length - stride`` tokens of context and scores only
its last ``stride`` tokens, so every token but those of the first window sees at least
``max_length - stride`` tokens of context, at ``max_length / stride`` times the cost.

A window is returned as ``(context, targets)`` in lm-eval's disjoint form: the model input is
``context + targets[:-1]`` (at most ``max_length`` tokens) and its last ``len(targets)`` positions predict
``targets``.
"""

from __future__ import annotations

from collections.abc import Sequence

Window = tuple[list[int], list[int]]
Span = tuple[int, int, int]


def rolling_spans(n_tokens: int, max_length: int, stride: int | None = None) -> list[Span]:
    """The windows of an ``n_tokens``-token document as spans ``(start, end, n_targets)`` of the stream
    ``x = [prefix] + tokens``: the model input is ``x[start:end]`` and its last ``n_targets`` positions predict
    ``x[end - n_targets + 1 : end + 1]``. ``stride`` defaults to ``max_length`` and must be in ``1..max_length``.
    """
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    stride = max_length if stride is None else stride
    if not 1 <= stride <= max_length:
        raise ValueError(f"stride must be in 1..max_length={max_length}, got {stride}")
    if n_tokens <= 0:
        return []
    first = min(max_length, n_tokens)
    spans: list[Span] = [(0, first, first)]
    done = first
    while done < n_tokens:
        end = min(done + stride, n_tokens)
        spans.append((end - max_length, end, end - done))   # end > max_length here, so the start is >= 1
        done = end
    return spans


def rolling_windows(tokens: Sequence[int], max_length: int, prefix_token: int,
                    stride: int | None = None) -> list[Window]:
    """Windows ``(context, targets)`` covering ``tokens`` once each (``[]`` for an empty document); the model
    input of a window is ``context + targets[:-1]``. See :func:`rolling_spans` for ``max_length`` and ``stride``.
    """
    stream = [prefix_token] + list(tokens)
    return [(stream[start:end - n + 1], stream[end - n + 1:end + 1])
            for start, end, n in rolling_spans(len(stream) - 1, max_length, stride)]
