"""All-or-here attention (AHA) at inference: layer type ``aha``. Per new token and head the router's gate
(``sigmoid(router(a)) > threshold``) chooses full causal attention or the last ``window`` keys; the cache is a
:class:`~.cache.WindowedKV` of every column (a later token may route any head to full attention), read by
:func:`aha_attention`: the last ``w`` columns for every head, the whole cache only for the (row, key/value head)
pairs with an open gate. Plain PyTorch (the package's rule, :mod:`neox_dar.standalone`)."""

from __future__ import annotations

import torch
from torch import nn

from .attention import AttentionLayer
from .cache import NO_WINDOW, WindowedKV, grouped_attention, step_keys, window_allowed


def aha_attention(q: torch.Tensor, kv: WindowedKV, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor,
                  window: int, scale: float) -> torch.Tensor:
    """AHA over the cache ``kv`` of every column: query head ``h`` of new token ``t`` attends to every earlier key
    when ``gate[b, h, t]`` else to its last ``window`` keys. The local path reads the last ``window`` columns for
    all heads; the full path reads the whole cache only for the (row, key/value head) pairs with an open gate.
    q (B, H, T, d), k, v (B, H_kv, T, d) rotated, gate (B, H, T) bool -> (B, H, T, d)."""
    (group,) = kv.groups
    layout = kv.layout
    n, T = layout.length, q.shape[2]
    keys, kcols = step_keys(group.ring, {"k": k, "v": v}, None)  # every column, slot = column
    qcols = layout.columns(n, T)
    lo = max(0, n - window + 1)
    local = grouped_attention(q, keys["k"][:, :, lo:], keys["v"][:, :, lo:],
                              window_allowed(layout, qcols, kcols[lo:], qcols.new_tensor([window])), scale)
    B, H, _, D = q.shape
    Hk = k.shape[1]
    b, g = gate.reshape(B, Hk, -1).any(-1).nonzero(as_tuple=True)  # pairs whose full cache is read
    if b.numel() == 0:
        return local
    allowed = window_allowed(layout, qcols, kcols, qcols.new_tensor([NO_WINDOW]))
    full = torch.zeros_like(local)
    full.view(B, Hk, H // Hk, T, D)[b, g] = grouped_attention(
        q.view(B, Hk, H // Hk, T, D)[b, g], keys["k"][b, g][:, None], keys["v"][b, g][:, None],
        allowed[b] if allowed.shape[0] > 1 else allowed, scale)
    return torch.where(gate[..., None], full, local)


class AHALayer(AttentionLayer):
    """AHA's parameter beyond the projections: ``router`` (d -> H, no bias)."""

    layer_type = "aha"

    def build_variant(self, window: int, threshold: float) -> None:
        """``window``: the local path's keys; ``threshold``: the gate's (``aha_threshold``)."""
        self.window, self.threshold = window, threshold
        self.router = nn.Linear(self.hidden_size, self.num_heads, bias=False)

    def export_spec(self) -> dict:
        return {"type": self.layer_type, "window": self.window, "threshold": self.threshold}

    def router_probs(self, a: torch.Tensor) -> torch.Tensor:
        """``s = sigmoid(router(a))`` (B, T, H) of the attention input ``a`` (B, T, d), in float32 so the threshold
        is exact."""
        return torch.sigmoid(self.router(a).float())

    def gate(self, a: torch.Tensor) -> torch.Tensor:
        """(B, T, H) bool: the heads each new token routes to full attention."""
        return self.router_probs(a) > self.threshold

    def new_cache(self, layout, device: torch.device, dtype: torch.dtype) -> WindowedKV:
        return WindowedKV(layout, [None] * self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim, device,
                          dtype)

    def decode(self, a: torch.Tensor, cache: WindowedKV, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split_heads(a, cos, sin)
        gate = self.gate(a).transpose(1, 2)  # (B, H, T)
        return self.merge_heads(self.cache_attention(q, cache, k, v, gate))

    def cache_attention(self, q: torch.Tensor, cache: WindowedKV, k: torch.Tensor, v: torch.Tensor,
                        gate: torch.Tensor) -> torch.Tensor:
        """:func:`aha_attention` of the new columns over ``cache`` (stores ``k``, ``v``)."""
        return aha_attention(q, cache, k, v, gate, self.window, self.head_dim ** -0.5)
