"""AHA routed attention: each (token, head) row is full causal attention if its gate is on, else sliding-window.

Every row runs the local (sliding-window) pass; each head's routed rows are compacted into a sorted list of
positions (a stable sort of the gate, no host synchronization) and attend to every causal key in a second kernel
that overwrites their output and LSE. The backward is one key-major launch: the local pairs of every row, then,
into the same accumulators, the far pairs (``i - j >= w``) of the routed rows only.
"""

from __future__ import annotations

import torch

from .banded import banded_backward, banded_forward, routed_forward
from .runtime import check_device, check_qkv, head_windows, unit_last_dim


def route_rows(gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Compact each head's routed rows, without a host synchronization.

    ``gate`` (B, H, T) bool -> ``rows`` int32 (B*H, T): per (b*H + h), the routed positions in ascending order
    first, then the others; ``counts`` int32 (B*H,): how many of each row's leading entries are routed.
    """
    B, H, T = gate.shape
    flat = gate.reshape(B * H, T)
    rows = torch.argsort((~flat).to(torch.int8), dim=1, stable=True)
    return rows.to(torch.int32).contiguous(), flat.sum(1, dtype=torch.int32)


class AHAKernelFunction(torch.autograd.Function):
    """Routed attention; no gradient for the gate (the module applies the straight-through rule outside)."""

    @staticmethod
    def forward(ctx, q, k, v, gate, windows):
        o, lse = banded_forward(q, k, v, k, v, windows, has_local=True, has_far=False)
        rows, counts = route_rows(gate)
        routed_forward(q, k, v, o, lse, windows, rows, counts)
        ctx.save_for_backward(q, k, v, o, lse, rows, counts)
        ctx.windows = windows
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, rows, counts = ctx.saved_tensors
        (do,) = unit_last_dim(do)
        dq, dk, dv, _, _ = banded_backward(q, k, v, k, v, o, lse, do, ctx.windows, has_far=False,
                                           routed=(rows, counts))
        return dq, dk, dv, None, None


@torch.compiler.disable  # host-side launch logic: runs eagerly between compiled graphs
def aha_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, window: int) -> torch.Tensor:
    """Row ``(b, h, i)`` is full causal attention if ``gate[b, h, i]`` else attention over keys ``i - j < window``.

    ``q``: (B, H, T, d_h); ``k, v``: (B, H_kv, T, d_h) with H_kv dividing H (grouped-query attention); ``gate``:
    bool (B, H, T), per query head, no gradient. Returns (B, H, T, d_h), scale ``1/sqrt(d_h)``. Far keys are read
    only for routed rows, in the forward and in the backward.
    """
    kv_group = check_qkv("aha_attention", q, k=k, v=v)
    B, H, T, _ = q.shape
    if gate.dtype != torch.bool or tuple(gate.shape) != (B, H, T):
        raise ValueError(f"aha_attention: gate must be a bool tensor of shape {(B, H, T)}, "
                         f"got {gate.dtype} {tuple(gate.shape)}")
    check_device("aha_attention", gate)
    if gate.device != q.device:
        raise ValueError(f"aha_attention: gate is on {gate.device} but q is on {q.device}")
    windows = head_windows("aha_attention", window, H, T, q.device, kv_group=kv_group)
    return AHAKernelFunction.apply(*unit_last_dim(q, k, v), gate.detach(), windows)
