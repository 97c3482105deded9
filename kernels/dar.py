"""DAR two-path attention: local keys/values inside the window, the bottleneck's global ones beyond it.

:class:`DARFunction` is the autograd function; its forward and backward are also ``torch.library`` custom ops
(``dar_forward``, ``dar_backward`` in the :data:`~kernels.runtime.OPS` namespace) with shape-only fake
implementations, which it calls under torch.compile (one graph node each) and skips in eager mode
(:func:`~kernels.runtime.eager_or_op`).
"""

from __future__ import annotations

import torch

from .backward import banded_backward
from .banded import banded_forward
from .runtime import (OPS, check_qkv, check_spans, check_window, eager_or_op, launch_windows, new_heads,
                      refuse_double_backward, unit_last_dim)


def _forward(q: torch.Tensor, k_loc: torch.Tensor, v_loc: torch.Tensor, k_glob: torch.Tensor,
             v_glob: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``o`` (B, H, T, d_h) and its base-2 LSE (B*H, T) float32; inputs validated by :func:`dar_attention`."""
    check_spans("dar_attention", q, k_loc, v_loc, k_glob, v_glob)
    win = launch_windows([window] * q.shape[1], q.shape[2], q.device, kv_group=q.shape[1] // k_loc.shape[1])
    return banded_forward(q, k_loc, v_loc, k_glob, v_glob, win, has_local=True, has_far=True)


def _backward(q: torch.Tensor, k_loc: torch.Tensor, v_loc: torch.Tensor, k_glob: torch.Tensor,
              v_glob: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor, window: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of all five inputs of :func:`_forward` for the output gradient ``do``."""
    win = launch_windows([window] * q.shape[1], q.shape[2], q.device, kv_group=q.shape[1] // k_loc.shape[1])
    return banded_backward(q, k_loc, v_loc, k_glob, v_glob, o, lse, *unit_last_dim(do), win, has_far=True)


dar_forward = torch.library.custom_op(f"{OPS}::dar_forward", _forward, mutates_args=())
dar_backward = torch.library.custom_op(f"{OPS}::dar_backward", _backward, mutates_args=())


@dar_forward.register_fake
def _(q, k_loc, v_loc, k_glob, v_glob, window):
    B, H, T, _ = q.shape
    return new_heads(q), q.new_empty((B * H, T), dtype=torch.float32)


@dar_backward.register_fake
def _(q, k_loc, v_loc, k_glob, v_glob, o, lse, do, window):
    return new_heads(q), *(new_heads(k_loc) for _ in range(4))


class DARFunction(torch.autograd.Function):
    """``o`` of :func:`dar_attention`'s validated inputs; the backward gives all five inputs their gradients."""

    @staticmethod
    def forward(ctx, q, k_loc, v_loc, k_glob, v_glob, window: int):
        o, lse = eager_or_op(dar_forward, _forward, q, k_loc, v_loc, k_glob, v_glob, window)
        ctx.save_for_backward(q, k_loc, v_loc, k_glob, v_glob, o, lse)
        ctx.window = window
        return o

    @staticmethod
    def backward(ctx, do):
        refuse_double_backward(do)
        return (*eager_or_op(dar_backward, _backward, *ctx.saved_tensors, do, ctx.window), None)


def dar_attention(q: torch.Tensor, k_loc: torch.Tensor, v_loc: torch.Tensor, k_glob: torch.Tensor,
                  v_glob: torch.Tensor, window: int) -> torch.Tensor:
    """Causal attention where pair ``(i, j)`` uses ``k_loc[j], v_loc[j]`` if ``i - j < window`` else
    ``k_glob[j], v_glob[j]``, one softmax over all ``j <= i``, scale ``1/sqrt(d_h)``.

    ``q`` (B, H, T, d_h); the four key/value tensors (B, H_kv, T, d_h) with H_kv dividing H (grouped-query
    attention: query head ``h`` reads key/value head ``h // (H // H_kv)``); same dtype (float16/bfloat16/float32)
    and device. Returns (B, H, T, d_h).
    """
    check_qkv("dar_attention", q, k_loc=k_loc, v_loc=v_loc, k_glob=k_glob, v_glob=v_glob)
    window = min(check_window("dar_attention", window), 2**30)
    return DARFunction.apply(*unit_last_dim(q, k_loc, v_loc, k_glob, v_glob), window)
