"""One typed, validated configuration for model, data and training.

Configs are YAML files with GPT-NeoX key names. Several files layer: a key in a
later file overrides the same key in an earlier one (nested mappings merge key
by key), then ``key=value`` overrides from the command line apply, with dotted
paths for nested keys (``optimizer.params.lr=3e-4``). Hyphens and underscores
in keys are the same key, as in GPT-NeoX.

Every error (unknown key, wrong type, impossible value, missing file, malformed
YAML) is a :class:`ConfigError` with a one-line message naming the key and the
file it came from, raised before any work starts.

    python -m neox_dar.config configs/pythia-70m.yml configs/attention/dar.yml dar_d_down=64
    python -m neox_dar.config --reference      # Markdown reference of every key
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import sys
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

ATTENTION_TYPES = ("vanilla", "dar", "uniform", "swa", "mswa", "aha")


class ConfigError(ValueError):
    """A configuration problem, reported as one line before any work starts."""


def _f(default: Any, help: str) -> Any:
    """A dataclass field with a default and a one-line description."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help})
    if dataclasses.is_dataclass(default):
        return field(default_factory=lambda d=default: dataclasses.replace(d), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class OptimizerParams:
    lr: float = _f(1e-3, "Peak learning rate.")
    betas: tuple[float, float] = _f((0.9, 0.95), "Adam beta1, beta2 (Pythia: 0.9, 0.95).")
    eps: float = _f(1e-8, "Adam epsilon.")


@dataclass
class OptimizerConfig:
    type: Literal["Adam", "AdamW"] = _f("Adam", "Optimizer; Adam with decoupled weight decay as in GPT-NeoX (AdamW).")
    params: OptimizerParams = _f(OptimizerParams(), "Optimizer hyper-parameters.")


@dataclass
class ZeroConfig:
    stage: int = _f(1, "DeepSpeed ZeRO stage 0..3.")
    allgather_partitions: bool = _f(True, "DeepSpeed ZeRO allgather_partitions.")
    allgather_bucket_size: int = _f(500_000_000, "DeepSpeed ZeRO allgather bucket size (elements).")
    overlap_comm: bool = _f(True, "Overlap gradient reduction with backward.")
    reduce_scatter: bool = _f(True, "Use reduce-scatter for gradients.")
    reduce_bucket_size: int = _f(500_000_000, "DeepSpeed ZeRO reduce bucket size (elements).")
    contiguous_gradients: bool = _f(True, "Copy gradients to a contiguous buffer.")
    cpu_offload: bool = _f(False, "GPT-NeoX's ZeRO-Offload switch; only false is supported (Pythia configs carry it).")


@dataclass
class Config:
    # ---- model (GPT-NeoX names) -------------------------------------------------
    num_layers: int = _f(6, "Transformer layers.")
    hidden_size: int = _f(512, "Model width d.")
    num_attention_heads: int = _f(8, "Attention heads H; head dim is hidden_size / H.")
    seq_length: int = _f(2048, "Training sequence length.")
    max_position_embeddings: int = _f(2048, "Longest position the model supports (>= seq_length).")
    rotary_pct: float = _f(0.25, "Fraction of each head's dims that get rotary embeddings.")
    rotary_emb_base: int = _f(10000, "Rotary base.")
    gpt_j_residual: bool = _f(True, "Parallel residual: x + attn(ln1(x)) + mlp(ln2(x)).")
    norm: Literal["layernorm"] = _f("layernorm", "Normalization layer.")
    layernorm_epsilon: float = _f(1e-5, "LayerNorm epsilon.")
    activation: Literal["gelu"] = _f("gelu", "MLP activation (exact erf GeLU).")
    no_weight_tying: bool = _f(True, "Untied input and output embeddings (Pythia: true).")
    vocab_size: int = _f(50277, "Tokenizer vocabulary size before padding (Pythia tokenizer: 50277).")
    make_vocab_size_divisible_by: int = _f(128, "Pad the vocabulary to a multiple of this.")
    init_method: Literal["small_init", "normal"] = _f("small_init", "Init of input-side weights: small_init std sqrt(2/(5d)).")
    output_layer_init_method: Literal["wang_init", "normal"] = _f(
        "wang_init", "Init of the layer-output projections: wang_init std 2/(L*sqrt(d))."
    )
    init_method_std: float = _f(0.02, "Std for the 'normal' init methods.")
    attention_dropout: float = _f(0.0, "Dropout on attention probabilities: only 0 is supported (Pythia: 0).")
    hidden_dropout: float = _f(0.0, "Dropout on residual branches (Pythia: 0).")

    # ---- attention variants (ours) ----------------------------------------------
    attention_type: Literal["vanilla", "dar", "uniform", "swa", "mswa", "aha"] = _f(
        "vanilla", "Attention variant: vanilla | dar | uniform | swa | mswa | aha."
    )
    window_size: int = _f(128, "Window w: key j is inside when i - j < w (dar, swa, mswa base, aha local path).")
    dar_d_down: Optional[int] = _f(None, "DAR/uniform bottleneck width, 1..hidden_size (default hidden_size // 4).")
    mswa_variant: Literal["full", "heads", "layers"] = _f("full", "MSWA: vary windows over heads and layers, heads only, or layers only.")
    mswa_windows: Optional[list[list[int]]] = _f(None, "MSWA explicit window table [num_layers][num_attention_heads]; overrides the rule.")
    aha_threshold: float = _f(0.5, "AHA router threshold tau on sigmoid scores.")
    aha_l1_coef: float = _f(3e-4, "AHA L1 coefficient lambda on mean router score.")
    aha_ste: Literal["selected", "difference"] = _f(
        "selected", "AHA straight-through dL/ds: selected (SPEC: signed <dL/do, selected path>) or "
        "difference (<dL/do, Full - Local>; one extra attention forward per layer in training)."
    )
    attention_impl: Literal["auto", "reference", "triton", "sdpa"] = _f(
        "auto", "auto (triton on CUDA, else sdpa) | reference (materialized masks) | triton | sdpa."
    )

    # ---- batch and schedule ------------------------------------------------------
    train_batch_size: Optional[int] = _f(None, "Global batch in sequences = micro * grad_accum * data-parallel size.")
    train_micro_batch_size_per_gpu: int = _f(4, "Sequences per device per micro-step.")
    gradient_accumulation_steps: Optional[int] = _f(None, "Micro-steps per optimizer step (derived from train_batch_size when unset).")
    train_iters: int = _f(1000, "Optimizer steps.")
    lr_decay_iters: Optional[int] = _f(None, "Steps over which the LR decays (default train_iters).")
    lr_decay_style: Literal["cosine", "linear", "constant"] = _f("cosine", "LR decay after warmup.")
    warmup: float = _f(0.01, "Warmup as a fraction of lr_decay_iters (Pythia: 0.01).")
    min_lr: Optional[float] = _f(None, "Final LR (default optimizer.params.lr / 10, the Pythia recipe).")
    optimizer: OptimizerConfig = _f(OptimizerConfig(), "Optimizer type and params.")
    weight_decay: float = _f(0.1, "Weight decay (not applied to biases and norm weights).")
    gradient_clipping: float = _f(1.0, "Clip the global gradient norm to this (0 disables).")
    zero_optimization: ZeroConfig = _f(ZeroConfig(), "DeepSpeed ZeRO settings.")
    precision: Literal["auto", "fp32", "fp16", "bf16", "bfloat16"] = _f("auto", "auto: bf16 on GPU, fp32 on CPU.")
    seed: int = _f(1234, "Random seed, 0..2**32-1 (numpy's RandomState range).")
    checkpoint_activations: bool = _f(False, "Recompute each layer in backward to save memory.")
    torch_compile: bool = _f(False, "Compile the model with torch.compile.")

    # ---- data ---------------------------------------------------------------------
    data_path: Optional[str] = _f(None, "Prefix of one .bin/.idx dataset, split by `split`.")
    train_data_paths: Optional[list[str]] = _f(None, "Prefixes of training datasets (blend).")
    train_data_weights: Optional[list[float]] = _f(None, "Blend weights for train_data_paths.")
    valid_data_paths: Optional[list[str]] = _f(None, "Prefixes of validation datasets (blend).")
    valid_data_weights: Optional[list[float]] = _f(None, "Blend weights for valid_data_paths (unset: equal, as GPT-NeoX).")
    split: str = _f("969,30,1", "train,valid,test shares of data_path's documents (',' or '/'; missing shares are 0).")
    data_shuffle: bool = _f(True, "Shuffle documents and samples (seeded); false reads samples in file order (Pythia's preshuffled data).")
    data_fixed_length: Optional[bool] = _f(
        None, "One document per sample (every document must hold seq_length + 1 tokens, e.g. Pythia's 2049-token Pile) "
        "instead of GPT-NeoX's packing; unset: only when data_shuffle is false and every document has that length.")
    data_token_check: Literal["full", "sample", "skip"] = _f(
        "full", "Start-up check that token ids are in [0, vocab_size): full scan of each .bin (cached by file size and "
        "mtime), sample (64 windows of 1M tokens) or skip; headers and sizes are always checked.")
    data_cache_path: Optional[str] = _f(None, "Directory for cached index maps (default: next to the data).")
    vocab_file: Optional[str] = _f(None, "Tokenizer file (HF tokenizer.json or SentencePiece model).")
    tokenizer_type: Literal["HFTokenizer", "SPMTokenizer"] = _f("HFTokenizer", "Tokenizer kind.")
    num_workers: int = _f(2, "Data-loader worker processes.")

    # ---- checkpoints and logs ---------------------------------------------------------
    save: Optional[str] = _f(None, "Run directory: checkpoints, metrics.jsonl, resolved config.")
    load: Optional[str] = _f(None, "Checkpoint directory to resume from (default: save, when it holds one).")
    resume: Literal["auto", "never"] = _f(
        "auto", "auto: continue this run from the newest complete checkpoint in save (else start from load's); "
        "never: start fresh.")
    overwrite: bool = _f(False, "Discard checkpoints, metrics, status and evaluations of another run found in save "
                                "(without it such a save is an error).")
    checkpoint_factor: int = _f(1000, "Save a checkpoint every this many steps.")
    keep_last_n: int = _f(2, "Keep this many newest checkpoints.")
    exit_interval: Optional[int] = _f(None, "Checkpoint and stop (exit code 3) after every step divisible by this; rerun to continue.")
    log_interval: int = _f(10, "Log every this many steps.")
    eval_interval: int = _f(1000, "Validate every this many steps (0 disables).")
    eval_iters: int = _f(10, "Validation global batches (train_batch_size sequences each) per evaluation, GPT-NeoX's count.")
    eval_mode: Literal["continuous", "fixed"] = _f(
        "continuous", "continuous (GPT-NeoX): each evaluation reads the next eval_iters batches of the validation set; "
        "fixed: every evaluation reads the first eval_iters batches (the same data each time).")
    use_wandb: bool = _f(False, "Log to Weights & Biases (rank 0 only; WANDB_MODE=offline works).")
    wandb_project: str = _f("neox-dar", "W&B project.")
    wandb_group: Optional[str] = _f(None, "W&B group (a sweep's name).")
    wandb_run_name: Optional[str] = _f(None, "W&B run name.")
    wandb_team: Optional[str] = _f(None, "W&B entity.")
    tensorboard_dir: Optional[str] = _f(None, "Write TensorBoard events here.")
    peak_flops: Optional[float] = _f(None, "Peak FLOP/s per device for MFU (default: detected device).")

    # ---- derived values (computed once from the keys above) --------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_ndims(self) -> int:
        return int(self.head_dim * self.rotary_pct)

    @property
    def padded_vocab_size(self) -> int:
        m = self.make_vocab_size_divisible_by
        return int(math.ceil(self.vocab_size / m) * m)

    @property
    def d_down(self) -> int:
        """The DAR/uniform bottleneck width (``dar_d_down`` or ``hidden_size // 4``)."""
        return self.dar_d_down if self.dar_d_down is not None else max(1, self.hidden_size // 4)

    @property
    def decay_iters(self) -> int:
        return self.lr_decay_iters if self.lr_decay_iters is not None else self.train_iters

    @property
    def warmup_iters(self) -> int:
        return int(self.warmup * self.decay_iters)

    @property
    def final_lr(self) -> float:
        return self.min_lr if self.min_lr is not None else self.optimizer.params.lr / 10

    @property
    def dtype_name(self) -> str:
        """Resolved precision: 'bf16', 'fp16' or 'fp32' ('auto' -> bf16 with CUDA)."""
        if self.precision == "auto":
            import torch

            return "bf16" if torch.cuda.is_available() else "fp32"
        return "bf16" if self.precision == "bfloat16" else self.precision

    def gradient_accumulation_for(self, world_size: int) -> int:
        """Micro-steps per optimizer step for a data-parallel size; raises ConfigError on mismatch."""
        micro = self.train_micro_batch_size_per_gpu
        if self.train_batch_size is None:
            return self.gradient_accumulation_steps or 1
        per_step = micro * world_size
        if self.gradient_accumulation_steps is not None:
            if self.train_batch_size != per_step * self.gradient_accumulation_steps:
                raise ConfigError(
                    f"train_batch_size={self.train_batch_size} != train_micro_batch_size_per_gpu ({micro}) "
                    f"* gradient_accumulation_steps ({self.gradient_accumulation_steps}) * world size ({world_size})"
                )
            return self.gradient_accumulation_steps
        if self.train_batch_size % per_step:
            raise ConfigError(
                f"train_batch_size={self.train_batch_size} is not divisible by train_micro_batch_size_per_gpu "
                f"({micro}) * world size ({world_size})"
            )
        return self.train_batch_size // per_step

    def global_batch_for(self, world_size: int) -> int:
        return self.train_micro_batch_size_per_gpu * world_size * self.gradient_accumulation_for(world_size)

    # ---- serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict:
        return _to_plain(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> "Config":
        data, origins = _normalize_keys(data, source, ""), {}
        _merge({}, data, origins, source)  # every key comes from `source`
        cfg = _build(cls, data, origins, source, "")
        _validate(cfg, origins)
        return cfg


# ----------------------------------------------------------------------------------
# validation rules


class _InvalidValue(ConfigError):
    """A failed value rule; :func:`_validate` turns it into the one-line message."""

    def __init__(self, key: str, rule: str, value: Any):
        super().__init__(key, rule, value)
        self.key, self.rule, self.value = key, rule, value


def _check(ok: bool, key: str, rule: str, value: Any) -> None:
    if not ok:
        raise _InvalidValue(key, rule, value)


def _validate(c: Config, origins: dict[str, str] | None = None) -> None:
    """Check every value rule; a failure is a ConfigError naming the key, where it was set last (a file or
    "the command line", from ``origins``; nothing for a default) and the rule."""
    try:
        _check_values(c)
    except _InvalidValue as e:
        where = (origins or {}).get(e.key)
        where = f" in {where}" if where else ""
        raise ConfigError(f"invalid value for '{e.key}'{where}: {e.value!r} ({e.rule})") from None


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


def _check_values(c: Config) -> None:
    """Cross-key value rules; each failure names the key and the rule."""
    for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "max_position_embeddings",
                "vocab_size", "make_vocab_size_divisible_by", "train_micro_batch_size_per_gpu", "train_iters",
                "checkpoint_factor", "keep_last_n", "log_interval", "eval_iters", "rotary_emb_base"):
        _check(getattr(c, key) >= 1, key, "must be >= 1", getattr(c, key))
    _check(c.hidden_size % c.num_attention_heads == 0, "hidden_size",
           f"must be divisible by num_attention_heads={c.num_attention_heads}", c.hidden_size)
    _check(c.seq_length <= c.max_position_embeddings, "seq_length",
           f"must be <= max_position_embeddings={c.max_position_embeddings}", c.seq_length)
    _check(0.0 <= c.rotary_pct <= 1.0, "rotary_pct", "must be in [0, 1]", c.rotary_pct)
    _check(c.rotary_ndims % 2 == 0, "rotary_pct",
           f"head_dim * rotary_pct = {c.rotary_ndims} must be even", c.rotary_pct)
    _check(c.layernorm_epsilon > 0, "layernorm_epsilon", "must be > 0", c.layernorm_epsilon)
    _check(0.0 <= c.hidden_dropout < 1.0, "hidden_dropout", "must be in [0, 1)", c.hidden_dropout)
    _check(c.attention_dropout == 0.0, "attention_dropout", "only 0 is supported (no attention path applies dropout)",
           c.attention_dropout)
    _check(c.window_size >= 0, "window_size", "must be >= 0", c.window_size)
    if c.dar_d_down is not None:
        _check(1 <= c.dar_d_down <= c.hidden_size, "dar_d_down", f"must be in 1..hidden_size={c.hidden_size}", c.dar_d_down)
    _check(0.0 < c.aha_threshold < 1.0, "aha_threshold", "must be in (0, 1)", c.aha_threshold)
    _check(c.aha_l1_coef >= 0, "aha_l1_coef", "must be >= 0", c.aha_l1_coef)
    if c.attention_type in ("swa", "mswa", "aha"):
        _check(c.window_size >= 1, "window_size", f"must be >= 1 for attention_type '{c.attention_type}'", c.window_size)
    if c.mswa_windows is not None:
        table = c.mswa_windows
        _check(len(table) == c.num_layers and all(len(r) == c.num_attention_heads for r in table), "mswa_windows",
               f"must be a table of num_layers={c.num_layers} rows of num_attention_heads={c.num_attention_heads} windows",
               table)
        _check(all(w >= 1 for r in table for w in r), "mswa_windows", "every window must be >= 1", table)
    _warn_unused_attention_keys(c)

    _check(c.optimizer.params.lr > 0, "optimizer.params.lr", "must be > 0", c.optimizer.params.lr)
    _check(all(0.0 <= b < 1.0 for b in c.optimizer.params.betas), "optimizer.params.betas", "each must be in [0, 1)",
           c.optimizer.params.betas)
    _check(c.optimizer.params.eps > 0, "optimizer.params.eps", "must be > 0", c.optimizer.params.eps)
    if c.min_lr is not None:
        _check(0 <= c.min_lr <= c.optimizer.params.lr, "min_lr", "must be in [0, optimizer.params.lr]", c.min_lr)
    _check(0.0 <= c.warmup <= 1.0, "warmup", "is a fraction of lr_decay_iters, must be in [0, 1]", c.warmup)
    if c.lr_decay_iters is not None:
        _check(c.lr_decay_iters >= 1, "lr_decay_iters", "must be >= 1", c.lr_decay_iters)
    _check(c.weight_decay >= 0, "weight_decay", "must be >= 0", c.weight_decay)
    _check(c.gradient_clipping >= 0, "gradient_clipping", "must be >= 0", c.gradient_clipping)
    _check(0 <= c.zero_optimization.stage <= 3, "zero_optimization.stage", "must be 0, 1, 2 or 3", c.zero_optimization.stage)
    _check(not c.zero_optimization.cpu_offload, "zero_optimization.cpu_offload",
           "ZeRO-Offload is not supported: use a higher zero_optimization.stage", c.zero_optimization.cpu_offload)
    if c.gradient_accumulation_steps is not None:
        _check(c.gradient_accumulation_steps >= 1, "gradient_accumulation_steps", "must be >= 1", c.gradient_accumulation_steps)
    if c.train_batch_size is not None:
        per_rank = c.train_micro_batch_size_per_gpu * (c.gradient_accumulation_steps or 1)
        _check(c.train_batch_size >= 1 and c.train_batch_size % per_rank == 0, "train_batch_size",
               f"must be a positive multiple of micro batch * gradient_accumulation_steps = {per_rank}", c.train_batch_size)
    _check(c.eval_interval >= 0, "eval_interval", "must be >= 0", c.eval_interval)
    if c.exit_interval is not None:
        _check(c.exit_interval >= 1, "exit_interval", "must be >= 1", c.exit_interval)
    _check(c.num_workers >= 0, "num_workers", "must be >= 0", c.num_workers)
    _check(0 <= c.seed <= 2**32 - 1, "seed", "must be in [0, 2**32 - 1], numpy RandomState's range", c.seed)
    if c.data_cache_path is not None:
        _check(bool(str(c.data_cache_path).strip()), "data_cache_path", "must be a directory path", c.data_cache_path)
    for part in ("train", "valid"):
        weights, paths = getattr(c, f"{part}_data_weights"), getattr(c, f"{part}_data_paths")
        if weights is not None:
            _check(paths is not None and len(weights) == len(paths), f"{part}_data_weights",
                   f"needs one weight per entry of {part}_data_paths", weights)
            _check(all(w >= 0 for w in weights) and sum(weights) > 0, f"{part}_data_weights",
                   "must be non-negative with a positive sum", weights)
    _check(split_shares(c.split) is not None, "split",
           "must be 1 to 3 non-negative numbers 'train,valid,test' with a positive sum; missing shares are 0", c.split)


# Keys that define the model's weights and computation: a checkpoint continues only under the same values.
MODEL_KEYS = (
    "num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings", "rotary_pct", "rotary_emb_base",
    "gpt_j_residual", "norm", "layernorm_epsilon", "activation", "no_weight_tying", "vocab_size",
    "make_vocab_size_divisible_by", "attention_type", "window_size", "dar_d_down", "mswa_variant", "mswa_windows",
    "aha_threshold",
)


def model_config_diff(a: Config, b: Config) -> dict[str, tuple[Any, Any]]:
    """``{key: (value in a, value in b)}`` for the :data:`MODEL_KEYS` where two configs differ."""
    return {k: (getattr(a, k), getattr(b, k)) for k in MODEL_KEYS if getattr(a, k) != getattr(b, k)}


# Attention keys that only some variants read: a non-default value for another variant is a warning.
_VARIANT_KEYS = {
    "dar_d_down": ("dar", "uniform"),
    "mswa_windows": ("mswa",),
    "mswa_variant": ("mswa",),
    "aha_threshold": ("aha",),
    "aha_l1_coef": ("aha",),
    "aha_ste": ("aha",),
}


def _warn_unused_attention_keys(c: Config) -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    for key, users in _VARIANT_KEYS.items():
        if getattr(c, key) != defaults[key] and c.attention_type not in users:
            warnings.warn(f"'{key}' is set but attention_type is '{c.attention_type}' (it is read only by "
                          f"{', '.join(users)}); it has no effect", stacklevel=3)
    if c.attention_type == "uniform" and c.window_size not in (0, 128):
        warnings.warn("attention_type 'uniform' ignores window_size (every key uses the bottleneck)", stacklevel=3)


# ----------------------------------------------------------------------------------
# building a typed dataclass from plain data


def _normalize_keys(data: Any, source: str, prefix: str) -> Any:
    """Hyphens in mapping keys become underscores, recursively."""
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            if not isinstance(k, str):
                raise ConfigError(f"key {k!r} in {source} is not a string")
            out[k.replace("-", "_")] = _normalize_keys(v, source, f"{prefix}{k}.")
        return out
    return data


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
            raise ConfigError(f"invalid value for '{key}' in {source}: {value!r} (choose one of {', '.join(map(str, args))})")
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
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = prefix + key
        where = origins.get(full, origins.get(prefix.rstrip("."), source))
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
            raise ConfigError(f"unknown key '{full}' in {where}{hint}")
        kwargs[key] = _coerce(hints[key], value, full, where, origins)
    return cls(**kwargs)


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------
# loading files and overrides


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


# GPT-NeoX keys that only steer its fused kernels, model/pipeline parallelism or launcher. They are accepted so
# GPT-NeoX (e.g. Pythia) config files load as they are, and reported once, since they change nothing here.
NEOX_IGNORED_KEYS = frozenset({
    "output_layer_parallelism", "scaled_upper_triang_masked_softmax_fusion", "bias_gelu_fusion",
    "checkpoint_num_layers", "partition_activations", "synchronize_each_layer", "data_impl", "distributed_backend",
    "steps_per_print", "wall_clock_breakdown", "launcher", "deepspeed_slurm", "deepspeed_mpi", "extra_save_iters",
    "test_data_paths", "test_data_weights", "attention_config", "pos_emb",
    "pipe_parallel_size", "model_parallel_size",
})


def _translate_neox(merged: dict, origins: dict) -> None:
    """Map GPT-NeoX spellings onto our keys in place (``gas``, ``save_interval``, ``fp16``/``bf16`` blocks, ignored keys);
    reject the ones whose value would change the model in a way this project does not implement."""
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
    if "attention_config" in merged:
        kinds = {k for entry in merged["attention_config"] for k in entry[0]}
        if not kinds <= {"global", "flash"}:
            raise ConfigError(f"invalid value for 'attention_config' in {where('attention_config')}: {sorted(kinds)} "
                              f"(use attention_type for variants; GPT-NeoX sparse kinds are not supported)")
    ignored = sorted(k for k in merged if k in NEOX_IGNORED_KEYS)
    for k in ignored:
        del merged[k]
    if ignored:
        warnings.warn(f"GPT-NeoX keys with no effect in neox-dar ignored: {', '.join(ignored)}", stacklevel=3)


def load_config(*yaml_paths: str | Path, overrides: typing.Iterable[str] = ()) -> Config:
    """Layer YAML files (later wins) and ``key=value`` overrides into a validated :class:`Config`.

    GPT-NeoX config files load as they are: see :data:`NEOX_IGNORED_KEYS` and :func:`_translate_neox`."""
    merged: dict = {}
    origins: dict[str, str] = {}
    for path in yaml_paths:
        _merge(merged, _normalize_keys(_read_yaml(path), str(path), ""), origins, str(path))
    for item in overrides:
        parts, value = _parse_override(item)
        nested: dict = {parts[-1]: value}
        for part in reversed(parts[:-1]):
            nested = {part: nested}
        _merge(merged, _normalize_keys(nested, "the command line", ""), origins, "the command line")
    _translate_neox(merged, origins)
    cfg = _build(Config, merged, origins, "<config>", "")
    _validate(cfg, origins)
    return cfg


def split_args(args: typing.Sequence[str]) -> tuple[list[str], list[str]]:
    """Split command-line words into YAML paths and ``key=value`` overrides."""
    paths = [a for a in args if "=" not in a]
    overrides = [a for a in args if "=" in a]
    return paths, overrides


def derived_summary(cfg: Config) -> dict:
    """The values computed from the keys, for display."""
    out = {
        "head_dim": cfg.head_dim,
        "rotary_ndims": cfg.rotary_ndims,
        "padded_vocab_size": cfg.padded_vocab_size,
        "lr_decay_iters": cfg.decay_iters,
        "warmup_iters": cfg.warmup_iters,
        "min_lr": cfg.final_lr,
    }
    if cfg.attention_type in ("dar", "uniform"):
        out["dar_d_down"] = cfg.d_down
    return out


def reference_markdown() -> str:
    """A Markdown table of every key: name, type, default and meaning."""
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{f.name}.")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            if typing.get_origin(tp) is Literal:
                tname = " or ".join(map(str, typing.get_args(tp)))
            else:
                tname = str(tp).replace("typing.", "").replace("NoneType", "None").replace("|", "or")
            rows.append(f"| `{prefix}{f.name}` | {tname} | `{default!r}` | {f.metadata.get('help', '')} |")

    walk(Config, "")
    return "\n".join(rows) + "\n"


def main(argv: typing.Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if argv == ["--reference"]:
        print(reference_markdown(), end="")
        return 0
    paths, overrides = split_args(argv)
    try:
        cfg = load_config(*paths, overrides=overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    print(cfg.to_yaml(), end="")
    print("# derived: " + ", ".join(f"{k}={v}" for k, v in derived_summary(cfg).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
