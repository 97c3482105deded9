"""The typed, sectioned :class:`Config` of one run, built from layers of flat keys (:func:`load_layers`; the files
and overrides are read by :mod:`.loading`), and the model section's flat view.

Building merges the layers (:mod:`.files`), maps GPT-NeoX spellings (:mod:`.neox`), routes each key to its section
(:mod:`.schema`), checks its type (:mod:`.coerce`), resolves the values that have defaults computed from other keys
and the per-layer attention types (:func:`neox_dar.variants.layers.resolve_layout`), checks every value rule
(:mod:`.rules`) and warns about keys the chosen attention variant does not read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from ..variants import layer_types, variant, variant_keys, variants
from ..variants.layers import resolve_layout
from .coerce import build, plain, unknown_key
from .files import merge, normalize_keys
from .model_schema import ModelConfig, attention_config_class
from .neox import translate_neox
from .rules import (check_attention, check_data, check_model, check_run, check_training, resolve_model,
                    resolve_training, validated)
from .schema import SECTIONS, DataConfig, RunConfig, TrainingConfig, key_sections, section_fields


@dataclass
class Config:
    """One run's configuration: ``model`` (with ``model.attention``), ``training``, ``data`` and ``run``."""

    model: ModelConfig
    training: TrainingConfig
    data: DataConfig
    run: RunConfig
    origins: dict[str, str] = field(default_factory=dict, compare=False, repr=False)  # key -> where it was set

    def flat(self) -> dict[str, Any]:
        """Every key by its flat name, in file order (``optimizer`` and ``zero_optimization`` stay mappings)."""
        return {**model_flat(self.model), **plain(self.training), **plain(self.data), **plain(self.run)}

    def get(self, key: str) -> Any:
        """The value of a flat key (``dotted.path`` for nested ones); KeyError for an unknown key."""
        value: Any = self.flat()
        for part in key.split("."):
            value = value[part]
        return value

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.flat(), sort_keys=False)

    def replace(self, **changes: Any) -> "Config":
        """A new validated config with some flat keys changed (values as a file would give them)."""
        return Config.from_flat({**self.flat(), **changes}, source="<replace>")

    def validate(self, rules: Callable[["Config"], None]) -> None:
        """Run value rules that need more than the config (``rules(self)``, e.g. against the model's parameter
        names: :func:`neox_dar.training.checks.check_what_trains`); a failed rule is the one-line ConfigError naming
        the key and where it was set."""
        validated(self.origins, rules, self)

    def with_attention_type(self, attention_type: str) -> "Config":
        """The same config with one attention variant in every layer, every variant key back at its default (the
        vanilla counterpart of a run, for costs relative to it)."""
        defaults = {key: spec.default for key, (spec, _) in variant_keys().items()}
        return self.replace(attention_type=attention_type, attention_config=None, hybrid=None, **defaults)

    @classmethod
    def from_flat(cls, data: dict, source: str = "<dict>") -> "Config":
        """A validated config from flat keys, all set by ``source``."""
        return load_layers([(source, normalize_keys(data, source))])


def load_layers(layers: list[tuple[str, dict]], files: set[str] | None = None) -> Config:
    """``(source, flat keys)`` layers, later ones winning, as one validated :class:`Config`; ``files``: the sources
    that are config files (None: every layer), of which a GPT-NeoX one is read with GPT-NeoX's defaults."""
    merged: dict = {}
    origins: dict[str, str] = {}
    for source, data in layers:
        merge(merged, data, origins, source)
    translate_neox(merged, origins, {source for source, _ in layers} if files is None else files)
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


def model_flat(model: ModelConfig) -> dict[str, Any]:
    """The model section's keys with its attention keys, by flat name."""
    return {**plain(model), **plain(model.attention)}


def model_config_diff(a: ModelConfig, b: ModelConfig) -> dict[str, tuple[Any, Any]]:
    """``{key: (value in a, value in b)}`` for the architecture keys (``arch`` fields) where two models differ."""
    arch = [f.name for name in ("model", "attention") for f in section_fields(name) if f.metadata.get("arch", True)]
    fa, fb = model_flat(a), model_flat(b)
    return {k: (fa[k], fb[k]) for k in arch if fa[k] != fb[k]}
