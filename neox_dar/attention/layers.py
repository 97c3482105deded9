"""Per-layer attention types: which variant each layer runs, and how a model that mixes variants reads.

A config gives every layer one variant (``attention_type``) or each layer its own: ``attention_config`` in
GPT-NeoX's form ``[[[types...], repeat], ...]`` (each entry's types repeated ``repeat`` times, in order), or
``hybrid``, the MSWA paper's Sec. 4.4 stack (:func:`hybrid_attention_config`). Loading resolves the names
(GPT-NeoX's ``global``/``flash`` are ``vanilla``, ``local`` is ``swa``), drops a per-layer list that names one type
(``attention_type`` says it), and sets a mixed model's ``attention_type`` to its types joined by ``+`` in order of
first use (``linear+mswa``): the name runs, sweeps and reports know it by. :func:`mixed_variant` is the class that
describes such a model; it is never built (each layer builds its own variant).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from .base import Attention
from .registry import generation, variant

if TYPE_CHECKING:
    from ..config import ModelConfig

NEOX_TYPES = {"global": "vanilla", "flash": "vanilla", "local": "swa"}  # GPT-NeoX's names of our variants
HYBRID_LOCAL = {"mswa_linear": "mswa", "swa_linear": "swa"}  # hybrid -> its local-attention variant


def expand(attention_config: list) -> list[str]:
    """GPT-NeoX's ``[[[types...], repeat], ...]`` -> one type per layer."""
    return [t for types, repeat in attention_config for _ in range(repeat) for t in types]


def layer_types(cfg: ModelConfig) -> list[str]:
    """The variant name of each layer of a loaded (resolved) config."""
    a = cfg.attention
    return [a.attention_type] * cfg.num_layers if a.attention_config is None else expand(a.attention_config)


def layer_position(cfg: ModelConfig, layer_idx: int) -> tuple[int, int]:
    """``(position, count)``: layer ``layer_idx`` is the ``position``-th (0-based) of the ``count`` layers of its
    variant (MSWA's window table runs over the MSWA layers only)."""
    types = layer_types(cfg)
    same = [i for i, t in enumerate(types) if t == types[layer_idx]]
    return same.index(layer_idx), len(same)


def hybrid_attention_config(hybrid: str, num_layers: int) -> list | None:
    """The MSWA paper's hybrid (Sec. 4.4): the ``L`` layers in four equal groups, each ``L/12`` linear-attention
    layers then ``L/6`` layers of the local variant (``mswa_linear``: mswa, ``swa_linear``: swa). None when ``L``
    is not a multiple of 12."""
    if num_layers % 12:
        return None
    n = num_layers // 12
    return [[["linear"] * n + [HYBRID_LOCAL[hybrid]] * (2 * n), 4]]


def combined_name(types: list[str]) -> str:
    """The distinct types in order of first use, joined by ``+`` (``linear+mswa``)."""
    return "+".join(dict.fromkeys(types))


def pattern(types: list[str]) -> str:
    """The layer types compactly: the shortest unit that repeats, ``[linear, mswa, mswa] x 4``."""
    n = len(types)
    period = next(p for p in range(1, n + 1) if n % p == 0 and types == types[:p] * (n // p))
    unit = f"[{', '.join(types[:period])}]"
    return unit if period == n else f"{unit} x {n // period}"


def mixed_variant(name: str) -> type[Attention]:
    """The class describing a model whose layers run the variants of ``name`` (``linear+mswa``): its summary,
    label and description combine theirs, its statistics are all of theirs. KeyError for an unregistered part."""
    return _mixed(name, generation())


@functools.lru_cache(maxsize=None)
def _mixed(name: str, _generation: int) -> type[Attention]:
    parts = [variant(part) for part in name.split("+")]

    class Mixed(Attention):
        """Layers of several variants (``attention_config``): descriptions only; each layer builds its own."""

        stats = {stat: meaning for cls in parts for stat, meaning in cls.stats.items()}

        @classmethod
        def summary(cls, cfg: ModelConfig) -> str:
            return f"{pattern(layer_types(cfg))}: " + "; ".join(part.summary(cfg) for part in parts)

        @classmethod
        def label(cls, cfg: ModelConfig) -> str:
            return "+".join(part.label(cfg) for part in parts)

        @classmethod
        def describe(cls, cfg: ModelConfig) -> list[str]:
            lines = [f"layers: {pattern(layer_types(cfg))}"]
            for part in parts:
                lines += [f"{part.name}:"] + [f"  {line}" for line in part.describe(cfg)]
            return lines

    Mixed.name = name
    Mixed.__name__ = Mixed.__qualname__ = f"Mixed[{name}]"
    return Mixed
