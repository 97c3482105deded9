"""Distance-adaptive representation (DAR) and its ``uniform`` baseline (DAR with ``w = 0``).

Per layer two bias-free linears, ``dar_down`` (d -> d_down) and ``dar_up`` (d_down -> d), give the
bottlenecked input ``h' = dar_up(dar_down(a))``. The local keys/values come from ``a`` and the global ones
from ``h'``, both through the layer's own ``query_key_value`` (bias included); rotary applies to ``q``,
``k_loc`` and ``k_glob`` at their own positions. Pair ``(i, j)`` uses ``k_loc[j], v_loc[j]`` when
``i - j < w`` and ``k_glob[j], v_glob[j]`` otherwise, under one softmax over all ``j <= i``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import Config
from .base import Attention, apply_rotary
from .masks import window_mask
from .triton_bridge import triton_kernel


def dar_masks(seq_len: int, window: int, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean (T, T) masks ``(near, far)``: ``near`` = causal and ``i - j < w``, ``far`` = causal, ``i - j >= w``."""
    causal = window_mask(seq_len, None, device)
    near = window_mask(seq_len, window, device)
    return near, causal & ~near


def dar_reference(q, k_loc, v_loc, k_glob, v_glob, window: int) -> torch.Tensor:
    """DAR attention by explicit per-pair source selection in float32; inputs (B, H, T, d_h) -> (B, H, T, d_h)."""
    T = q.shape[-2]
    near, far = dar_masks(T, window, q.device)
    qf = q.float()
    scale = 1.0 / math.sqrt(q.shape[-1])
    s_loc = (qf @ k_loc.float().transpose(-1, -2)) * scale
    s_glob = (qf @ k_glob.float().transpose(-1, -2)) * scale
    scores = torch.where(near, s_loc, s_glob).masked_fill(~(near | far), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = (probs * near) @ v_loc.float() + (probs * far) @ v_glob.float()
    return out.to(q.dtype)


def dar_sdpa(q, k_loc, v_loc, k_glob, v_glob, window: int) -> torch.Tensor:
    """DAR attention as one SDPA call over the concatenated keys ``[k_loc; k_glob]`` (B, H, 2T, d_h).

    The (T, 2T) boolean mask lets pair ``(i, j)`` through the near half when ``i - j < w`` and through the
    far half otherwise, so each pair is scored exactly once. ``w = 0`` (uniform) is plain causal SDPA on the
    global keys. Memory O(T) per head on CUDA (memory-efficient kernel); the mask is shared by all heads.
    """
    if window == 0:
        return F.scaled_dot_product_attention(q, k_glob, v_glob, is_causal=True)
    near, far = dar_masks(q.shape[-2], window, q.device)
    k = torch.cat((k_loc, k_glob), dim=-2)
    v = torch.cat((v_loc, v_glob), dim=-2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.cat((near, far), dim=-1))


class DARAttention(Attention):
    """DAR (``attention_type: dar``, window ``window_size``) or uniform (``attention_type: uniform``, ``w = 0``).

    Parameters beyond vanilla: ``dar_down.weight`` (d_down, d) and ``dar_up.weight`` (d, d_down), no biases.
    They are input-side matrices, so ``init_weights`` gives them ``init_method`` (small_init) like
    ``query_key_value``.
    """

    def __init__(self, cfg: Config, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.window = 0 if cfg.attention_type == "uniform" else cfg.window_size
        self.hidden_size = cfg.hidden_size
        self.dar_down = nn.Linear(cfg.hidden_size, cfg.d_down, bias=False)
        self.dar_up = nn.Linear(cfg.d_down, cfg.hidden_size, bias=False)

    def global_kv(self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``k_glob`` (rotary applied) and ``v_glob``, each (B, H, T, d_h), from ``h' = dar_up(dar_down(a))``.

        Only the key and value rows of ``query_key_value`` are applied (the global query is never used).
        """
        B, T, _ = a.shape
        H, D = self.num_heads, self.head_dim
        h2 = self.dar_up(self.dar_down(a))
        # HF fused layout: output rows grouped per head as [q (D), k (D), v (D)]
        w = self.query_key_value.weight.view(H, 3, D, self.hidden_size)[:, 1:].reshape(2 * H * D, self.hidden_size)
        b = self.query_key_value.bias.view(H, 3, D)[:, 1:].reshape(2 * H * D)
        kv = F.linear(h2, w, b).view(B, T, H, 2 * D).transpose(1, 2)
        k_glob, v_glob = kv.chunk(2, dim=-1)
        return apply_rotary(k_glob, cos, sin), v_glob

    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        k_glob, v_glob = self.global_kv(a, cos, sin)
        impl = self.resolved_impl(q.device)
        if impl == "reference":
            return dar_reference(q, k, v, k_glob, v_glob, self.window)
        if impl == "triton":
            return triton_kernel("dar_attention", q.device)(q, k, v, k_glob, v_glob, self.window)
        return dar_sdpa(q, k, v, k_glob, v_glob, self.window)

    def extra_flops_per_token(self) -> float:
        """The second pass through ``query_key_value`` for ``k_glob, v_glob``: a (2d x d) product, 2 FLOPs per
        multiply-add, ``4 d^2`` forward, ``x3`` for forward + backward = ``12 d^2``. (``dar_down``/``dar_up``
        are used once per token and are already in ``6 N``; each (i, j) pair is scored once, so the attention
        term is vanilla's.)"""
        return 3.0 * 2.0 * (2 * self.hidden_size) * self.hidden_size
