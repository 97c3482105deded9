"""The language-modelling loss straight from the final hidden states, never holding every position's logits.

The output layer turns hidden states (N, d) into logits (N, V); with GPT-NeoX's 50,304-token vocabulary those are
the largest tensors of a step (the tiny config's 8 x 128 micro-batch: 206 MB in float32, and a float32 copy for
the loss on top). Here the positions are taken a chunk at a time: each chunk's logits are computed in the weight's
dtype and reduced to their cross-entropy in float32 at once, as ``F.cross_entropy(logits.float(), targets)`` would.

With gradients (:func:`linear_cross_entropy_sum` in grad mode), each chunk's gradients are computed right there
too (fused linear + cross-entropy): ``dlogits = softmax - onehot`` (float32, cast to the weight's dtype like
autograd's cast of a ``.float()``), ``dhidden = dlogits @ W`` and ``dW += dlogits^T @ hidden`` (accumulated in
float32), so the backward only scales them by the incoming gradient: no logits are kept and none is recomputed.
Targets equal to :data:`IGNORE` (-100, GPT-NeoX's label convention) count nothing and get no gradient.

Two ways to reduce a chunk, chosen by the device (``fused=None``), the same numbers either way:

* CUDA (``fused``): chunks of about :data:`FUSED_CHUNK_BYTES` of logits in the weight's dtype (thousands of
  positions: 5,336 at a 50,304 vocabulary in bf16), the cross-entropy and ``dlogits`` by one Triton kernel that
  overwrites the logits in place (``kernels.cross_entropy``): per chunk three matrix products, one kernel and
  the float32 accumulation of the weight gradient (a half-precision product summed in float32 by cuBLAS itself,
  ``out_dtype``).
* elsewhere (the CPU): chunks of about :data:`CHUNK_BYTES` of float32 logits, reduced by PyTorch operators
  (``_chunk_nll``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100
CHUNK_BYTES = 32 << 20  # float32 logits per chunk, PyTorch operators (the CPU)
FUSED_CHUNK_BYTES = 512 << 20  # logits in the weight's dtype per chunk, the fused kernel (CUDA)


def chunk_rows(vocab: int, fused: bool = False, itemsize: int = 4) -> int:
    """Positions per chunk for a vocabulary of ``vocab`` logits: about :data:`CHUNK_BYTES` of float32 logits, or
    with ``fused`` about :data:`FUSED_CHUNK_BYTES` of logits of ``itemsize`` bytes."""
    return max(1, (FUSED_CHUNK_BYTES // itemsize if fused else CHUNK_BYTES // 4) // vocab)


def _cross_entropy_kernel():
    """``kernels.cross_entropy.cross_entropy_rows`` (imported on first use, as the attention kernels are)."""
    from .top_packages import INSTALLED

    if INSTALLED:
        from .kernels.cross_entropy import cross_entropy_rows
    else:
        from kernels.cross_entropy import cross_entropy_rows
    return cross_entropy_rows


def _mm_float32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of half-precision matrices, summed and returned in float32 (on CUDA by cuBLAS's ``out_dtype``;
    elsewhere, where that is not implemented, through float32 copies)."""
    return torch.mm(a, b, out_dtype=torch.float32) if a.is_cuda else torch.mm(a.float(), b.float())


def _use_fused(fused: bool | None, hidden: torch.Tensor) -> bool:
    """The caller's choice, else the kernel for CUDA tensors and PyTorch operators elsewhere."""
    return hidden.is_cuda if fused is None else fused


def _chunk_nll(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
               softmax: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk: hidden (n, d), weight (V, d), targets (n,) -> the per-position NLL (n,) float32 (0 where the
    target is :data:`IGNORE`) and, with ``softmax``, the float32 softmax (n, V). The logits' one float32 buffer
    becomes the softmax in place: a chunk never holds more than one (n, V) float32 tensor (two when the weight is
    not float32: its own logits first)."""
    logits = F.linear(hidden, weight).float()
    valid = targets != IGNORE
    picked = logits.gather(1, torch.where(valid, targets, 0)[:, None]).squeeze(1)
    top = logits.amax(dim=-1, keepdim=True)
    exp = logits.sub_(top).exp_()
    total = exp.sum(dim=-1)
    nll = torch.where(valid, total.log() + top.squeeze(1) - picked, 0.0)  # logsumexp - target logit
    return nll, exp.div_(total[:, None]) if softmax else None


def _sum_and_grads(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int,
                   need_hidden: bool, need_weight: bool, fused: bool
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """hidden (N, d), weight (V, d), targets (N,) -> the summed NLL (float32 scalar) and, where asked, its gradients
    in ``hidden`` (N, d; hidden's dtype) and ``weight`` (V, d; float32), chunk by chunk (``fused``: the kernel)."""
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad_hidden = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if need_hidden else None
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
    reduce_rows = _cross_entropy_kernel() if fused else None
    for start in range(0, hidden.shape[0], rows):
        h, t = hidden[start:start + rows], targets[start:start + rows]
        if fused:
            grad = F.linear(h, weight)
            total += reduce_rows(grad, t, IGNORE, grad=need_hidden or need_weight).sum()  # grad: dnll/dlogits now
        else:
            nll, probs = _chunk_nll(h, weight, t, softmax=need_hidden or need_weight)
            total += nll.sum()
            if probs is None:
                continue
            valid = t != IGNORE
            probs[torch.arange(len(t), device=t.device), torch.where(valid, t, 0)] -= 1.0
            grad = probs.mul_(valid[:, None]).to(weight.dtype)  # d nll / d logits, as autograd casts it
        if need_hidden:
            torch.mm(grad, weight, out=grad_hidden[start:start + rows])
        if not need_weight:
            continue
        if weight.dtype == torch.float32:
            grad_weight.addmm_(grad.T, h)
        else:
            grad_weight += _mm_float32(grad.T, h)
    return total, grad_hidden, grad_weight


@torch.library.custom_op("neox_dar::fused_linear_cross_entropy", mutates_args=())
def _fused_sum_and_grads(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int,
                         need_hidden: bool, need_weight: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_sum_and_grads` through the kernel, as a custom op (torch.compile calls it whole: it launches a
    Triton kernel per chunk and writes into its own buffers); a gradient not asked for is an empty tensor."""
    total, grad_hidden, grad_weight = _sum_and_grads(hidden, weight, targets, rows, need_hidden, need_weight, True)
    return (total, hidden.new_empty(0) if grad_hidden is None else grad_hidden,
            weight.new_empty(0, dtype=torch.float32) if grad_weight is None else grad_weight)


@_fused_sum_and_grads.register_fake
def _(hidden, weight, targets, rows, need_hidden, need_weight):
    return (hidden.new_empty((), dtype=torch.float32), hidden.new_empty(hidden.shape if need_hidden else 0),
            weight.new_empty(weight.shape if need_weight else 0, dtype=torch.float32))


def _sum_and_grads_on(hidden, weight, targets, rows, need_hidden, need_weight, fused):
    """:func:`_sum_and_grads`, through the custom op when ``fused``."""
    if not fused:
        return _sum_and_grads(hidden, weight, targets, rows, need_hidden, need_weight, False)
    total, grad_hidden, grad_weight = _fused_sum_and_grads(hidden, weight, targets, rows, need_hidden, need_weight)
    return total, grad_hidden if need_hidden else None, grad_weight if need_weight else None


class _LinearCrossEntropySum(torch.autograd.Function):
    """``sum_i CE(hidden_i @ W^T, targets_i)`` over the non-ignored targets, chunk by chunk, with the gradients
    computed in the forward (see the module docstring)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int,
                fused: bool) -> torch.Tensor:
        total, grad_hidden, grad_weight = _sum_and_grads_on(hidden, weight, targets, rows,
                                                            *ctx.needs_input_grad[:2], fused)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = hidden.dtype, weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        if grad_hidden is not None:
            grad_hidden = (grad_hidden * grad_total).to(hidden_dtype)
        if grad_weight is not None:
            grad_weight = (grad_weight * grad_total).to(weight_dtype)
        return grad_hidden, grad_weight, None, None, None


def linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                             rows: int | None = None, fused: bool | None = None) -> torch.Tensor:
    """Summed next-token cross-entropy (float32 scalar) of the logits ``hidden @ weight^T`` without materialising
    them: ``hidden`` (..., d), ``weight`` (V, d), ``targets`` (...) int64 with :data:`IGNORE` where nothing counts;
    ``rows`` positions per chunk (default :func:`chunk_rows`); ``fused``: the Triton kernel (default: on CUDA
    tensors; on the CPU it runs only under ``TRITON_INTERPRET=1``). Differentiable in ``hidden`` and ``weight``
    (one pass); equal within float rounding to ``F.cross_entropy(F.linear(hidden, weight).float(), targets,
    ignore_index=-100, reduction="sum")`` and to its gradients."""
    fused = _use_fused(fused, hidden)
    rows = rows or chunk_rows(weight.shape[0], fused, weight.element_size())
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _LinearCrossEntropySum.apply(hidden, weight, targets, rows, fused)
    return _sum_and_grads_on(hidden, weight, targets, rows, False, False, fused)[0]  # validation: the loss alone


@torch.no_grad()
def linear_token_nll(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                     rows: int | None = None, fused: bool | None = None) -> torch.Tensor:
    """Per-position cross-entropy (float32, no gradient) of the logits ``hidden @ weight^T``: ``hidden`` (..., d),
    ``weight`` (V, d), ``targets`` (...) -> (...), 0 where the target is :data:`IGNORE`. Only the positions with a
    target go through the output layer (a rolling window's context and padding cost nothing). ``rows`` and
    ``fused`` as for :func:`linear_cross_entropy_sum`."""
    fused = _use_fused(fused, hidden)
    flat, shape = targets.reshape(-1), targets.shape
    out = torch.zeros(flat.shape, dtype=torch.float32, device=hidden.device)
    scored = (flat != IGNORE).nonzero().squeeze(1)
    h, t = hidden.reshape(-1, hidden.shape[-1])[scored], flat[scored]
    rows = rows or chunk_rows(weight.shape[0], fused, weight.element_size())
    reduce_rows = _cross_entropy_kernel() if fused else None
    for start in range(0, len(scored), rows):
        hc, tc = h[start:start + rows], t[start:start + rows]
        out[scored[start:start + rows]] = (reduce_rows(F.linear(hc, weight), tc, IGNORE) if fused
                                           else _chunk_nll(hc, weight, tc)[0])
    return out.reshape(shape)


def _module_chunk_sum(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), targets, ignore_index=IGNORE, reduction="sum")


def module_cross_entropy(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, reduction: str,
                         rows: int) -> torch.Tensor:
    """The loss of :func:`linear_cross_entropy_sum` (``reduction="sum"``) or :func:`linear_token_nll` (``"none"``)
    for an output layer that is a module of its own rather than a weight (a LoRA adapter around it): chunk by chunk
    through ``head`` (hidden (n, d) -> logits (n, V)), each chunk recomputed in the backward
    (``torch.utils.checkpoint``), so here too no more than one chunk's logits exist at a time."""
    h, t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if reduction == "none":
        with torch.no_grad():
            return torch.cat([F.cross_entropy(head(h[s:s + rows]).float(), t[s:s + rows], ignore_index=IGNORE,
                                              reduction="none") for s in range(0, len(t), rows)]).reshape(targets.shape)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for s in range(0, len(t), rows):
        total = total + torch.utils.checkpoint.checkpoint(_module_chunk_sum, head, h[s:s + rows], t[s:s + rows],
                                                          use_reentrant=False)
    return total
