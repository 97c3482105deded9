"""Sliding-window attention with one window per head (SWA when all windows are equal, MSWA otherwise).

:class:`MSWAFunction` is the autograd function; its forward and backward are also ``torch.library`` custom ops
(``mswa_forward``, ``mswa_backward`` in the :data:`~kernels.runtime.OPS` namespace) with shape-only fake
implementations, which it calls under torch.compile (one graph node each, no graph break) and skips in eager mode
(:func:`~kernels.runtime.eager_or_op`); the windows travel as a list of ints.
"""

from __future__ import annotations

import torch

from .backward import banded_backward
from .banded import banded_forward
from .runtime import (OPS, check_qkv, check_spans, eager_or_op, launch_windows, new_heads, refuse_double_backward,
                      unit_last_dim, window_values)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windows: list[int],
             group_by_window: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``o`` (B, H, T, d_h) and its base-2 LSE (B*H, T) float32; inputs validated by :func:`mswa_attention`."""
    check_spans("mswa_attention", q, k, v)
    win = launch_windows(windows, q.shape[2], q.device, group_by_window, q.shape[1] // k.shape[1])
    return banded_forward(q, k, v, k, v, win, has_local=True, has_far=False)


def _backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
              do: torch.Tensor, windows: list[int], group_by_window: bool
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dq, dk, dv`` of :func:`_forward` for the output gradient ``do``."""
    win = launch_windows(windows, q.shape[2], q.device, group_by_window, q.shape[1] // k.shape[1])
    dq, dk, dv, _, _ = banded_backward(q, k, v, k, v, o, lse, *unit_last_dim(do), win, has_far=False)
    return dq, dk, dv


mswa_forward = torch.library.custom_op(f"{OPS}::mswa_forward", _forward, mutates_args=())
mswa_backward = torch.library.custom_op(f"{OPS}::mswa_backward", _backward, mutates_args=())


@mswa_forward.register_fake
def _(q, k, v, windows, group_by_window):
    B, H, T, _ = q.shape
    return new_heads(q), q.new_empty((B * H, T), dtype=torch.float32)


@mswa_backward.register_fake
def _(q, k, v, o, lse, do, windows, group_by_window):
    return new_heads(q), new_heads(k), new_heads(k)


class MSWAFunction(torch.autograd.Function):
    """``o`` of :func:`mswa_attention`'s validated inputs; the backward gives ``q``, ``k``, ``v`` their gradients."""

    @staticmethod
    def forward(ctx, q, k, v, windows: list[int], group_by_window: bool):
        o, lse = eager_or_op(mswa_forward, _forward, q, k, v, windows, group_by_window)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.windows, ctx.group_by_window = windows, group_by_window
        return o

    @staticmethod
    def backward(ctx, do):
        refuse_double_backward(do)
        grads = eager_or_op(mswa_backward, _backward, *ctx.saved_tensors, do, ctx.windows, ctx.group_by_window)
        return (*grads, None, None)


def mswa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windows, group_by_window: bool = True
                   ) -> torch.Tensor:
    """Causal attention where query head ``h`` sees keys with ``i - j < windows[h]``, scale ``1/sqrt(d_h)``.

    ``q``: (B, H, T, d_h); ``k, v``: (B, H_kv, T, d_h) with H_kv dividing H (grouped-query attention: query head
    ``h`` reads key/value head ``h // (H // H_kv)``); ``windows``: one int per query head (a list, or an integer
    tensor (H,) read on the host, best on the CPU), or one int for every head, each >= 0 (a row with no key gives
    zeros). Each program starts its key loop at its own head's window, so work scales with the sum of the
    windows. ``group_by_window``: one launch per group of heads with similar windows, each with its own tuned tile,
    groups tuned to the same tile merged (default); ``False``: all heads in one launch with one tile shape (kept to
    measure the choice).
    """
    check_qkv("mswa_attention", q, k=k, v=v)
    values = window_values("mswa_attention", windows, q.shape[1])
    return MSWAFunction.apply(*unit_last_dim(q, k, v), values, group_by_window)
