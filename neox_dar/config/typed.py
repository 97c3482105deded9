"""The typed, sectioned :class:`Config` of one run (built by :mod:`.loading`), and the model section's flat view."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from ..variants import variant_keys
from .coerce import plain
from .model_schema import ModelConfig
from .rules import validated
from .schema import DataConfig, RunConfig, TrainingConfig, section_fields


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
        from .files import normalize_keys
        from .loading import load_layers  # which builds a Config

        return load_layers([(source, normalize_keys(data, source))])


def model_flat(model: ModelConfig) -> dict[str, Any]:
    """The model section's keys with its attention keys, by flat name."""
    return {**plain(model), **plain(model.attention)}


def model_config_diff(a: ModelConfig, b: ModelConfig) -> dict[str, tuple[Any, Any]]:
    """``{key: (value in a, value in b)}`` for the architecture keys (``arch`` fields) where two models differ."""
    arch = [f.name for name in ("model", "attention") for f in section_fields(name) if f.metadata.get("arch", True)]
    fa, fb = model_flat(a), model_flat(b)
    return {k: (fa[k], fb[k]) for k in arch if fa[k] != fb[k]}
