"""Cross-entropy of a chunk of logits in one kernel, its gradient written over the logits in place.

``cross_entropy_rows(logits, targets, ignore_index, grad)``: ``logits`` (n, V) in float32, bfloat16 or float16
(row-major, the output layer's product for n positions), ``targets`` (n,) int64 -> the per-row NLL (n,) float32,
``logsumexp(logits_i) - logits_i[target_i]`` computed in float32, 0 where the target is ``ignore_index``, NaN where
it lies outside ``0 .. V-1`` (``F.cross_entropy`` raises there; the loss then reads NaN, never another logit). With
``grad=True`` the logits are replaced by the NLL's gradient ``softmax(logits_i) - onehot(target_i)`` (float32,
rounded to the logits' dtype on store; a zero row where the target is ignored), the ``dlogits`` of
``F.cross_entropy(logits.float(), targets, reduction="none")`` as autograd casts it back.

One program per row, two passes over its V logits in blocks of :data:`BLOCK_V`: the online maximum and sum of
exponentials (float32), then (``grad``) the softmax minus the one-hot. Each logit is read twice and written once in
its own dtype, where the same loss in PyTorch operators makes about ten float32 passes over the chunk.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .runtime import INTERPRET, check_device

BLOCK_V = 16 if INTERPRET else 4096
"""Logits per block of the row loop (the interpreter: small blocks, so tests run several per row)."""


@triton.jit
def _cross_entropy_kernel(LOGITS, stride_row, TARGETS, NLL, V, ignore_index,
                          GRAD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = LOGITS + row * stride_row
    target = tl.load(TARGETS + row)
    valid = target != ignore_index
    offs = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)  # per-lane running maximum and sum of exp(x - m)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + offs
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a lane that has seen only -inf keeps s = 0
        s = s * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    row_max = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp(m - row_max), axis=0)
    lse = row_max + tl.log(total)
    inside = (target >= 0) & (target < V)  # a target outside the vocabulary: NaN, never a read out of bounds
    picked = tl.load(base + tl.where(valid & inside, target, 0)).to(tl.float32)
    tl.store(NLL + row, tl.where(valid, tl.where(inside, lse - picked, float("nan")), 0.0))
    if GRAD:
        for start in range(0, V, BLOCK):
            cols = start + offs
            x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            g = tl.exp(x - lse) - tl.where(cols == target, 1.0, 0.0)
            g = tl.where(valid, g, 0.0)
            tl.store(base + cols, g.to(LOGITS.dtype.element_ty), mask=cols < V)


def cross_entropy_rows(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                       grad: bool = False) -> torch.Tensor:
    """Per-row NLL (n,) float32 of ``logits`` (n, V) against ``targets`` (n,); with ``grad`` the logits are
    overwritten by ``softmax - onehot`` (see the module docstring). One kernel launch."""
    check_device("cross_entropy_rows", logits)
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy_rows: logits (n, V) and targets (n,) expected, got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    if logits.stride(1) != 1:
        raise ValueError("cross_entropy_rows: logits must be contiguous along the vocabulary")
    nll = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    if logits.shape[0]:
        _cross_entropy_kernel[(logits.shape[0],)](logits, logits.stride(0), targets, nll, logits.shape[1],
                                                  ignore_index, GRAD=grad, BLOCK=BLOCK_V,
                                                  num_warps=1 if INTERPRET else 16)
    return nll
