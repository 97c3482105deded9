"""The value rules of each section, run when a config is loaded: each key's own rule, declared beside the key
(:func:`check_keys`), then the rules between keys; and the values resolved from other keys (``min_lr: null`` ->
``lr / 10``). A failed rule is a one-line ConfigError naming the key and where it was set (:func:`validated`)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import warnings
from typing import Any

from ..config_fields import ConfigError, InvalidValue, check
from ..notices import Notice
from ..variants import layer_types, variant, variant_keys, variants
from .model_schema import ModelConfig
from .schema import DataConfig, RunConfig, TrainingConfig, split_shares


def validated(origins: dict, rules, section) -> None:
    """Run ``rules(section)``; a failed rule is a ConfigError naming the key, where it was set last (a file or
    "the command line"; nothing for a default) and the rule."""
    try:
        rules(section)
    except InvalidValue as e:
        where = origins.get(e.key) or origins.get(e.key.split(".")[0])
        where = f" in {where}" if where else ""
        raise ConfigError(f"invalid value for '{e.key}'{where}: {e.value!r} ({e.rule})") from None


def resolve_model(m: ModelConfig) -> None:
    if m.num_kv_heads is None:
        m.num_kv_heads = m.num_attention_heads
    if m.head_dim is None and m.num_attention_heads >= 1:
        m.head_dim = m.hidden_size // m.num_attention_heads
    if m.intermediate_size is None:
        m.intermediate_size = 4 * m.hidden_size


def resolve_training(t: TrainingConfig) -> None:
    if t.lr_decay_iters is None:
        t.lr_decay_iters = t.train_iters
    if t.min_lr is None:
        t.min_lr = t.optimizer.params.lr / 10


def check_keys(obj: Any, section: Any, prefix: str = "") -> None:
    """Each key's own rule, declared beside it (``setting(rule=...)``, a variant's ``Key.rule``), for every key of
    ``obj`` that is set (not None): ``rule(value, section)`` says what the value must be when it is wrong. Nested
    settings (``optimizer.params.lr``) are checked under their dotted names; a nested section (the model's
    attention) is not."""
    for f in dataclasses.fields(obj):
        if f.metadata.get("section"):
            continue
        value, rule = getattr(obj, f.name), f.metadata.get("rule")
        if rule is not None and value is not None:
            problem = rule(value, section)
            check(problem is None, prefix + f.name, problem or "", value)
        if dataclasses.is_dataclass(value):
            check_keys(value, section, f"{prefix}{f.name}.")


def check_model(m: ModelConfig) -> None:
    """Each model key's rule, then the rules between keys."""
    check_keys(m, m)
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
    check(m.rotary_ndims % 2 == 0, "rotary_pct", f"head_dim * rotary_pct = {m.rotary_ndims} must be even",
          m.rotary_pct)
    check(not (m.gpt_j_residual and m.norm_position == "post"), "norm_position",
          "'post' (a norm after each sub-layer) needs gpt_j_residual: false (sequential sub-layers)", m.norm_position)


def check_attention(m: ModelConfig) -> None:
    """Each attention key's rule (a variant's keys whichever variant is chosen), the rules of each variant in use,
    and a warning for every variant key set to a non-default value that no variant in use reads (it has no
    effect)."""
    a = m.attention
    if a.attention_type not in variants() and a.attention_config is None:
        close = difflib.get_close_matches(a.attention_type, list(variants()), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise InvalidValue("attention_type", f"choose one of {', '.join(variants())}{hint}", a.attention_type)
    used = list(dict.fromkeys(layer_types(m)))  # registered names only: resolve_layout checked attention_config
    check_keys(a, m)
    for name in used:
        variant(name).validate(m)
        variant(name).check_kernel_shape(m)
    reads = frozenset().union(*(variant(name).reads_keys() for name in used))
    for key, (spec, owners) in variant_keys().items():
        if key not in reads and getattr(a, key) != spec.default:
            warnings.warn(f"'{key}' is set but attention_type is '{a.attention_type}' (it is read only by "
                          f"{', '.join(owners)}); it has no effect", Notice, stacklevel=5)


def check_training(t: TrainingConfig) -> None:
    """Each training key's rule, then the rules between keys."""
    check_keys(t, t)
    check(0 <= t.min_lr <= t.optimizer.params.lr, "min_lr", "must be in [0, optimizer.params.lr]", t.min_lr)
    if t.train_batch_size is not None:
        per_rank = t.train_micro_batch_size_per_gpu * (t.gradient_accumulation_steps or 1)
        check(t.train_batch_size >= 1 and t.train_batch_size % per_rank == 0, "train_batch_size",
              f"must be a positive multiple of micro batch * gradient_accumulation_steps = {per_rank}",
              t.train_batch_size)


def check_data(d: DataConfig) -> None:
    """Each data key's rule, then the rules between keys."""
    check_keys(d, d)
    check(not (d.data_path and d.train_data_paths), "data_path", "and train_data_paths both name the training data "
          "(data_path would be ignored): set one of them, as GPT-NeoX requires", d.data_path)
    for part in ("train", "valid"):
        weights, paths = getattr(d, f"{part}_data_weights"), getattr(d, f"{part}_data_paths")
        if weights is not None:
            check(paths is not None and len(weights) == len(paths), f"{part}_data_weights",
                  f"needs one weight per entry of {part}_data_paths", weights)
            check(all(w >= 0 for w in weights) and 0 < sum(weights) < math.inf, f"{part}_data_weights",
                  "must be non-negative, with a positive and finite sum", weights)
    if d.data_path:
        check(split_shares(d.split)[0] > 0, "split", "gives training no share of data_path's documents (the first "
              "of 'train,valid,test')", d.split)
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


def check_run(r: RunConfig) -> None:
    """Each run key's rule (no rules between them)."""
    check_keys(r, r)
