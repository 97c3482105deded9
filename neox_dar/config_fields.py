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


Rule = Callable[[Any, Any], str | None]  # (value, its section) -> what the value must be when it is wrong


def setting(default: Any, help: str, *, label: str | None = None, arch: bool = True, rule: Rule | None = None) -> Any:
    """A config field: ``default``, one line of ``help``, the sweep run-name ``label`` put before its value
    (``"d"`` makes ``dar_d_down: 128`` read ``d128``), for model keys whether it is part of the architecture
    (``arch``: a checkpoint continues only under the same value; seq_length, init or the attention path may
    change), and the key's own value ``rule``: ``rule(value, section)`` (the section the key belongs to; the model
    for attention keys) returns what the value must be when it is wrong, else None. It runs when a config is loaded,
    whenever the key is set (not None); rules between keys are :mod:`neox_dar.config.rules`'."""
    meta = {"help": help, "label": label, "arch": arch, "rule": rule}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    if dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda d=default: dataclasses.replace(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def when(test: Callable[[Any], bool], rule: str) -> Rule:
    """The rule of a key whose values must pass ``test`` alone; ``rule`` says what they must be."""
    return lambda value, _: None if test(value) else rule


def at_least(low: int) -> Rule:
    """The rule ``value >= low``."""
    return when(lambda value: value >= low, f"must be >= {low}")


@dataclass(frozen=True)
class Key:
    """A config key an attention variant adds: its type annotation, default and :func:`setting` metadata, its value
    rule included (``rule(value, model_config)``). The rule runs whenever the key is set (not None), whichever
    variant is chosen: an impossible value is an error even where it has no effect."""

    type: Any
    default: Any
    help: str
    label: str | None = None
    arch: bool = True
    rule: Rule | None = field(default=None, compare=False)

    def field(self) -> Any:
        return setting(self.default, self.help, label=self.label, arch=self.arch, rule=self.rule)
