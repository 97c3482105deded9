"""The typed, validated, sectioned :class:`Config`, loaded from layered YAML files and ``key=value`` overrides.

Files use flat GPT-NeoX keys; :func:`load_config` routes each key to its section (:mod:`.schema`), checks its
type, resolves the values that have defaults computed from other keys (each value then has one name), checks
every value rule and warns about keys the chosen attention variant does not read. Every error is a
:class:`ConfigError` with one line naming the key and the file (or "the command line") that set it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import yaml

from ..attention import layer_types, variant, variant_keys, variants
from ..attention.layers import resolve_layout
from ..corpus_names import CORPORA
from ..settings import ConfigError, InvalidValue, check
from .schema import (SECTIONS, DataConfig, ModelConfig, RunConfig, TrainingConfig, attention_config_class,
                     key_sections, section_fields)


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
        return {**model_flat(self.model), **_plain(self.training), **_plain(self.data), **_plain(self.run)}

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
        _validated(self.origins, rules, self)

    def with_attention_type(self, attention_type: str) -> "Config":
        """The same config with one attention variant in every layer, every variant key back at its default (the
        vanilla counterpart of a run, for costs relative to it)."""
        defaults = {key: spec.default for key, (spec, _) in variant_keys().items()}
        return self.replace(attention_type=attention_type, attention_config=None, hybrid=None, **defaults)

    @classmethod
    def from_flat(cls, data: dict, source: str = "<dict>") -> "Config":
        """A validated config from flat keys, all set by ``source``."""
        return _load([(source, _normalize_keys(data, source))])


def model_flat(model: ModelConfig) -> dict[str, Any]:
    """The model section's keys with its attention keys, by flat name."""
    return {**_plain(model), **_plain(model.attention)}


def model_config_from_flat(data: dict, source: str = "<dict>") -> ModelConfig:
    """A validated :class:`ModelConfig` from flat model and attention keys (a checkpoint's ``model.yml``)."""
    data = _normalize_keys(data, source)
    sections = key_sections()
    origins = {k: source for k in data}
    for key in data:
        if sections.get(key) not in ("model", "attention"):
            _unknown(key, list(_names_of("model")) + list(_names_of("attention")), source)
    model = _build_model(data, origins)
    _finish_model(model, origins)
    return model


def model_config_diff(a: ModelConfig, b: ModelConfig) -> dict[str, tuple[Any, Any]]:
    """``{key: (value in a, value in b)}`` for the architecture keys (``arch`` fields) where two models differ."""
    arch = [f.name for name in ("model", "attention") for f in section_fields(name) if f.metadata.get("arch", True)]
    fa, fb = model_flat(a), model_flat(b)
    return {k: (fa[k], fb[k]) for k in arch if fa[k] != fb[k]}


# ----------------------------------------------------------------------------------
# loading


def load_config(*yaml_paths: str | Path, overrides: typing.Iterable[str] = ()) -> Config:
    """Layer YAML files (later wins; nested mappings merge key by key) and ``key=value`` overrides into a
    validated :class:`Config`. GPT-NeoX config files load as they are (:data:`NEOX_IGNORED_KEYS`)."""
    layers = [(str(p), _normalize_keys(_read_yaml(p), str(p))) for p in yaml_paths]
    for item in overrides:
        parts, value = _parse_override(item)
        nested: dict = {parts[-1]: value}
        for part in reversed(parts[:-1]):
            nested = {part: nested}
        layers.append(("the command line", _normalize_keys(nested, "the command line")))
    return _load(layers)


def _load(layers: list[tuple[str, dict]]) -> Config:
    merged: dict = {}
    origins: dict[str, str] = {}
    for source, data in layers:
        _merge(merged, data, origins, source)
    _translate_neox(merged, origins)
    sections = key_sections()
    for key in merged:
        if key not in sections:
            _unknown(key, list(sections), origins.get(key, "<config>"))
    by_section: dict[str, dict] = {name: {} for name in SECTIONS}
    for key, value in merged.items():
        if sections[key] != "attention":
            by_section[sections[key]][key] = value
    model = _build_model({k: v for k, v in merged.items() if sections[k] in ("model", "attention")}, origins)
    cfg = Config(model=model,
                 training=_build(TrainingConfig, by_section["training"], origins, "<config>", ""),
                 data=_build(DataConfig, by_section["data"], origins, "<config>", ""),
                 run=_build(RunConfig, by_section["run"], origins, "<config>", ""), origins=origins)
    _resolve_training(cfg.training)
    _validated(origins, _check_training, cfg.training)
    _validated(origins, _check_data, cfg.data)
    _validated(origins, _check_run, cfg.run)
    _finish_model(cfg.model, origins)
    return cfg


def _build_model(data: dict, origins: dict) -> ModelConfig:
    """Model and attention sections from their flat keys (types checked, nothing resolved yet)."""
    attention_names = {f.name for f in section_fields("attention")}
    model = _build(ModelConfig, {k: v for k, v in data.items() if k not in attention_names}, origins, "<config>", "")
    model.attention = _build(attention_config_class(), {k: v for k, v in data.items() if k in attention_names},
                             origins, "<config>", "")
    return model


def _finish_model(model: ModelConfig, origins: dict) -> None:
    """Resolve the model's derived sizes and the per-layer attention types, each variant in use's model-dependent
    defaults, check every model and attention rule, and warn about attention keys no variant in use reads."""
    _resolve_model(model)
    _validated(origins, _check_model, model)
    _validated(origins, lambda m: resolve_layout(m, explicit_type="attention_type" in origins), model)
    for name in dict.fromkeys(layer_types(model)):
        if name in variants():
            for key, value in variant(name).resolve(model).items():
                setattr(model.attention, key, value)
    _validated(origins, _check_attention, model)


def _validated(origins: dict, rules, section) -> None:
    """Run ``rules(section)``; a failed rule is a ConfigError naming the key, where it was set last (a file or
    "the command line"; nothing for a default) and the rule."""
    try:
        rules(section)
    except InvalidValue as e:
        where = origins.get(e.key) or origins.get(e.key.split(".")[0])
        where = f" in {where}" if where else ""
        raise ConfigError(f"invalid value for '{e.key}'{where}: {e.value!r} ({e.rule})") from None


def _resolve_model(m: ModelConfig) -> None:
    if m.num_kv_heads is None:
        m.num_kv_heads = m.num_attention_heads
    if m.head_dim is None and m.num_attention_heads >= 1:
        m.head_dim = m.hidden_size // m.num_attention_heads
    if m.intermediate_size is None:
        m.intermediate_size = 4 * m.hidden_size


def _resolve_training(t: TrainingConfig) -> None:
    if t.lr_decay_iters is None:
        t.lr_decay_iters = t.train_iters
    if t.min_lr is None:
        t.min_lr = t.optimizer.params.lr / 10


# ----------------------------------------------------------------------------------
# value rules, per section


def _at_least_one(section: Any, keys: tuple[str, ...]) -> None:
    for key in keys:
        check(getattr(section, key) >= 1, key, "must be >= 1", getattr(section, key))


def _check_model(m: ModelConfig) -> None:
    _at_least_one(m, ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                      "intermediate_size", "seq_length", "max_position_embeddings", "vocab_size",
                      "make_vocab_size_divisible_by", "rotary_emb_base"))
    if m.fused_qkv:
        check(m.hidden_size % m.num_attention_heads == 0, "hidden_size",
              f"must be divisible by num_attention_heads={m.num_attention_heads}", m.hidden_size)
    if m.head_dim * m.num_attention_heads != m.hidden_size:
        check(m.fused_qkv is False, "head_dim", f"head_dim * num_attention_heads must equal hidden_size="
              f"{m.hidden_size} with fused_qkv (GPT-NeoX's layout); set fused_qkv: false for other widths",
              m.head_dim)
    check(m.num_attention_heads % m.num_kv_heads == 0, "num_kv_heads",
          f"must divide num_attention_heads={m.num_attention_heads}", m.num_kv_heads)
    check(not m.fused_qkv or m.num_kv_heads == m.num_attention_heads, "num_kv_heads",
          "grouped-query attention needs fused_qkv: false (GPT-NeoX's fused layout has one key/value head per "
          "query head)", m.num_kv_heads)
    check(m.seq_length <= m.max_position_embeddings, "seq_length",
          f"must be <= max_position_embeddings={m.max_position_embeddings}", m.seq_length)
    check(0.0 <= m.rotary_pct <= 1.0, "rotary_pct", "must be in [0, 1]", m.rotary_pct)
    check(m.rotary_ndims % 2 == 0, "rotary_pct", f"head_dim * rotary_pct = {m.rotary_ndims} must be even",
          m.rotary_pct)
    check(m.layernorm_epsilon > 0, "layernorm_epsilon", "must be > 0", m.layernorm_epsilon)
    check(m.rms_norm_epsilon > 0, "rms_norm_epsilon", "must be > 0", m.rms_norm_epsilon)
    check(not (m.gpt_j_residual and m.norm_position == "post"), "norm_position",
          "'post' (a norm after each sub-layer) needs gpt_j_residual: false (sequential sub-layers)", m.norm_position)
    if m.rope_scaling is not None:
        r = m.rope_scaling
        check(r.factor > 0 and r.low_freq_factor > 0 and r.high_freq_factor > r.low_freq_factor, "rope_scaling",
              "factor and low_freq_factor must be > 0 and high_freq_factor > low_freq_factor", r)
    check(0.0 <= m.hidden_dropout < 1.0, "hidden_dropout", "must be in [0, 1)", m.hidden_dropout)
    check(m.attention_dropout == 0.0, "attention_dropout", "only 0 is supported (no attention path applies dropout)",
          m.attention_dropout)


def _check_attention(m: ModelConfig) -> None:
    """The common attention rules, the rules of each variant in use, and a warning for every variant key set to a
    non-default value that no variant in use reads (it has no effect)."""
    a = m.attention
    if a.attention_type not in variants() and a.attention_config is None:
        close = difflib.get_close_matches(a.attention_type, list(variants()), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise InvalidValue("attention_type", f"choose one of {', '.join(variants())}{hint}", a.attention_type)
    used = list(dict.fromkeys(layer_types(m)))  # registered names only: resolve_layout checked attention_config
    check(a.window_size >= 0, "window_size", "must be >= 0", a.window_size)
    for key, (spec, _) in variant_keys().items():
        value = getattr(a, key)
        if spec.rule is not None and value is not None:
            rule = spec.rule(value, m)
            check(rule is None, key, rule or "", value)
    for name in used:
        variant(name).validate(m)
    reads = frozenset().union(*(variant(name).reads_keys() for name in used))
    for key, (spec, owners) in variant_keys().items():
        if key not in reads and getattr(a, key) != spec.default:
            warnings.warn(f"'{key}' is set but attention_type is '{a.attention_type}' (it is read only by "
                          f"{', '.join(owners)}); it has no effect", stacklevel=5)


def _check_training(t: TrainingConfig) -> None:
    _at_least_one(t, ("train_micro_batch_size_per_gpu", "train_iters", "lr_decay_iters"))
    p = t.optimizer.params
    check(0 < p.lr < math.inf, "optimizer.params.lr", "must be > 0 and finite", p.lr)
    check(all(0.0 <= b < 1.0 for b in p.betas), "optimizer.params.betas", "each must be in [0, 1)", p.betas)
    check(0 < p.eps < math.inf, "optimizer.params.eps", "must be > 0 and finite", p.eps)
    check(0 <= t.min_lr <= p.lr, "min_lr", "must be in [0, optimizer.params.lr]", t.min_lr)
    check(0.0 <= t.warmup <= 1.0, "warmup", "is a fraction of lr_decay_iters, must be in [0, 1]", t.warmup)
    check(0 <= t.weight_decay < math.inf, "weight_decay", "must be >= 0 and finite", t.weight_decay)
    check(0 <= t.gradient_clipping < math.inf, "gradient_clipping", "must be >= 0 and finite", t.gradient_clipping)
    if t.trainable_params is not None:
        check(len(t.trainable_params) > 0, "trainable_params", "must name at least one pattern (unset it to train "
              "every parameter)", t.trainable_params)
    z = t.zero_optimization
    check(0 <= z.stage <= 3, "zero_optimization.stage", "must be 0, 1, 2 or 3", z.stage)
    check(not z.cpu_offload, "zero_optimization.cpu_offload",
          "ZeRO-Offload is not supported: use a higher zero_optimization.stage", z.cpu_offload)
    if t.gradient_accumulation_steps is not None:
        check(t.gradient_accumulation_steps >= 1, "gradient_accumulation_steps", "must be >= 1",
              t.gradient_accumulation_steps)
    if t.train_batch_size is not None:
        per_rank = t.train_micro_batch_size_per_gpu * (t.gradient_accumulation_steps or 1)
        check(t.train_batch_size >= 1 and t.train_batch_size % per_rank == 0, "train_batch_size",
              f"must be a positive multiple of micro batch * gradient_accumulation_steps = {per_rank}",
              t.train_batch_size)
    check(0 <= t.seed <= 2**32 - 1, "seed", "must be in [0, 2**32 - 1], numpy RandomState's range", t.seed)


def split_shares(split: str) -> list[float] | None:
    """GPT-NeoX's ``split``: up to three ','- or '/'-separated train,valid,test shares, missing ones 0
    ("98,2" is [98, 2, 0]); None when malformed (not numbers, negative, more than three, zero sum)."""
    try:
        shares = [float(p) for p in split.replace("/", ",").split(",")]
    except ValueError:
        return None
    if len(shares) > 3 or not all(math.isfinite(x) and x >= 0 for x in shares) or sum(shares) <= 0:
        return None
    return (shares + [0.0, 0.0])[:3]


def _check_data(d: DataConfig) -> None:
    check(d.num_workers >= 0, "num_workers", "must be >= 0", d.num_workers)
    if d.data_cache_path is not None:
        check(bool(str(d.data_cache_path).strip()), "data_cache_path", "must be a directory path", d.data_cache_path)
    for part in ("train", "valid"):
        weights, paths = getattr(d, f"{part}_data_weights"), getattr(d, f"{part}_data_paths")
        if weights is not None:
            check(paths is not None and len(weights) == len(paths), f"{part}_data_weights",
                  f"needs one weight per entry of {part}_data_paths", weights)
            check(all(w >= 0 for w in weights) and sum(weights) > 0, f"{part}_data_weights",
                  "must be non-negative with a positive sum", weights)
    check(split_shares(d.split) is not None, "split",
          "must be 1 to 3 non-negative numbers 'train,valid,test' with a positive sum; missing shares are 0", d.split)
    if d.data_path and d.valid_data_paths:
        check(split_shares(d.split)[1] == 0, "split", "gives validation a share of data_path while valid_data_paths "
              "names the validation data: set its validation share to 0 (e.g. '1000,0,0')", d.split)
    for part in ("train", "valid"):
        labels, paths = getattr(d, f"{part}_label_data_paths"), getattr(d, f"{part}_data_paths")
        if labels is not None:
            check(paths is not None and len(labels) == len(paths), f"{part}_label_data_paths",
                  f"needs one label dataset per entry of {part}_data_paths", labels)
            check(getattr(d, f"{part}_data_weights") is None, f"{part}_label_data_paths",
                  f"conversations are pooled, not blended: unset {part}_data_weights", labels)
    check(d.valid_label_data_paths is None or d.train_label_data_paths is not None, "valid_label_data_paths",
          "needs train_label_data_paths (labels in validation only are not supported)", d.valid_label_data_paths)
    if d.train_label_data_paths is not None and d.valid_data_paths:
        check(d.valid_label_data_paths is not None, "valid_label_data_paths",
              "needs to be set with train_label_data_paths and valid_data_paths (chat validation data has labels)",
              d.valid_label_data_paths)


def _check_run(r: RunConfig) -> None:
    _at_least_one(r, ("checkpoint_factor", "keep_last_n", "log_interval", "eval_iters"))
    check(r.eval_interval >= 0, "eval_interval", "must be >= 0", r.eval_interval)
    e = r.eval_perplexity
    check(e.interval >= 0, "eval_perplexity.interval", "must be >= 0", e.interval)
    check(bool(e.corpora) and all(c in CORPORA for c in e.corpora), "eval_perplexity.corpora",
          f"must be a non-empty list of {', '.join(CORPORA)}", e.corpora)
    if e.max_docs is not None:
        check(e.max_docs >= 1, "eval_perplexity.max_docs", "must be >= 1", e.max_docs)
    check(e.batch_size >= 1, "eval_perplexity.batch_size", "must be >= 1", e.batch_size)
    if r.exit_interval is not None:
        check(r.exit_interval >= 1, "exit_interval", "must be >= 1", r.exit_interval)


# ----------------------------------------------------------------------------------
# typed dataclasses from plain data


def _normalize_keys(data: Any, source: str) -> Any:
    """Hyphens in mapping keys become underscores, recursively."""
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            if not isinstance(k, str):
                raise ConfigError(f"key {k!r} in {source} is not a string")
            out[k.replace("-", "_")] = _normalize_keys(v, source)
        return out
    return data


def _names_of(section: str) -> list[str]:
    return [f.name for f in section_fields(section)]


def _unknown(key: str, names: list[str], where: str) -> typing.NoReturn:
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
        return _build(tp, value, origins, source, f"{key}.")
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
            return float(value)  # YAML 1.1 reads "3e-4" (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    raise TypeError(f"unsupported config annotation {tp!r} for '{key}'")


def _build(cls: type, data: dict, origins: dict, source: str, prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("section")]
    kwargs = {}
    for key, value in data.items():
        full = prefix + key
        where = origins.get(full, origins.get(prefix.rstrip("."), source))
        if key not in names:
            _unknown(full, [prefix + n for n in names], where)
        kwargs[key] = _coerce(hints[key], value, full, where, origins)
    return cls(**kwargs)


def _plain(obj: Any) -> Any:
    """A section as plain data (dataclasses to dicts, tuples to lists), without nested sections."""
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if not f.metadata.get("section")}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------
# files and overrides


def _read_yaml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        line = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"malformed YAML in {p}{line}: {e.problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"malformed YAML in {p}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping of keys to values, not a {type(data).__name__}")
    return data


def _merge(base: dict, new: dict, origins: dict, source: str, prefix: str = "") -> None:
    """Merge ``new`` into ``base`` in place; later values win; nested mappings merge key by key."""
    for k, v in new.items():
        full = prefix + k
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v, origins, source, full + ".")
        else:
            base[k] = v
            if isinstance(v, dict):  # every nested key of a new mapping comes from this source too
                _merge({}, v, origins, source, full + ".")
        origins[full] = source


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value")
    key, raw = item.split("=", 1)
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


# GPT-NeoX keys that only steer its fused kernels, model/pipeline parallelism or launcher. They are accepted so
# GPT-NeoX (e.g. Pythia) config files load as they are, and reported once, since they change nothing here.
NEOX_IGNORED_KEYS = frozenset({
    "output_layer_parallelism", "scaled_upper_triang_masked_softmax_fusion", "bias_gelu_fusion",
    "checkpoint_num_layers", "partition_activations", "synchronize_each_layer", "data_impl", "distributed_backend",
    "steps_per_print", "wall_clock_breakdown", "launcher", "deepspeed_slurm", "deepspeed_mpi", "extra_save_iters",
    "test_data_paths", "test_data_weights", "pos_emb",
    "pipe_parallel_size", "model_parallel_size",
})


def _translate_neox(merged: dict, origins: dict) -> None:
    """Map GPT-NeoX spellings onto our keys in place (``gas``, ``save_interval``, ``fp16``/``bf16`` blocks,
    ignored keys); reject the ones whose value would change the model in a way this project does not implement."""
    def where(key: str) -> str:
        return origins.get(key, "<config>")

    for old, new in (("gas", "gradient_accumulation_steps"), ("save_interval", "checkpoint_factor")):
        if old in merged:
            value = merged.pop(old)
            if new not in merged:
                merged[new], origins[new] = value, where(old)
    for block, precision in (("fp16", "fp16"), ("bf16", "bf16")):
        if block in merged:
            value = merged.pop(block)
            if not isinstance(value, dict):
                raise ConfigError(f"wrong type for '{block}' in {where(block)}: expected a mapping with 'enabled'")
            if value.get("enabled", False):
                merged.setdefault("precision", precision)
    for key, allowed in (("pos_emb", ("rotary",)), ("pipe_parallel_size", (0, 1)), ("model_parallel_size", (1,))):
        if key in merged and merged[key] not in allowed:
            raise ConfigError(f"invalid value for '{key}' in {where(key)}: {merged[key]!r} (neox-dar supports "
                              f"{' or '.join(map(repr, allowed))})")
    ignored = sorted(k for k in merged if k in NEOX_IGNORED_KEYS)
    for k in ignored:
        del merged[k]
    if ignored:
        warnings.warn(f"GPT-NeoX keys with no effect in neox-dar ignored: {', '.join(ignored)}", stacklevel=4)
