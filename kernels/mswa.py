"""Sliding-window attention with one window per head (SWA when all windows are equal, MSWA otherwise)."""

from __future__ import annotations

import torch

from .banded import banded_backward, banded_forward
from .runtime import check_qkv, head_windows, unit_last_dim


class MSWAKernelFunction(torch.autograd.Function):
    """Per-head sliding-window attention (one launch per window group, or one for all heads). See
    :func:`mswa_attention`."""

    @staticmethod
    def forward(ctx, q, k, v, windows):
        o, lse = banded_forward(q, k, v, k, v, windows, has_local=True, has_far=False)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.windows = windows
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        (do,) = unit_last_dim(do)
        dq, dk, dv, _, _ = banded_backward(q, k, v, k, v, o, lse, do, ctx.windows, has_far=False)
        return dq, dk, dv, None


@torch.compiler.disable  # host-side launch logic: runs eagerly between compiled graphs
def mswa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windows: torch.Tensor,
                   group_by_window: bool = True) -> torch.Tensor:
    """Causal attention where query head ``h`` sees keys with ``i - j < windows[h]``, scale ``1/sqrt(d_h)``.

    ``q``: (B, H, T, d_h); ``k, v``: (B, H_kv, T, d_h) with H_kv dividing H (grouped-query attention: query head
    ``h`` reads key/value head ``h // (H // H_kv)``); ``windows``: integer tensor (H,), one per query head, each
    >= 0 (a row with no key gives zeros), best on the CPU: the kernels read it on the host (a CUDA tensor costs a
    device synchronization). Each program starts its key loop at its own head's window, so work scales with the
    sum of the windows. ``group_by_window``: one launch per group of heads with similar windows, each with its own
    tuned tile, groups tuned to the same tile merged (default); ``False``: all heads in one launch with one tile
    shape (kept to measure the choice).
    """
    kv_group = check_qkv("mswa_attention", q, k=k, v=v)
    win = head_windows("mswa_attention", windows, q.shape[1], q.shape[2], q.device, group_by_window, kv_group)
    return MSWAKernelFunction.apply(*unit_last_dim(q, k, v), win)
