"""Config files and command-line overrides: YAML read into mappings (hyphens in keys become underscores, as in
GPT-NeoX), layered key by key, and ``key=value`` words (dotted keys for nested ones) read as YAML values."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import yaml

from ..config_fields import ConfigError


def normalize_keys(data: Any, source: str) -> Any:
    """Hyphens in mapping keys become underscores, recursively; two spellings of one key in a mapping
    (``hidden-size`` and ``hidden_size``) are an error."""
    if isinstance(data, dict):
        out, spelled = {}, {}
        for k, v in data.items():
            if not isinstance(k, str):
                raise ConfigError(f"key {k!r} in {source} is not a string")
            key = k.replace("-", "_")
            if key in out:
                raise ConfigError(f"'{key}' is given twice in {source} (as '{spelled[key]}' and '{k}'): keep one")
            out[key], spelled[key] = normalize_keys(v, source), k
        return out
    return data


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that repeats a key (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, typing.Hashable) and key in seen:
                raise ConfigError(f"'{key}' is given twice in {self.name}:{key_node.start_mark.line + 1} (the "
                                  "mapping repeats it): keep one")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def not_utf8(path: str | Path, e: UnicodeDecodeError) -> str:
    """The one-line reason a text file the user named cannot be read."""
    return f"{path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): is it the file you mean?"


def load_yaml(path: Path) -> Any:
    """The YAML document of the file a user wrote at ``path`` (a key repeated in a mapping refused); ConfigError in
    one line for a file that is not UTF-8 or not YAML (``malformed YAML in FILE:LINE:COLUMN: problem``)."""
    try:
        with path.open(encoding="utf-8") as f:
            return yaml.load(f, Loader=UniqueKeyLoader)
    except UnicodeDecodeError as e:
        raise ConfigError(not_utf8(path, e)) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        line = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"malformed YAML in {path}{line}: {e.problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"malformed YAML in {path}: {str(e).splitlines()[0]}") from None


def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p} is a folder: name a config file (e.g. {p / 'config.yml'})")
    if not p.is_file() and str(path).startswith("-"):
        raise ConfigError(f"unknown option {path}: give config files and key=value overrides (see --help)")
    if not p.is_file():
        hint = ("" if p.suffix in (".yml", ".yaml") or "/" in str(path) else
                f" (a word without '=' names a config file; a key is set as key=value, e.g. {path}=...)")
        raise ConfigError(f"config file not found: {p}{hint}")
    data = load_yaml(p)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping of keys to values, not a {type(data).__name__}")
    return data


def merge(base: dict, new: dict, origins: dict, source: str, prefix: str = "") -> None:
    """Merge ``new`` into ``base`` in place; later values win; nested mappings merge key by key."""
    for k, v in new.items():
        full = prefix + k
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merge(base[k], v, origins, source, full + ".")
        else:
            base[k] = v
            if isinstance(v, dict):  # every nested key of a new mapping comes from this source too
                merge({}, v, origins, source, full + ".")
        origins[full] = source


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value")
    key, raw = item.split("=", 1)
    if key.startswith("-"):
        raise ConfigError(f"override {item!r}: keys are set without dashes, as key=value "
                          f"({key.lstrip('-')}={raw})")
    key = key.strip().replace("-", "_")
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def split_args(args: typing.Sequence[str]) -> tuple[list[str], list[str]]:
    """Split command-line words into YAML paths and ``key=value`` overrides."""
    return [a for a in args if "=" not in a], [a for a in args if "=" in a]
