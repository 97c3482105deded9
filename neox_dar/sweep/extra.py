"""The names and paths of a sweep's extra evaluation corpora (``eval: {extra: {NAME: PATH}}``), read without the
evaluation's modules (torch): planning a sweep checks them, :mod:`.evaluate` scores them."""

from __future__ import annotations

from ..corpus_names import ALL_CORPORA


def parse_extra(items: list[str] | dict) -> dict[str, str]:
    """``{NAME: PATH}`` from ``NAME=PATH`` strings (or a mapping); a name of a built-in corpus, or one that is not
    a word, is a ValueError."""
    pairs = items.items() if isinstance(items, dict) else (str(i).partition("=")[::2] for i in items)
    out = {}
    for name, path in pairs:
        name = str(name)
        if not name.isidentifier() or not path:
            raise ValueError(f"an extra corpus is NAME=PATH with NAME a word, got {name!r}={path!r}")
        if name in ALL_CORPORA:
            raise ValueError(f"extra corpus name '{name}' is a built-in corpus: list it in the eval corpora instead")
        out[name] = str(path)
    return out
