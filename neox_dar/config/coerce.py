"""Typed dataclasses from plain data: every value checked against its field's annotation (``Optional``,
``Literal``, nested dataclasses, lists, tuples, bool, int, float, str) and converted where the file's spelling
differs (ints to floats, lists to tuples, YAML 1.1's ``3e-4`` string to a float); an unknown key, a value of the
wrong type or a float that is not finite (YAML's ``.inf``, ``.nan``: no key takes one) is a one-line ConfigError
naming the key and its file."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from typing import Any, Literal

from ..config_fields import ConfigError


def unknown_key(key: str, names: list[str], where: str) -> typing.NoReturn:
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise ConfigError(f"unknown key '{key}' in {where}{hint}")


_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(tp: Any, value: Any, key: str, source: str, origins: dict) -> Any:
    """Check ``value`` against the annotation ``tp``; return it converted (ints to floats, lists to tuples)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    bad = ConfigError(f"wrong type for '{key}' in {source}: expected {_type_name(tp)}, got {value!r}")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(inner, value, key, source, origins)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"invalid value for '{key}' in {source}: {value!r} (choose one of "
                              f"{', '.join(map(str, args))})")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        return build(tp, value, origins, source, f"{key}.")
    if origin is list:
        if not isinstance(value, list):
            raise bad
        return [_coerce(args[0], v, f"{key}[{i}]", source, origins) for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise bad
        return tuple(_coerce(a, v, f"{key}[{i}]", source, origins) for i, (a, v) in enumerate(zip(args, value)))
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise bad
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads "3e-4" (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if isinstance(value, int):  # float() of an int of 2**1024 or more overflows
            value = float(value) if abs(value) < 2**1024 else (math.inf if value > 0 else -math.inf)
        if not math.isfinite(value):
            raise ConfigError(f"invalid value for '{key}' in {source}: {value!r} (must be a finite number)")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    raise TypeError(f"unsupported config annotation {tp!r} for '{key}'")


def coerce(tp: Any, value: Any, key: str, source: str) -> Any:
    """``value`` checked against the annotation ``tp`` (and converted as a config key's value is), for settings
    outside the config (a sweep's ``slurm:``); ConfigError naming ``key`` and ``source`` when it does not fit."""
    return _coerce(tp, value, key, source, {})


def build(cls: type, data: dict, origins: dict, source: str, prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("section")]
    kwargs = {}
    for key, value in data.items():
        full = prefix + key
        where = origins.get(full, origins.get(prefix.rstrip("."), source))
        if key not in names:
            unknown_key(full, [prefix + n for n in names], where)
        kwargs[key] = _coerce(hints[key], value, full, where, origins)
    return cls(**kwargs)


def plain(obj: Any) -> Any:
    """A section as plain data (dataclasses to dicts, tuples to lists), without nested sections."""
    if dataclasses.is_dataclass(obj):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if not f.metadata.get("section")}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj
