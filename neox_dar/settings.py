"""What every config key is made of: a typed field with a default, one line of help, and where it shows up; a
variant's :class:`Key`; value rules (:func:`check`) and the one-line :class:`ConfigError`.

A leaf: it imports nothing from the package, so the attention variants declare their keys with it and the config
package (:mod:`neox_dar.config`, which re-exports these names) builds its schema from the variants.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable


class ConfigError(ValueError):
    """A configuration problem, reported as one line (naming the key and its file) before any work starts."""


class InvalidValue(ConfigError):
    """A failed value rule; the loader turns it into the one-line message with the key's file."""

    def __init__(self, key: str, rule: str, value: Any):
        super().__init__(key, rule, value)
        self.key, self.rule, self.value = key, rule, value


def check(ok: bool, key: str, rule: str, value: Any) -> None:
    """Raise :class:`InvalidValue` for ``key`` unless ``ok``; ``rule`` says what the value must be."""
    if not ok:
        raise InvalidValue(key, rule, value)


def setting(default: Any, help: str, *, label: str | None = None, arch: bool = True) -> Any:
    """A config field: ``default``, one line of ``help``, the sweep run-name ``label`` put before its value
    (``"d"`` makes ``dar_d_down: 128`` read ``d128``), and for model keys whether it is part of the architecture
    (``arch``: a checkpoint continues only under the same value; seq_length, init or the attention path may change)."""
    meta = {"help": help, "label": label, "arch": arch}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    if dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda d=default: dataclasses.replace(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class Key:
    """A config key an attention variant adds: its type annotation, default, :func:`setting` metadata, and its
    value rule: ``rule(value, model_config)`` returns what the value must be when it is wrong, else None. The rule
    runs whenever the key is set (not None), whichever variant is chosen: an impossible value is an error even
    where it has no effect."""

    type: Any
    default: Any
    help: str
    label: str | None = None
    arch: bool = True
    rule: Callable[[Any, Any], str | None] | None = field(default=None, compare=False)

    def field(self) -> Any:
        return setting(self.default, self.help, label=self.label, arch=self.arch)
