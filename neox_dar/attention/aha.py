"""All-or-here attention (AHA): per token and head, a router picks full causal attention or a sliding window.

``s = sigmoid(router(a))`` (B, T, H), gate ``g = 1[s > tau]``. Head output at token ``i``: full causal attention
when ``g = 1``, sliding-window attention (window ``w``) when ``g = 0``; only the selected path produces the value
and receives gradients. Straight-through rule (``aha_ste``), both with value ``o`` (the selected path's output):

* ``selected`` (default; "Learning When Not to Attend Globally" (AHA), Eq. 3-4 read literally):
  ``dL/ds = (2g - 1) <dL/do, o>``, by :class:`SelectedPath` (the value of
  ``o * (1 + (2g - 1) (s - stop_grad(s)))`` and its gradients, without the product). Only the selected path is ever
  computed.
* ``difference`` (the usual STE through ``o = g Full + (1 - g) Local``): ``dL/ds = <dL/do, Full - Local>``,
  realised as ``o + (2g - 1) (s - stop_grad(s)) (o - other)`` with ``other`` the non-selected path, computed
  under ``no_grad`` by the same path function with the gate inverted (one extra attention forward per layer,
  only when the router needs a gradient). q, k, v still get gradients through the selected path only.

Auxiliary loss per layer ``lambda * mean(s) / L`` with ``L`` the number of AHA layers (with ``attention_config``
mixing AHA with other layer types, only those have an ``s``), so the model's sum over layers is ``lambda`` times the
mean of ``s`` over the AHA layers, tokens and heads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..standalone.aha import AHALayer
from ..standalone.cache import Layout, step_keys
from ..variants.aha import AHASpec
from ..variants.layers import layer_position
from .base import Attention
from .masks import masked_attention, window_mask
from .triton_bridge import triton_kernels
from .windowed import causal_sdpa, windowed_sdpa

if TYPE_CHECKING:
    from ..config import ModelConfig


def aha_reference(q, k, v, gate: torch.Tensor, window: int) -> torch.Tensor:
    """Per-row mask selection: row (b, h, i) sees all ``j <= i`` if ``gate[b, h, i]`` else ``i - j < w``.

    q, k, v (B, H, T, d_h), gate (B, H, T) bool -> (B, H, T, d_h); float32 math, explicit (B, H, T, T) mask.
    """
    T = q.shape[-2]
    allowed = torch.where(gate[..., None], window_mask(T, None, q.device), window_mask(T, window, q.device))
    return masked_attention(q, k, v, allowed)


def aha_sdpa(q, k, v, gate: torch.Tensor, window: int) -> torch.Tensor:
    """Full causal SDPA for the (batch, head) slices with at least one gated row, blocked sliding-window SDPA
    for the slices with at least one local row, then each row takes its selected path (the other path's value
    is multiplied by 0, so it gets no gradient). q, k, v (B, H, T, d_h), gate (B, H, T) bool -> (B, H, T, d_h).
    """
    B, H, T, D = q.shape
    qf, kf, vf = (x.reshape(1, B * H, T, D) for x in (q, k, v))
    rows = gate.reshape(B * H, T)
    out = q.new_zeros(B * H, T, D)
    for selected, path in ((rows, causal_sdpa), (~rows, lambda *x: windowed_sdpa(*x, window))):
        idx = selected.any(-1).nonzero().squeeze(-1)
        if idx.numel() == 0:
            continue
        o = path(qf[:, idx], kf[:, idx], vf[:, idx])[0]
        out = out.index_add(0, idx, o * selected[idx, :, None].to(o.dtype))
    return out.view(B, H, T, D)


def aha_key_ranges(layout: Layout, count: int, gate: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache columns each of the ``count`` new columns (``layout.length ..``) reads: ``lo``, ``hi`` int32
    (B, H, T), inclusive. An open gate reads from its row's first real column, a closed one its last ``window``
    columns; a padding column (left of its row's start) reads only itself, as in
    :meth:`~neox_dar.standalone.cache.Layout.key_ok`. ``gate`` (B, H, T) bool."""
    cols = layout.columns(layout.length, count)  # (T,)
    start = layout.start[:, None, None]  # (B, 1, 1)
    first = torch.maximum(torch.where(gate, 0, cols - (window - 1)), start)
    lo = torch.where(cols >= start, first, cols)
    return lo.to(torch.int32), cols.to(torch.int32).expand_as(lo)


class SelectedPath(torch.autograd.Function):
    """The straight-through rule ``selected``: the heads' output ``o`` (B, H, T, d_h) unchanged; backward, ``o``'s
    gradient passed through and the router probabilities ``s`` (B, T, H) given ``(2g - 1) <dL/do, o>`` (``g``
    (B, T, H) bool, the gates), summed over d_h in ``o``'s dtype. Bit for bit the gradients of
    ``o * (1 + (2g - 1) (s - stop_grad(s)))`` (whose value is ``o``), without that product in the forward or the
    backward."""

    @staticmethod
    def forward(ctx, o: torch.Tensor, s: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(o, g)
        return o.view_as(o)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if not ctx.needs_input_grad[1]:  # a frozen router
            return grad, None, None
        o, g = ctx.saved_tensors
        dot = (grad * o).sum(-1).transpose(1, 2).float()  # (B, T, H)
        return grad, torch.where(g, dot, -dot), None


class AHAAttention(AHALayer, Attention):
    """AHA with ``attention.router`` (d -> H, no bias; ``init_method`` like ``query_key_value``), its cache and decode
    step from :class:`~neox_dar.standalone.aha.AHALayer`.

    After each forward: ``self.aux_tokens`` = ``aha_l1_coef * mean_h(s) / aha_layers`` (B, T) (the model's AHA
    layers), so the L1 term over the real positions is ``aha_l1_coef * mean(s)`` over them, layers and heads;
    ``self.stats["mu_f"]`` = mean gate per head over batch and tokens, shape (H,); ``self.token_stats["mu_f"]`` =
    the gate itself, (B, T, H) bool, which the evaluation averages over real (non-padding) positions only.
    """

    spec = AHASpec

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        a = cfg.attention
        self.l1_coef = a.aha_l1_coef
        self.ste = a.aha_ste
        self.router_init = a.aha_router_init
        _, self.aha_layers = layer_position(cfg, layer_idx)
        self.build_variant(a.window_size, a.aha_threshold)

    def init_new_parameters(self, inputs: torch.Tensor | None) -> None:
        """``aha_router_init: zeros``: the router starts at 0 (see the key's help for what step 0 then is)."""
        if self.router_init == "zeros":
            with torch.no_grad():
                self.router.weight.zero_()

    def routed(self, q, k, v, gate: torch.Tensor) -> torch.Tensor:
        """Each row through its gate's path on this module's ``attention_impl``; gate (B, H, T) bool."""
        impl = self.resolved_impl(q.device)
        if impl == "triton":  # reads the H_kv key/value heads directly
            return triton_kernels(q.device).aha_attention(q, k, v, gate.contiguous(), self.window)
        k, v = self.expand_kv(k, v)
        if impl == "reference":
            return aha_reference(q, k, v, gate, self.window)
        return aha_sdpa(q, k, v, gate, self.window)

    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        s = self.router_probs(a)  # (B, T, H)
        g = s > self.threshold
        gate = g.transpose(1, 2)  # (B, H, T)
        o = self.routed(q, k, v, gate)
        if self.ste == "selected":
            o = SelectedPath.apply(o, s, g)  # d/ds = (2g - 1) <dL/do, o>
        elif s.requires_grad:  # "difference": d/ds = (2g - 1) <dL/do, o - other> = <dL/do, Full - Local>
            with torch.no_grad():
                other = self.routed(q, k, v, ~gate)
            straight_through = ((2.0 * g.float() - 1.0) * (s - s.detach())).transpose(1, 2)[..., None]  # value 0
            o = o + (straight_through * (o.detach() - other)).to(o.dtype)
        self.aux_tokens = self.l1_coef * s.mean(-1) / self.aha_layers
        self.stats = {"mu_f": g.float().mean(dim=(0, 1)).detach()}
        self.token_stats = {"mu_f": g.detach()}
        return o

    # ---- inference: AHALayer's cache of every key (any later token may route a head to full attention) ----------
    def gate(self, a: torch.Tensor) -> torch.Tensor:
        """The gates of a decode step (:meth:`AHALayer.decode`), also its statistics: ``token_stats["mu_f"]`` the
        gates (B, T, H)."""
        g = super().gate(a)
        self.stats = {"mu_f": g.float().mean(dim=(0, 1))}
        self.token_stats = {"mu_f": g}
        return g

    def cache_attention(self, q, cache, k, v, gate: torch.Tensor) -> torch.Tensor:
        """On the ``triton`` path, one pass of the kernels' ``range_attention`` with each row's key range
        (:func:`aha_key_ranges`): no host synchronisation, no copy of the cache, the whole cache read only for the
        open gates; elsewhere the standalone layer's :func:`~neox_dar.standalone.aha.aha_attention`."""
        if self.resolved_impl(q.device) != "triton":
            return super().cache_attention(q, cache, k, v, gate)
        (group,) = cache.groups
        keys, _ = step_keys(group.ring, {"k": k, "v": v}, None)  # every column, slot = column
        lo, hi = aha_key_ranges(cache.layout, q.shape[2], gate, self.window)
        return triton_kernels(q.device).range_attention(q, keys["k"], keys["v"], lo, hi)

    def head_windows(self) -> list[int | None]:
        """The local path's window (the full path is extra: see :meth:`attended_keys`)."""
        return [self.window] * self.num_heads

    def attended_keys(self, seq_len: int) -> float:
        """Counted as if every gate were open (an upper bound); :meth:`cost_notes` gives the lower bound."""
        return (seq_len + 1) / 2

    def kv_cache_per_token(self, context: int) -> float:
        """Every key is kept: any token may route a head to full attention."""
        return 2.0 * self.num_kv_heads * self.head_dim

    def flop_notes(self, context: int) -> list[str]:
        local = 6 * 2 * self.num_heads * self.head_dim * super().attended_keys(context)
        return [f"AHA is counted as if every gate were open (upper bound); with every gate closed a layer's "
                f"attention term is {local:.4g}; with a full-attention share mu_f: mu_f * upper + (1 - mu_f) * lower"]

    def cache_notes(self, context: int) -> list[str]:
        return ["(every key is kept: any token may route a head to full attention)"]
