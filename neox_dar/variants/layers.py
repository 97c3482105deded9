"""Per-layer attention types: which variant each layer runs, and how a model that mixes variants reads.

A config gives every layer one variant (``attention_type``) or each layer its own: ``attention_config`` in
GPT-NeoX's form ``[[[types...], repeat], ...]`` (each entry's types repeated ``repeat`` times, in order), or
``hybrid``, the MSWA paper's Sec. 4.4 stack (:func:`hybrid_attention_config`). Loading resolves the names
(GPT-NeoX's ``global``/``flash`` are ``vanilla``, ``local`` is ``swa``), drops a per-layer list that names one type
(``attention_type`` says it), and sets a mixed model's ``attention_type`` to its types joined by ``+`` in order of
first use (``linear+mswa``): the name runs, sweeps and reports know it by (:func:`resolve_layout`, which the config
calls). :func:`mixed_variant` is the spec that describes such a model; it is never built (each layer builds its own
variant). Torch-free, like the specs.
"""

from __future__ import annotations

import difflib
import functools

from ..config_fields import InvalidValue, check
from .registry import generation, variant, variants
from .spec import ModelConfig, VariantSpec


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


def resolve_layout(m: ModelConfig, explicit_type: bool) -> None:
    """Resolve ``m.attention``'s per-layer types in place: ``hybrid`` sets ``attention_config``; GPT-NeoX names
    become ours (global, flash -> vanilla; local -> swa); a list of one type leaves ``attention_type`` alone to say
    it; a mix sets ``attention_type`` to its types joined by '+'. An ``attention_type`` set alongside
    (``explicit_type``) must name one of the types (or be that joined name). Raises InvalidValue."""
    a = m.attention
    given = None if a.attention_config is None else [[list(types), repeat] for types, repeat in a.attention_config]
    if a.hybrid is not None:
        layout = hybrid_attention_config(a.hybrid, m.num_layers)
        check(layout is not None, "hybrid", f"needs num_layers divisible by 12 for four groups of L/12 linear and "
              f"L/6 local layers, not {m.num_layers}; write attention_config for other layouts", a.hybrid)
        check(given in (None, layout), "attention_config", f"differs from hybrid '{a.hybrid}''s layers {layout}; "
              "set one of the two", given)
        given = layout
    if given is None:
        return
    check(all(types and repeat >= 1 for types, repeat in given), "attention_config",
          "each entry must be [[types...], repeat] with at least one type and repeat >= 1", given)
    for name in dict.fromkeys(expand(given)):
        if name not in variants() and name not in NEOX_TYPES:
            names = [*variants(), *NEOX_TYPES]
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            raise InvalidValue("attention_config", f"not an attention type: choose from {', '.join(names)}"
                               + (f"; did you mean '{close[0]}'?" if close else ""), name)
    layout = [[[NEOX_TYPES.get(t, t) for t in types], repeat] for types, repeat in given]
    types = expand(layout)
    check(len(types) == m.num_layers, "attention_config", f"gives {len(types)} layers but num_layers is "
          f"{m.num_layers}", given)
    used = list(dict.fromkeys(types))
    name = used[0] if len(used) == 1 else combined_name(types)
    if explicit_type:
        check(a.attention_type in (*used, name), "attention_type", f"conflicts with attention_config, whose layers "
              f"use {', '.join(used)}: leave it unset or name one of them", a.attention_type)
    a.attention_type = name
    a.attention_config = layout if len(used) > 1 else None


def mixed_variant(name: str) -> type[VariantSpec]:
    """The class describing a model whose layers run the variants of ``name`` (``linear+mswa``): its summary,
    label and description combine theirs, its statistics are all of theirs. KeyError for an unregistered part."""
    return _mixed(name, generation())


@functools.lru_cache(maxsize=None)
def _mixed(name: str, _generation: int) -> type[VariantSpec]:
    parts = [variant(part) for part in name.split("+")]

    class Mixed(VariantSpec):
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
