"""Multi-scale window attention (MSWA), the spec of :mod:`neox_dar.attention.mswa`: a window per layer and head
("MSWA: Refining Local Attention with Multi-Scale Window Attention", Sec. 4, Table 1 and Sec. 4.4).

The paper's Table 1 intervals, read with 1-based indices: of the ``L`` MSWA layers, layer ``i`` (1..L) is in layer
group ``g = ceil(4 i / L) - 1``; of the ``H`` heads, head ``j`` (1..H) in head group ``c = ceil(4 j / H) - 1``. The
window is ``w * 2^(g-2) * 2^(c-2)`` floored, at least 1 (``mswa_variant: full``), ``w * 2^(c-2)`` (``heads``,
MSWA-h) or ``w * 2^(g-2)`` (``layers``, MSWA-l). In a model that mixes layer types (``attention_config``), ``L``
counts the MSWA layers only and ``i`` is a layer's place among them (Sec. 4.4). Table 6's ablations:
``mswa_layer_order: decreasing`` reverses the layer groups (layer ``i`` takes the group of layer ``L + 1 - i``, so the
two orders have the same window budget for any ``L``), ``mswa_progression: arithmetic`` the factors
``(2 + g) / 4`` and ``(2 + c) / 4`` (``w/2, 3w/4, w, 5w/4``) instead of the powers of 2. ``mswa_windows`` in the
config overrides the rule with an explicit table.
"""

from __future__ import annotations

import warnings
from typing import Literal, Optional

from ..config_fields import Key
from ..notices import Notice
from .layers import layer_types
from .spec import ModelConfig, VariantSpec


IDENTITY_GROUP = 2  # the group whose factor is 1 (w itself): the fixed group of the axis a variant does not vary


def group(index: int, n: int) -> int:
    """Table 1's group of the 1-based ``index`` of ``n``: ``ceil(4 index / n) - 1``, in 0..3."""
    return -(-4 * index // n) - 1


def window(w: int, g: int, c: int, progression: str) -> int:
    """The window of layer group ``g`` and head group ``c``, floored, at least 1, in exact integer arithmetic:
    ``w * 2^(g-2) * 2^(c-2)`` (geometric) or ``w * (2+g)/4 * (2+c)/4`` (arithmetic)."""
    if progression == "arithmetic":
        return max(1, w * (2 + g) * (2 + c) // 16)
    e = g + c - 2 * IDENTITY_GROUP
    return max(1, w << e if e >= 0 else w >> -e)


def mswa_layers(cfg: ModelConfig) -> list[int]:
    """The model's MSWA layers (indices), in order: the rows of :func:`mswa_window_table`."""
    return [i for i, t in enumerate(layer_types(cfg)) if t == "mswa"]


def mswa_window_table(cfg: ModelConfig, warn: bool = False) -> list[list[int]]:
    """The (MSWA layers x num_attention_heads) window table for ``cfg`` (rule above, or ``mswa_windows``).

    With ``warn=True``, says once when the layers or heads do not split into four equal groups.
    """
    a = cfg.attention
    L, H, w = len(mswa_layers(cfg)), cfg.num_attention_heads, a.window_size
    if a.mswa_windows is not None:
        return [list(row) for row in a.mswa_windows]
    vary_layers, vary_heads = a.mswa_variant != "heads", a.mswa_variant != "layers"
    uneven = [(what, n) for what, n, used in (("MSWA layers", L, vary_layers),
                                               ("num_attention_heads", H, vary_heads)) if used and n % 4]
    if warn and uneven:
        warnings.warn("MSWA: " + "; ".join(
            f"{what}={n} is not divisible by 4, so the 1-based intervals ceil(4 i / n) - 1 give groups "
            f"{','.join(str(group(i, n)) for i in range(1, n + 1))} (unequal sizes)" for what, n in uneven),
            Notice, stacklevel=3)
    table = []
    for i in range(1, L + 1):
        # Table 6's "decreasing": the layer allocation reversed (the group of layer L + 1 - i), which changes the
        # order and nothing else; ``3 - g`` would not be a reversal when L is not divisible by 4 (6 layers:
        # 3,2,2,1,0,0 against the reversed 3,3,2,1,1,0, another window budget)
        source = L + 1 - i if a.mswa_layer_order == "decreasing" else i
        g = group(source, L) if vary_layers else IDENTITY_GROUP
        table.append([window(w, g, group(j, H) if vary_heads else IDENTITY_GROUP, a.mswa_progression)
                      for j in range(1, H + 1)])
    return table


def window_budget(cfg: ModelConfig) -> float:
    """The summed window of the MSWA layers relative to SWA's at the same ``w`` (``L H w``): the paper's resource
    measure (Eqs. 8-11; 15/16 * 15/16 = 0.879 for the full rule when L and H divide by 4)."""
    table = mswa_window_table(cfg)
    return sum(map(sum, table)) / (len(table) * cfg.num_attention_heads * cfg.attention.window_size)


def table_rule(table: list[list[int]], cfg: ModelConfig) -> str | None:
    """What an explicit ``mswa_windows`` table must be, when it is not."""
    L = len(mswa_layers(cfg)) or cfg.num_layers
    if len(table) != L or any(len(row) != cfg.num_attention_heads for row in table):
        return (f"must be a table of {L} rows (one per MSWA layer) of num_attention_heads={cfg.num_attention_heads} "
                "windows")
    if any(w < 1 for row in table for w in row):
        return "every window must be >= 1"
    return None


class MSWASpec(VariantSpec):
    """``attention_type: mswa``: sliding-window attention with one window per head and layer
    (:func:`mswa_window_table`)."""

    kernels = True
    name = "mswa"
    what = "multi-scale windows per layer and head"
    keys = {
        "mswa_variant": Key(Literal["full", "heads", "layers"], "full", "MSWA: vary windows over heads and layers, "
                            "heads only, or layers only.", label="mswa-"),
        "mswa_layer_order": Key(Literal["increasing", "decreasing"], "increasing", "MSWA: layer windows grow with "
                                "depth (the paper) or shrink (Table 6 ablation).", label="order-"),
        "mswa_progression": Key(Literal["geometric", "arithmetic"], "geometric", "MSWA: group factors 1/4, 1/2, 1, 2 "
                                "(the paper) or 1/2, 3/4, 1, 5/4 (Table 6 ablation: 64, 96, 128, 160 at w=128).",
                                label="prog-"),
        "mswa_windows": Key(Optional[list[list[int]]], None, "MSWA explicit window table [MSWA layers]"
                            "[num_attention_heads]; overrides the rule.", rule=table_rule),
    }
    reads = ("window_size",)
    module_path = "neox_dar.attention.mswa:MSWAAttention"

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        cls.require_window(cfg)
        smallest = min(w for row in mswa_window_table(cfg) for w in row)
        if smallest >= cfg.seq_length:
            warnings.warn(f"every MSWA window (the smallest is {smallest}, base window_size="
                          f"{cfg.attention.window_size}) is >= seq_length={cfg.seq_length}, so this is vanilla "
                          "attention", Notice, stacklevel=6)

    @classmethod
    def summary(cls, cfg: ModelConfig) -> str:
        a = cfg.attention
        ablations = [v for v, default in ((a.mswa_variant, "full"), (a.mswa_layer_order, "increasing"),
                                          (a.mswa_progression, "geometric")) if v != default]
        return f"{cls.name} w={a.window_size}" + (f" ({', '.join(ablations)})" if ablations else "")

    @classmethod
    def label(cls, cfg: ModelConfig) -> str:
        a = cfg.attention
        return "-".join([cls.name] + [v for v, default in ((a.mswa_variant, "full"), (a.mswa_layer_order, "increasing"),
                                                           (a.mswa_progression, "geometric")) if v != default])

    @classmethod
    def describe(cls, cfg: ModelConfig) -> list[str]:
        a = cfg.attention
        source = ("explicit mswa_windows" if a.mswa_windows is not None else
                  f"rule: variant {a.mswa_variant}, {a.mswa_layer_order} over layers, {a.mswa_progression}")
        lines = [f"windows per layer (rows) and head (columns), base w={a.window_size} ({source}):"]
        for layer, row in zip(mswa_layers(cfg), mswa_window_table(cfg)):
            lines.append(f"  layer {layer:>2}: " + " ".join(f"{w:>5}" for w in row))
        lines.append(f"window budget: {window_budget(cfg):.3f} x SWA's at w={a.window_size} (summed windows / "
                     f"(MSWA layers x heads x w))")
        return lines
