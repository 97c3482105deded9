"""Multi-scale window attention (MSWA): a window per layer and head ("MSWA: Refining Local Attention with
Multi-Scale Window Attention", Sec. 4 and Table 1).

Layer ``l`` of ``L`` is in layer group ``g = floor(4 l / L)`` and head ``h`` of ``H`` in head group
``c = floor(4 h / H)``; the window is ``w * 2^(g-2) * 2^(c-2)`` floored, at least 1 (``full``), or
``w * 2^(c-2)`` (``heads``, MSWA-h), or ``w * 2^(g-2)`` (``layers``, MSWA-l). ``mswa_windows`` in the
config overrides the rule with an explicit table.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Literal, Optional

import torch

from ..config.fields import Key
from .base import Attention
from .masks import masked_attention, window_mask
from .triton_bridge import triton_kernel
from .windowed import windowed_sdpa

if TYPE_CHECKING:
    from ..config import ModelConfig


def scaled_window(base: int, exponent: int) -> int:
    """``floor(base * 2^exponent)``, at least 1, in exact integer arithmetic."""
    w = base << exponent if exponent >= 0 else base >> -exponent
    return max(1, w)


def mswa_window_table(cfg: ModelConfig, warn: bool = False) -> list[list[int]]:
    """The (num_layers x num_attention_heads) window table for ``cfg`` (rule above, or ``mswa_windows``).

    With ``warn=True``, says once when the layers or heads do not split into four equal groups.
    """
    a = cfg.attention
    L, H, w = cfg.num_layers, cfg.num_attention_heads, a.window_size
    if a.mswa_windows is not None:
        return [list(row) for row in a.mswa_windows]
    uneven = [f"{name}={n}" for name, n, used in (("num_attention_heads", H, a.mswa_variant != "layers"),
                                                   ("num_layers", L, a.mswa_variant != "heads")) if used and n % 4]
    if warn and uneven:
        warnings.warn(f"MSWA: {' and '.join(uneven)} not divisible by 4; using the floor rule g = floor(4 l / L), "
                      f"c = floor(4 h / H), so the four groups have unequal sizes", stacklevel=3)
    table = []
    for layer in range(L):
        g = (4 * layer) // L if a.mswa_variant != "heads" else 2
        row = []
        for head in range(H):
            c = (4 * head) // H if a.mswa_variant != "layers" else 2
            row.append(scaled_window(w, (g - 2) + (c - 2)))
        table.append(row)
    return table


def table_rule(table: list[list[int]], cfg: ModelConfig) -> str | None:
    """What an explicit ``mswa_windows`` table must be, when it is not."""
    if len(table) != cfg.num_layers or any(len(row) != cfg.num_attention_heads for row in table):
        return (f"must be a table of num_layers={cfg.num_layers} rows of num_attention_heads={cfg.num_attention_heads} "
                "windows")
    if any(w < 1 for row in table for w in row):
        return "every window must be >= 1"
    return None


class MSWAAttention(Attention):
    """Sliding-window attention with one window per head (this layer's row of :func:`mswa_window_table`).

    ``reference``: explicit per-head (H, T, T) band mask. ``sdpa``: heads grouped by window, one blocked
    SDPA call per distinct window (:mod:`.windowed`). ``triton``: ``kernels.mswa_attention``.
    """

    name = "mswa"
    keys = {
        "mswa_variant": Key(Literal["full", "heads", "layers"], "full", "MSWA: vary windows over heads and layers, "
                            "heads only, or layers only.", label="mswa-"),
        "mswa_windows": Key(Optional[list[list[int]]], None, "MSWA explicit window table "
                            "[num_layers][num_attention_heads]; overrides the rule.", rule=table_rule),
    }
    reads = ("window_size",)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        cls.require_window(cfg)

    @classmethod
    def summary(cls, cfg: ModelConfig) -> str:
        a = cfg.attention
        return f"{cls.name} w={a.window_size}" + (f" ({a.mswa_variant})" if a.mswa_variant != "full" else "")

    @classmethod
    def label(cls, cfg: ModelConfig) -> str:
        a = cfg.attention
        return cls.name + (f"-{a.mswa_variant}" if a.mswa_variant != "full" else "")

    @classmethod
    def describe(cls, cfg: ModelConfig) -> list[str]:
        a = cfg.attention
        source = "explicit mswa_windows" if a.mswa_windows is not None else f"rule, variant '{a.mswa_variant}'"
        lines = [f"windows per layer (rows) and head (columns), base w={a.window_size} ({source}):"]
        for layer, row in enumerate(mswa_window_table(cfg)):
            lines.append(f"  layer {layer:>2}: " + " ".join(f"{w:>5}" for w in row))
        return lines

    def __init__(self, cfg: ModelConfig, layer_idx: int):
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

    def head_windows(self) -> list[int | None]:
        return list(self.windows)
