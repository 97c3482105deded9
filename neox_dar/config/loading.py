"""Loading: layered YAML files and ``key=value`` overrides into a validated :class:`~.typed.Config`.

Files use flat GPT-NeoX keys; :func:`load_config` merges the layers (:mod:`.files`), maps GPT-NeoX spellings
(:mod:`.neox`), routes each key to its section (:mod:`.schema`), checks its type (:mod:`.coerce`), resolves the
values that have defaults computed from other keys and the per-layer attention types
(:func:`neox_dar.variants.layers.resolve_layout`), checks every value rule (:mod:`.rules`) and warns about keys
the chosen attention variant does not read. Every error is a :class:`ConfigError` with one line naming the key and
the file (or "the command line") that set it.
"""

from __future__ import annotations

import typing
from pathlib import Path

from ..variants import layer_types, variant, variants
from ..variants.layers import resolve_layout
from .coerce import build, unknown_key
from .files import merge, normalize_keys, parse_override, read_yaml
from .neox import translate_neox
from .rules import (check_attention, check_data, check_model, check_run, check_training, resolve_model,
                    resolve_training, validated)
from .model_schema import ModelConfig, attention_config_class
from .schema import SECTIONS, DataConfig, RunConfig, TrainingConfig, key_sections, section_fields
from .typed import Config


def load_config(*yaml_paths: str | Path, overrides: typing.Iterable[str] = ()) -> Config:
    """Layer YAML files (later wins; nested mappings merge key by key) and ``key=value`` overrides into a
    validated :class:`Config`. GPT-NeoX config files load as they are (:data:`.neox.NEOX_IGNORED_KEYS`)."""
    layers = [(str(p), normalize_keys(read_yaml(p), str(p))) for p in yaml_paths]
    for item in overrides:
        parts, value = parse_override(item)
        nested: dict = {parts[-1]: value}
        for part in reversed(parts[:-1]):
            nested = {part: nested}
        layers.append(("the command line", normalize_keys(nested, "the command line")))
    return load_layers(layers)


def load_layers(layers: list[tuple[str, dict]]) -> Config:
    """``(source, flat keys)`` layers, later ones winning, as one validated :class:`Config`."""
    merged: dict = {}
    origins: dict[str, str] = {}
    for source, data in layers:
        merge(merged, data, origins, source)
    translate_neox(merged, origins)
    sections = key_sections()
    for key in merged:
        if key not in sections:
            unknown_key(key, list(sections), origins.get(key, "<config>"))
    by_section: dict[str, dict] = {name: {} for name in SECTIONS}
    for key, value in merged.items():
        if sections[key] != "attention":
            by_section[sections[key]][key] = value
    model = model_sections({k: v for k, v in merged.items() if sections[k] in ("model", "attention")}, origins)
    cfg = Config(model=model,
                 training=build(TrainingConfig, by_section["training"], origins, "<config>", ""),
                 data=build(DataConfig, by_section["data"], origins, "<config>", ""),
                 run=build(RunConfig, by_section["run"], origins, "<config>", ""), origins=origins)
    resolve_training(cfg.training)
    validated(origins, check_training, cfg.training)
    validated(origins, check_data, cfg.data)
    validated(origins, check_run, cfg.run)
    finish_model(cfg.model, origins)
    return cfg


def model_sections(data: dict, origins: dict) -> ModelConfig:
    """Model and attention sections from their flat keys (types checked, nothing resolved yet)."""
    attention_names = {f.name for f in section_fields("attention")}
    model = build(ModelConfig, {k: v for k, v in data.items() if k not in attention_names}, origins, "<config>", "")
    model.attention = build(attention_config_class(), {k: v for k, v in data.items() if k in attention_names},
                             origins, "<config>", "")
    return model


def finish_model(model: ModelConfig, origins: dict) -> None:
    """Resolve the model's derived sizes and the per-layer attention types, each variant in use's model-dependent
    defaults, check every model and attention rule, and warn about attention keys no variant in use reads."""
    resolve_model(model)
    validated(origins, check_model, model)
    validated(origins, lambda m: resolve_layout(m, explicit_type="attention_type" in origins), model)
    for name in dict.fromkeys(layer_types(model)):
        if name in variants():
            for key, value in variant(name).resolve(model).items():
                setattr(model.attention, key, value)
    validated(origins, check_attention, model)


def model_config_from_flat(data: dict, source: str = "<dict>") -> ModelConfig:
    """A validated :class:`ModelConfig` from flat model and attention keys (a checkpoint's ``model.yml``)."""
    data = normalize_keys(data, source)
    sections = key_sections()
    origins = {k: source for k in data}
    for key in data:
        if sections.get(key) not in ("model", "attention"):
            unknown_key(key, list(_names_of("model")) + list(_names_of("attention")), source)
    model = model_sections(data, origins)
    finish_model(model, origins)
    return model


def _names_of(section: str) -> list[str]:
    return [f.name for f in section_fields(section)]
