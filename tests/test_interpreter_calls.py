"""tests/interpreter_calls.py: under the suite's CPU interpreter a device function called many times in one launch
patches triton.language once, and its results are those of Triton's own interpreter."""

from __future__ import annotations

import inspect
import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU interpreter's speed-up")


@triton.jit
def add(x, y):
    return x + tl.full(x.shape, y, tl.float32)


@triton.jit
def kernel(X, Y, CALLS: tl.constexpr):
    offs = tl.arange(0, 16)
    x = tl.load(X + offs)
    for i in range(CALLS):
        x = add(x, i + 1.0)
    tl.store(Y + offs, x)


def test_a_device_function_patches_the_language_once_per_launch(monkeypatch):
    walks = []
    real = inspect.getmembers
    monkeypatch.setattr(inspect, "getmembers", lambda *a, **k: walks.append(1) or real(*a, **k))
    x = torch.arange(16, dtype=torch.float32)
    counts = {}
    for calls in (1, 6):
        y = torch.empty_like(x)
        walks.clear()
        kernel[(1,)](x, y, CALLS=calls)
        counts[calls] = len(walks)
        assert torch.equal(y, x + calls * (calls + 1) / 2)  # 1 + 2 + ... + calls added
    assert counts[1] == counts[6] > 0, counts  # the five later calls of add walked nothing
