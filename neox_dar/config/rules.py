"""The value rules of each section and the values resolved from other keys (``min_lr: null`` -> ``lr / 10``),
run when a config is loaded; a failed rule is a one-line ConfigError naming the key and where it was set
(:func:`validated`)."""

from __future__ import annotations

import difflib
import math
import warnings
from typing import Any

from ..attention import layer_types, variant, variant_keys, variants
from ..corpus_names import CORPORA
from ..settings import ConfigError, InvalidValue, check
from .schema import DataConfig, ModelConfig, RunConfig, TrainingConfig


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


def _at_least_one(section: Any, keys: tuple[str, ...]) -> None:
    for key in keys:
        check(getattr(section, key) >= 1, key, "must be >= 1", getattr(section, key))


def check_model(m: ModelConfig) -> None:
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


def check_attention(m: ModelConfig) -> None:
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


def check_training(t: TrainingConfig) -> None:
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


def check_data(d: DataConfig) -> None:
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


def check_run(r: RunConfig) -> None:
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
