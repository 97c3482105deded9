"""Rolling windows equal lm-evaluation-harness's, token for token; the stride variant scores every token once."""

import random

import pytest
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from neox_dar.evaluation.rolling import rolling_spans, rolling_windows

PREFIX = 0


def lm_eval_windows(tokens, max_length):
    return [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, PREFIX, max_length, context_len=1)]


def _lengths(max_length, rng):
    """N < L, N = L, N = k*L, N = k*L + 1, N = k*L - 1 and random N."""
    k = rng.randrange(2, 6)
    return sorted({0, 1, max(1, max_length - 1), max_length, max_length + 1, k * max_length, k * max_length + 1,
                   k * max_length - 1, rng.randrange(1, 12 * max_length)})


@pytest.mark.parametrize("max_length", [1, 2, 3, 8, 17, 128])
def test_windows_equal_lm_eval(max_length):
    rng = random.Random(max_length)
    for n in _lengths(max_length, rng):
        tokens = [rng.randrange(1, 50277) for _ in range(n)]
        assert rolling_windows(tokens, max_length, PREFIX) == lm_eval_windows(tokens, max_length), n


@pytest.mark.parametrize("max_length,stride", [(8, 1), (8, 3), (8, 8), (16, 5), (5, 4)])
def test_stride_scores_every_token_once_with_context(max_length, stride):
    rng = random.Random(7 * max_length + stride)
    for n in _lengths(max_length, rng):
        tokens = [rng.randrange(1, 50277) for _ in range(n)]
        stream = [PREFIX] + tokens
        windows = rolling_windows(tokens, max_length, PREFIX, stride=stride)
        assert [t for _, targets in windows for t in targets] == tokens
        offset = 0
        for i, (context, targets) in enumerate(windows):
            inputs = context + targets[:-1]
            assert 1 <= len(inputs) <= max_length
            # the input is the stream just before the targets: position j predicts stream[j + 1]
            end = offset + len(targets)
            assert inputs == stream[end - len(inputs):end]
            if i == 0:
                assert context == [PREFIX] and len(targets) == min(max_length, n)
            else:
                assert len(targets) <= stride and len(inputs) == max_length
                assert len(context) >= max_length - stride + 1   # every later target sees >= L - S tokens
            offset = end


def test_spans_match_windows_and_bad_arguments():
    rng = random.Random(3)
    tokens = [rng.randrange(1, 50277) for _ in range(41)]
    stream = [PREFIX] + tokens
    for (start, end, n), (context, targets) in zip(rolling_spans(41, 8, 3), rolling_windows(tokens, 8, PREFIX, 3)):
        assert stream[start:end] == context + targets[:-1] and stream[end - n + 1:end + 1] == targets
    assert rolling_windows([], 8, PREFIX) == []
    with pytest.raises(ValueError, match="stride"):
        rolling_windows(tokens, 8, PREFIX, stride=9)
    with pytest.raises(ValueError, match="max_length"):
        rolling_windows(tokens, 0, PREFIX)
