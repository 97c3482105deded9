"""The attention variants by ``attention_type`` name: their specs (:class:`~.spec.VariantSpec`). A variant is one
module plus one :func:`register` call.

The config (its keys and rules), the model, ``describe``, sweep naming, the report and the logs all read the
variants from here; no other module names one. Torch-free: a registered spec names its torch module, imported
when a model is built (:func:`module`).
"""

from __future__ import annotations

import keyword

from ..config_fields import Key
from .spec import VariantSpec

_VARIANTS: dict[str, type[VariantSpec]] = {}
_MODULES: dict[str, type] = {}  # name -> the module class of a variant registered as its module (a plug-in)
_generation = 0


def register(cls: type) -> type:
    """Add a variant: its spec (a :class:`~.spec.VariantSpec` subclass with a ``name`` and a ``module_path``), or
    the torch module that computes it (an :class:`~neox_dar.attention.base.Attention` subclass whose ``spec``
    attribute is its spec: a plug-in, whose class need not be importable by name); usable as a decorator. A name
    or key that another variant already defines differently is a ValueError."""
    global _generation
    spec = cls if isinstance(cls, type) and issubclass(cls, VariantSpec) else getattr(cls, "spec", None)
    if not (isinstance(spec, type) and issubclass(spec, VariantSpec)):
        raise TypeError(f"register() takes a VariantSpec subclass or a module class whose `spec` is one, got {cls!r}")
    name = spec.name
    if not name or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"attention variant {spec.__name__} needs a `name` that is a Python identifier, got {name!r}")
    if _VARIANTS.get(name, spec) is not spec:
        raise ValueError(f"attention_type '{name}' is already registered by {_VARIANTS[name].__qualname__}")
    for key, declared in spec.keys.items():
        for other in _VARIANTS.values():
            if other is not spec and other.keys.get(key, declared) != declared:
                raise ValueError(f"{spec.__qualname__} declares key '{key}' differently from {other.__qualname__}")
    _VARIANTS[name] = spec
    if spec is cls:
        _MODULES.pop(name, None)
    else:
        _MODULES[name] = cls
    _generation += 1
    return cls


def unregister(name: str) -> None:
    """Remove a variant (for tests that register their own)."""
    global _generation
    _VARIANTS.pop(name, None)
    _MODULES.pop(name, None)
    _generation += 1


def generation() -> int:
    """Changes whenever the registry does (the config schema is rebuilt then)."""
    return _generation


def variants() -> dict[str, type[VariantSpec]]:
    """Every registered variant, name -> spec, in registration order."""
    return dict(_VARIANTS)


def variant(name: str) -> type[VariantSpec]:
    """The spec registered as ``name``; KeyError naming the registered ones otherwise."""
    try:
        return _VARIANTS[name]
    except KeyError:
        raise KeyError(f"attention_type '{name}' is not registered (registered: {', '.join(_VARIANTS)})") from None


def module(name: str) -> type:
    """The torch module class that computes variant ``name``: the class it was registered as, or the one its spec's
    ``module_path`` names (imported now)."""
    return _MODULES.get(name) or variant(name).module()


def variant_keys() -> dict[str, tuple[Key, list[str]]]:
    """Every variant-specific config key -> (its :class:`Key`, the names of the variants that read it)."""
    out: dict[str, tuple[Key, list[str]]] = {}
    for cls in _VARIANTS.values():
        for key, spec in cls.keys.items():
            out.setdefault(key, (spec, []))
    for name, cls in _VARIANTS.items():
        for key in cls.reads_keys():
            if key in out:
                out[key][1].append(name)
    return out


def stat_names() -> dict[str, str]:
    """Every per-head statistic a registered variant logs -> its one-line meaning."""
    return {stat: meaning for cls in _VARIANTS.values() for stat, meaning in cls.stats.items()}


def table() -> str:
    """The registered variants as the README's Markdown table: ``attention_type``, what it computes, its page."""
    rows = ["| `attention_type` | what | doc |", "|---|---|---|"]
    rows += [f"| `{name}` | {cls.what} | [{cls.doc}]({cls.doc}) |" for name, cls in _VARIANTS.items()]
    return "\n".join(rows)

