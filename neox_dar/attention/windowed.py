"""Sliding-window attention with PyTorch's ``scaled_dot_product_attention``, in O(T * w) time and memory.

Queries are cut into blocks of ``bs >= w`` rows; block ``n`` (queries ``n*bs .. n*bs+bs-1``) can only see keys
``n*bs - (w-1) .. n*bs+bs-1``, so each block attends to ``bs + w - 1`` gathered keys under one small boolean
mask that is the same for every block (except that the first block must not see the left padding). One SDPA
call covers all blocks, heads and batch rows. Window convention: key ``j`` is inside when ``0 <= i - j < w``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .masks import window_mask

MIN_BLOCK = 64  # smallest query block: tiny windows still get GPU-sized blocks


def mean_attended_keys(seq_len: int, window: int | None) -> float:
    """Mean over queries ``i = 0..T-1`` of the keys a window of size ``window`` holds: ``min(i + 1, w)``.

    ``window=None`` (or ``>= T``) is causal attention, ``(T + 1) / 2``.
    """
    T = seq_len
    if window is None or window >= T:
        return (T + 1) / 2
    # i + 1 for i < w (sum w (w + 1) / 2), then w for the other T - w queries
    return (window * (window + 1) / 2 + (T - window) * window) / T


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention, (B, H, T, d_h) -> (B, H, T, d_h) (FlashAttention on CUDA)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def windowed_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                  min_block: int = MIN_BLOCK) -> torch.Tensor:
    """Sliding-window attention, keys ``j <= i`` with ``i - j < window``; q, k, v (B, H, T, d_h) -> (B, H, T, d_h).

    ``window >= T`` is causal attention. ``min_block`` sets the smallest query block (tests use 1 to exercise
    many blocks at small T).
    """
    if window < 1:
        raise ValueError(f"windowed_sdpa needs window >= 1, got {window}")
    B, H, T, D = q.shape
    if window >= T:
        return causal_sdpa(q, k, v)
    bs = max(window, min_block)
    if bs >= T:  # one block: a (T, T) band mask is as small as the blocked layout
        return F.scaled_dot_product_attention(q, k, v, attn_mask=window_mask(T, window, q.device))
    nb = math.ceil(T / bs)
    halo = window - 1
    span = bs + halo  # keys one block can see
    pad_end = nb * bs - T

    def blocks_of_keys(x: torch.Tensor) -> torch.Tensor:  # (B, H, T, D) -> (B*H, nb, span, D)
        xp = F.pad(x, (0, 0, halo, pad_end))
        return xp.unfold(2, span, bs).transpose(-1, -2).reshape(B * H, nb, span, D)

    qb = F.pad(q, (0, 0, 0, pad_end)).reshape(B * H, nb, bs, D)
    r = torch.arange(bs, device=q.device)[:, None]  # query row inside the block
    s = torch.arange(span, device=q.device)[None, :]  # key slot; key position = n*bs - halo + s
    delta = r + halo - s  # i - j
    band = (delta >= 0) & (delta < window)
    mask = band.expand(nb, bs, span).clone()
    mask[0] &= s >= halo  # block 0: slots left of position 0 are padding
    out = F.scaled_dot_product_attention(qb, blocks_of_keys(k), blocks_of_keys(v), attn_mask=mask[None])
    return out.reshape(B, H, nb * bs, D)[:, :, :T]
