"""AHA routed attention: each (token, head) row is full causal attention if its gate is on, else sliding-window.

Every row runs the local (sliding-window) pass; each head's routed rows are compacted into a sorted list of
positions (a stable sort of the gate, no host synchronization) and attend to every causal key in a second kernel
that overwrites their output and LSE. The backward is one key-major launch: the local pairs of every row, then,
into the same accumulators, the far pairs (``i - j >= w``) of the routed rows only.

Forward and backward: :class:`AHAFunction`, which calls them as ``torch.library`` custom ops (``aha_forward``,
``aha_backward`` in the :data:`~kernels.runtime.OPS` namespace, shape-only fakes) under torch.compile and directly
in eager mode (:func:`~kernels.runtime.eager_or_op`).
"""

from __future__ import annotations

import torch

from .backward import banded_backward
from .banded import banded_forward, routed_forward
from .runtime import (OPS, check_device, check_qkv, check_spans, check_window, eager_or_op, launch_windows, new_heads,
                      refuse_double_backward, unit_last_dim)


def route_rows(gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Compact each head's routed rows, without a host synchronization.

    ``gate`` (B, H, T) bool -> ``rows`` int32 (B*H, T): per (b*H + h), the routed positions in ascending order
    first, then the others; ``counts`` int32 (B*H,): how many of each row's leading entries are routed.
    """
    B, H, T = gate.shape
    flat = gate.reshape(B * H, T)
    rows = torch.argsort((~flat).to(torch.int8), dim=1, stable=True)
    return rows.to(torch.int32).contiguous(), flat.sum(1, dtype=torch.int32)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, window: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``o`` (B, H, T, d_h), its base-2 LSE (B*H, T) float32 and the routed rows and counts (:func:`route_rows`);
    inputs validated by :func:`aha_attention`."""
    check_spans("aha_attention", q, k, v)
    windows = launch_windows([window] * q.shape[1], q.shape[2], q.device, kv_group=q.shape[1] // k.shape[1])
    o, lse = banded_forward(q, k, v, k, v, windows, has_local=True, has_far=False)
    rows, counts = route_rows(gate)
    routed_forward(q, k, v, o, lse, windows, rows, counts)
    return o, lse, rows, counts


def _backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
              rows: torch.Tensor, counts: torch.Tensor, do: torch.Tensor, window: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dq, dk, dv`` of :func:`_forward` for the output gradient ``do`` (none for the gate: the module applies the
    straight-through rule outside)."""
    windows = launch_windows([window] * q.shape[1], q.shape[2], q.device, kv_group=q.shape[1] // k.shape[1])
    dq, dk, dv, _, _ = banded_backward(q, k, v, k, v, o, lse, *unit_last_dim(do), windows, has_far=False,
                                       routed=(rows, counts))
    return dq, dk, dv


aha_forward = torch.library.custom_op(f"{OPS}::aha_forward", _forward, mutates_args=())
aha_backward = torch.library.custom_op(f"{OPS}::aha_backward", _backward, mutates_args=())


@aha_forward.register_fake
def _(q, k, v, gate, window):
    B, H, T, _ = q.shape
    return (new_heads(q), q.new_empty((B * H, T), dtype=torch.float32),
            q.new_empty((B * H, T), dtype=torch.int32), q.new_empty((B * H,), dtype=torch.int32))


@aha_backward.register_fake
def _(q, k, v, o, lse, rows, counts, do, window):
    return new_heads(q), new_heads(k), new_heads(k)


class AHAFunction(torch.autograd.Function):
    """``o`` of :func:`aha_attention`'s validated inputs; the backward gives ``q``, ``k``, ``v`` their gradients
    (none to the gate)."""

    @staticmethod
    def forward(ctx, q, k, v, gate, window: int):
        o, lse, rows, counts = eager_or_op(aha_forward, _forward, q, k, v, gate, window)
        ctx.save_for_backward(q, k, v, o, lse, rows, counts)
        ctx.window = window
        return o

    @staticmethod
    def backward(ctx, do):
        refuse_double_backward(do)
        return (*eager_or_op(aha_backward, _backward, *ctx.saved_tensors, do, ctx.window), None, None)


def aha_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, window: int) -> torch.Tensor:
    """Row ``(b, h, i)`` is full causal attention if ``gate[b, h, i]`` else attention over keys ``i - j < window``.

    ``q``: (B, H, T, d_h); ``k, v``: (B, H_kv, T, d_h) with H_kv dividing H (grouped-query attention); ``gate``:
    bool (B, H, T), per query head, no gradient. Returns (B, H, T, d_h), scale ``1/sqrt(d_h)``. Far keys are read
    only for routed rows, in the forward and in the backward.
    """
    check_qkv("aha_attention", q, k=k, v=v)
    B, H, T, _ = q.shape
    if gate.dtype != torch.bool or tuple(gate.shape) != (B, H, T):
        raise ValueError(f"aha_attention: gate must be a bool tensor of shape {(B, H, T)}, "
                         f"got {gate.dtype} {tuple(gate.shape)}")
    check_device("aha_attention", gate)
    if gate.device != q.device:
        raise ValueError(f"aha_attention: gate is on {gate.device} but q is on {q.device}")
    window = min(check_window("aha_attention", window), 2**30)
    return AHAFunction.apply(*unit_last_dim(q, k, v), gate.detach(), window)
