"""Materialized masks and the reference attention they feed: obviously correct, O(T^2) memory."""

from __future__ import annotations

import math

import torch


def window_mask(seq_len: int, window: int | None, device: torch.device | None = None) -> torch.Tensor:
    """Boolean (T, T) mask, True where query ``i`` may attend key ``j``: ``j <= i`` and ``i - j < window``.

    ``window=None`` is plain causal attention. ``window=0`` allows nothing.
    """
    i = torch.arange(seq_len, device=device)[:, None]
    j = torch.arange(seq_len, device=device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed = allowed & (i - j < window)
    return allowed


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_h), masked) v with an explicit boolean mask.

    q, k, v: (B, H, T, d_h); ``allowed`` broadcasts to (B, H, T, T). A row with no allowed key yields zeros.
    Scores and softmax are computed in float32.
    """
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (probs @ v.float()).to(q.dtype)
