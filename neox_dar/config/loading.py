"""Loading: layered YAML files and ``key=value`` overrides (:func:`load_config`), or a checkpoint's flat model keys
(:func:`model_config_from_flat`), into a validated :class:`~.typed.Config` or model section, which
:func:`.typed.load_layers` builds. Every error is a :class:`ConfigError` with one line naming the key and the file
(or "the command line") that set it.
"""

from __future__ import annotations

import typing
from pathlib import Path

from .coerce import unknown_key
from .files import normalize_keys, parse_override, read_yaml
from .model_schema import ModelConfig
from .schema import key_field, key_sections, section_fields
from .typed import Config, finish_model, load_layers, model_sections


def load_config(*yaml_paths: str | Path, overrides: typing.Iterable[str] = (),
                sources: typing.Sequence[str] = ()) -> Config:
    """Layer YAML files (later wins; nested mappings merge key by key) and ``key=value`` overrides into a
    validated :class:`Config`. GPT-NeoX config files load as they are (:data:`.neox.NEOX_IGNORED_KEYS`).
    ``sources[i]`` names where ``overrides[i]`` was written, for the errors (default: "the command line")."""
    layers = [(str(p), normalize_keys(read_yaml(p), str(p))) for p in yaml_paths]
    for i, item in enumerate(overrides):
        source = sources[i] if i < len(sources) else "the command line"
        parts, value = parse_override(item)
        if len(parts) == 1 and _takes_text(parts[0]) and value is not None and not isinstance(value, (str, list, dict)):
            value = item.split("=", 1)[1].strip()  # as written: YAML reads split=1:2 as 62, save=2024 as an int
        nested: dict = {parts[-1]: value}
        for part in reversed(parts[:-1]):
            nested = {part: nested}
        layers.append((source, normalize_keys(nested, source)))
    return load_layers(layers, files={str(p) for p in yaml_paths})


def _takes_text(key: str) -> bool:
    """Whether the flat config key ``key`` holds a string (``split``, ``save``, ``data_path``, ...)."""
    field = key_field(key)
    return field is not None and field.type in ("str", "Optional[str]")


def model_config_from_flat(data: dict, source: str = "<dict>", sources: dict[str, str] | None = None) -> ModelConfig:
    """A validated :class:`ModelConfig` from flat model and attention keys (a checkpoint's ``model.yml``), set by
    ``source`` (``sources``: another one for some keys, e.g. the command line's overrides of an import)."""
    data = normalize_keys(data, source)
    sections = key_sections()
    origins = {k: (sources or {}).get(k, source) for k in data}
    for key in data:
        if sections.get(key) not in ("model", "attention"):
            unknown_key(key, list(_names_of("model")) + list(_names_of("attention")), origins[key])
    model = model_sections(data, origins)
    finish_model(model, origins)
    return model


def _names_of(section: str) -> list[str]:
    return [f.name for f in section_fields(section)]
