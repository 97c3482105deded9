"""Multi-scale window attention (MSWA): a window per layer and head (SPEC, MSWA paper Sec. 4 and Table 1).

Layer ``l`` of ``L`` is in layer group ``g = floor(4 l / L)`` and head ``h`` of ``H`` in head group
``c = floor(4 h / H)``; the window is ``w * 2^(g-2) * 2^(c-2)`` floored, at least 1 (``full``), or
``w * 2^(c-2)`` (``heads``, MSWA-h), or ``w * 2^(g-2)`` (``layers``, MSWA-l). ``mswa_windows`` in the
config overrides the rule with an explicit table.
"""

from __future__ import annotations

import warnings

import torch

from ..config import Config
from .base import Attention
from .masks import masked_attention, window_mask
from .triton_bridge import triton_kernel
from .windowed import mean_attended_keys, windowed_sdpa


def scaled_window(base: int, exponent: int) -> int:
    """``floor(base * 2^exponent)``, at least 1, in exact integer arithmetic."""
    w = base << exponent if exponent >= 0 else base >> -exponent
    return max(1, w)


def mswa_window_table(cfg: Config, warn: bool = False) -> list[list[int]]:
    """The (num_layers x num_attention_heads) window table for ``cfg`` (rule above, or ``mswa_windows``).

    With ``warn=True``, says once when the layers or heads do not split into four equal groups.
    """
    L, H, w = cfg.num_layers, cfg.num_attention_heads, cfg.window_size
    if cfg.mswa_windows is not None:
        return [list(row) for row in cfg.mswa_windows]
    uneven = [f"{name}={n}" for name, n, used in (("num_attention_heads", H, cfg.mswa_variant != "layers"),
                                                   ("num_layers", L, cfg.mswa_variant != "heads")) if used and n % 4]
    if warn and uneven:
        warnings.warn(f"MSWA: {' and '.join(uneven)} not divisible by 4; using the floor rule g = floor(4 l / L), "
                      f"c = floor(4 h / H), so the four groups have unequal sizes", stacklevel=3)
    table = []
    for layer in range(L):
        g = (4 * layer) // L if cfg.mswa_variant != "heads" else 2
        row = []
        for head in range(H):
            c = (4 * head) // H if cfg.mswa_variant != "layers" else 2
            row.append(scaled_window(w, (g - 2) + (c - 2)))
        table.append(row)
    return table


class MSWAAttention(Attention):
    """Sliding-window attention with one window per head (this layer's row of :func:`mswa_window_table`).

    ``reference``: explicit per-head (H, T, T) band mask. ``sdpa``: heads grouped by window, one blocked
    SDPA call per distinct window (:mod:`.windowed`). ``triton``: ``kernels.mswa_attention``.
    """

    def __init__(self, cfg: Config, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.windows: list[int] = mswa_window_table(cfg, warn=layer_idx == 0)[layer_idx]

    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        impl = self.resolved_impl(q.device)
        T = q.shape[-2]
        if impl == "reference":
            allowed = torch.stack([window_mask(T, w, q.device) for w in self.windows])  # (H, T, T)
            return masked_attention(q, k, v, allowed)
        if impl == "triton":
            windows = torch.tensor(self.windows)  # on the CPU: the kernel reads it without a device sync
            return triton_kernel("mswa_attention", q.device)(q, k, v, windows)
        out = torch.empty_like(q)
        for w in sorted(set(self.windows)):
            heads = torch.tensor([h for h, hw in enumerate(self.windows) if hw == w], device=q.device)
            out[:, heads] = windowed_sdpa(q[:, heads], k[:, heads], v[:, heads], w)
        return out

    def attended_keys(self, seq_len: int) -> float:
        return sum(mean_attended_keys(seq_len, w) for w in self.windows) / len(self.windows)
