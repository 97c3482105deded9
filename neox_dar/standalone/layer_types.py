"""The attention layer types a model may name in ``config.json``'s ``neox_dar_layers``: :data:`LAYER_TYPES`, each
type's ``layer_type`` -> its :class:`~.attention.AttentionLayer` subclass.

Here they are every layer type a module of this package defines (each module imported by its file name), so a new
layer type is its module alone. An exported folder holds another ``layer_types.py``, written by ``convert to-hf``
(``neox_dar.hf.remote.layer_types_source``), that imports the module of each of these layer types by name:
transformers copies beside ``modeling_neox_dar.py`` only the files its imports name.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from .attention import AttentionLayer

# the transformers classes, the package file and this one: they define no layer type
_NOT_LAYER_MODULES = frozenset({"__init__", "configuration_neox_dar", "modeling_neox_dar", "layer_types"})


def defined_layer_types() -> dict[str, type[AttentionLayer]]:
    """``layer_type`` -> class, for every :class:`AttentionLayer` subclass that sets a ``layer_type`` of its own in a
    module of this package; a TypeError when two classes set the same name."""
    found: dict[str, type[AttentionLayer]] = {}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.stem in _NOT_LAYER_MODULES:
            continue
        module = importlib.import_module(f".{path.stem}", __package__)
        for cls in vars(module).values():
            if isinstance(cls, type) and issubclass(cls, AttentionLayer) and cls.__module__ == module.__name__ \
                    and vars(cls).get("layer_type"):
                if cls.layer_type in found:
                    raise TypeError(f"layer type {cls.layer_type!r} is defined by {found[cls.layer_type].__qualname__} "
                                    f"and {cls.__qualname__}")
                found[cls.layer_type] = cls
    return found


LAYER_TYPES = defined_layer_types()
