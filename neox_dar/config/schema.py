"""The config's sections: model (with its attention, :mod:`.model_schema`), training, data and run (checkpoints and
logs).

Files and command lines use flat GPT-NeoX keys (``hidden_size``, ``dar_d_down``, ``optimizer.params.lr``); every
key belongs to exactly one section, which :data:`SECTIONS` and :func:`key_sections` say. The attention section is
built from the registered variants (:func:`~.model_schema.attention_config_class`). Values are resolved once, when a config is loaded (``dar_d_down: null`` becomes
``hidden_size // 4``, ``min_lr: null`` becomes ``lr / 10``): each value has one name.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, Optional

from ..config_fields import ConfigError, at_least, setting, when
from ..corpus_names import CORPORA
from .model_schema import ModelConfig, attention_config_class


@dataclass
class OptimizerParams:
    lr: float = setting(1e-3, "Peak learning rate.", rule=when(lambda v: v > 0, "must be > 0"))
    betas: tuple[float, float] = setting((0.9, 0.95), "Adam beta1, beta2 (Pythia: 0.9, 0.95).",
                                         rule=when(lambda v: all(0.0 <= b < 1.0 for b in v), "each must be in [0, 1)"))
    eps: float = setting(1e-8, "Adam epsilon.", rule=when(lambda v: v > 0, "must be > 0"))


@dataclass
class OptimizerConfig:
    type: Literal["Adam", "AdamW"] = setting("Adam", "Optimizer; Adam with decoupled weight decay as in GPT-NeoX "
                                                     "(AdamW).")
    params: OptimizerParams = setting(OptimizerParams(), "Optimizer hyper-parameters.")


@dataclass
class ZeroConfig:
    stage: int = setting(1, "DeepSpeed ZeRO stage 0..3.", rule=when(lambda v: 0 <= v <= 3, "must be 0, 1, 2 or 3"))
    allgather_partitions: bool = setting(True, "DeepSpeed ZeRO allgather_partitions.")
    allgather_bucket_size: int = setting(500_000_000, "DeepSpeed ZeRO allgather bucket size (elements).",
                                         rule=when(lambda v: v >= 1, "must be >= 1"))
    overlap_comm: bool = setting(True, "Overlap gradient reduction with backward.")
    reduce_scatter: bool = setting(True, "Use reduce-scatter for gradients.")
    reduce_bucket_size: int = setting(500_000_000, "DeepSpeed ZeRO reduce bucket size (elements).",
                                      rule=when(lambda v: v >= 1, "must be >= 1"))
    contiguous_gradients: bool = setting(True, "Copy gradients to a contiguous buffer.")
    stage3_param_persistence_threshold: int = setting(
        100_000, "ZeRO-3: parameters with fewer elements are kept whole on every rank instead of partitioned "
                 "(DeepSpeed's default); 0 partitions every parameter.",
        rule=when(lambda v: v >= 0, "must be >= 0"))
    cpu_offload: bool = setting(False, "GPT-NeoX's ZeRO-Offload switch; only false is supported (Pythia configs "
                                       "carry it).",
                                rule=when(lambda v: not v,
                                          "ZeRO-Offload is not supported: use a higher zero_optimization.stage"))


@dataclass
class Fp16Config:
    """GPT-NeoX's and DeepSpeed's ``fp16`` block: the loss scaling of ``precision: fp16``."""

    enabled: Optional[bool] = setting(None, "GPT-NeoX's switch: true means precision fp16 (a precision set to "
                                            "anything else besides auto is an error); unset or false: no effect.")
    loss_scale: float = setting(0.0, "Static loss scale; 0: dynamic loss scaling.",
                                rule=when(lambda v: v >= 0, "must be >= 0 (0: dynamic)"))
    initial_scale_power: int = setting(16, "Dynamic scaling starts at 2**initial_scale_power (Pythia: 12).",
                                       rule=when(lambda v: 0 <= v <= 64, "must be in 0..64"))
    loss_scale_window: int = setting(1000, "Steps without overflow before the dynamic scale doubles.",
                                     rule=when(lambda v: v >= 1, "must be >= 1"))
    hysteresis: int = setting(2, "Overflows tolerated before the dynamic scale halves.",
                              rule=when(lambda v: v >= 1, "must be >= 1"))
    min_loss_scale: float = setting(1.0, "The dynamic scale's floor.", rule=when(lambda v: v > 0, "must be > 0"))


@dataclass
class LoraConfig:
    r: int = setting(8, "LoRA rank.", rule=at_least(1))
    alpha: float = setting(16.0, "LoRA alpha (the update is scaled by alpha / r).",
                           rule=when(lambda v: v > 0, "must be > 0 (0 scales the adapters' update to nothing)"))
    dropout: float = setting(0.0, "Dropout on the LoRA path's input.",
                             rule=when(lambda v: 0 <= v < 1, "must be in [0, 1)"))
    target_modules: list[str] = setting(
        ["q_proj", "k_proj", "v_proj", "o_proj"], "Names of the linear layers that get adapters (peft's "
        "target_modules: a suffix of the module name; GPT-NeoX: query_key_value, dense).",
        rule=when(lambda v: len(v) > 0, "must name at least one linear layer"))


@dataclass
class TrainingConfig:
    """Batch, schedule, optimizer, precision, ZeRO, and what trains (trainable_params, lora)."""

    train_batch_size: Optional[int] = setting(None, "Global batch in sequences = micro * grad_accum * data-parallel "
                                                    "size.", label="bs")
    train_micro_batch_size_per_gpu: int = setting(4, "Sequences per device per micro-step.", rule=at_least(1))
    gradient_accumulation_steps: Optional[int] = setting(None, "Micro-steps per optimizer step (derived from "
                                                               "train_batch_size when unset).", rule=at_least(1))
    train_iters: int = setting(1000, "Optimizer steps.", label="iters", rule=at_least(1))
    lr_decay_iters: Optional[int] = setting(None, "Steps over which the LR decays (default train_iters).",
                                            rule=at_least(1))
    lr_decay_style: Literal["cosine", "linear", "constant"] = setting("cosine", "LR decay after warmup.")
    warmup: float = setting(0.01, "Warmup as a fraction of lr_decay_iters (Pythia: 0.01).",
                            rule=when(lambda v: 0.0 <= v <= 1.0, "is a fraction of lr_decay_iters, must be in [0, 1]"))
    min_lr: Optional[float] = setting(None, "Final LR (default optimizer.params.lr / 10, the Pythia recipe).")
    optimizer: OptimizerConfig = setting(OptimizerConfig(), "Optimizer type and params.")
    weight_decay: float = setting(0.1, "Weight decay (not applied to biases and norm weights).",
                                  rule=when(lambda v: v >= 0, "must be >= 0"))
    gradient_clipping: float = setting(1.0, "Clip the global gradient norm to this (0 disables).",
                                       rule=when(lambda v: v >= 0, "must be >= 0"))
    calculate_per_token_loss: bool = setting(
        False, "Weigh every labelled token of a step alike (Megatron's name; Hugging Face Trainer's weighting): the "
        "step's loss is its cross-entropy summed over every micro-batch and rank divided by its labelled tokens, and "
        "the validation loss likewise. false: each micro-batch's mean weighs the same (GPT-NeoX). Differs only where "
        "micro-batches hold different numbers of labelled tokens (chat SFT).")
    zero_optimization: ZeroConfig = setting(ZeroConfig(), "DeepSpeed ZeRO settings.")
    precision: Literal["auto", "fp32", "fp16", "bf16", "bfloat16"] = setting("auto", "auto: bf16 on GPU, fp32 on "
                                                                                     "CPU.")
    fp16: Fp16Config = setting(Fp16Config(), "Loss scaling of precision fp16 (DeepSpeed's and GPT-NeoX's fp16 block).")
    seed: int = setting(1234, "Random seed, 0..2**32-1 (numpy's RandomState range).", label="seed",
                        rule=when(lambda v: 0 <= v <= 2**32 - 1,
                                  "must be in [0, 2**32 - 1], numpy RandomState's range"))
    checkpoint_activations: bool = setting(False, "Recompute each layer in backward to save memory.")
    trainable_params: Optional[list[str]] = setting(
        None, "fnmatch patterns over parameter names selecting what trains, e.g. ['*.dar_down.*', '*.dar_up.*'] "
        "(unset: everything; with lora: the adapters plus these). Frozen parameters get no gradient and no optimizer "
        "state; a pattern matching no parameter is an error.",
        rule=when(bool, "must name at least one pattern (unset it to train every parameter)"))
    lora: Optional[LoraConfig] = setting(
        None, "LoRA adapters (peft) on target_modules: r, alpha, dropout, target_modules; the base weights freeze "
        "(trainable_params adds more), checkpoints' model.safetensors hold the merged weights.")
    torch_compile: bool = setting(
        False, "Compile the model with torch.compile (DeepSpeed's engine.compile); the Triton attention kernels "
        "and the loss are traced without a graph break. Not with zero_optimization.stage 3.",
        rule=lambda value, t: None if not value or t.zero_optimization.stage < 3 else
        "is not supported with zero_optimization.stage 3 (dynamo traces ZeRO-3's partitioned parameters as empty "
        "tensors and stops; the eager step runs): use stage 1 or 2, or torch_compile: false")
    torch_compile_backend: Literal["inductor", "aot_eager", "eager"] = setting(
        "inductor", "torch.compile's backend with torch_compile: inductor (fused kernels, the fast one), aot_eager "
        "or eager (trace only, for debugging).")
    torch_compile_mode: Optional[Literal["default", "reduce-overhead", "max-autotune",
                                         "max-autotune-no-cudagraphs"]] = setting(
        None, "torch.compile's mode with the inductor backend (Hugging Face's torch_compile_mode): reduce-overhead "
        "replays the step's kernels from CUDA graphs (no host cost per launch), max-autotune also tunes inductor's "
        "kernels (minutes of compilation); unset: torch's default.",
        rule=lambda value, t: None if t.torch_compile_backend == "inductor" else
        f"needs torch_compile_backend: inductor (torch.compile takes a mode or a backend, not both), got "
        f"'{t.torch_compile_backend}'")

    @property
    def warmup_iters(self) -> float:
        """``warmup * lr_decay_iters`` steps, not rounded (GPT-NeoX's ``warmup_iter``): step ``s`` of the warmup
        runs at ``lr * s / warmup_iters``."""
        return self.warmup * self.lr_decay_iters

    @property
    def dtype(self) -> str:
        """Resolved precision: 'bf16', 'fp16' or 'fp32' ('auto' -> bf16 with CUDA, fp32 without)."""
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
                    f"* gradient_accumulation_steps ({self.gradient_accumulation_steps}) * world size ({world_size})")
            return self.gradient_accumulation_steps
        if self.train_batch_size % per_step:
            fits = self.micro_batches_that_fit(world_size, 2 * micro)
            hint = (f"; micro-batches that fit {world_size} ranks: {', '.join(map(str, fits))}" if fits else
                    f"; {world_size} ranks do not divide it: a global batch of {world_size * micro} x k would")
            raise ConfigError(f"train_batch_size={self.train_batch_size} is not divisible by "
                              f"train_micro_batch_size_per_gpu ({micro}) * world size ({world_size}){hint}")
        return self.train_batch_size // per_step

    def micro_batches_that_fit(self, world_size: int, most: int) -> list[int]:
        """The micro-batches up to ``most`` that divide ``train_batch_size`` over ``world_size`` ranks, ascending ([]
        when the ranks do not divide it)."""
        per_rank, rest = divmod(self.train_batch_size, world_size)
        return [] if rest else [m for m in range(1, min(per_rank, most) + 1) if per_rank % m == 0]

    def global_batch_for(self, world_size: int) -> int:
        return self.train_micro_batch_size_per_gpu * world_size * self.gradient_accumulation_for(world_size)


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


@dataclass
class DataConfig:
    """Training and validation datasets."""

    data_path: Optional[str] = setting(None, "Prefix of one .bin/.idx dataset, split by `split`.")
    train_data_paths: Optional[list[str]] = setting(None, "Prefixes of training datasets (blend).")
    train_data_weights: Optional[list[float]] = setting(None, "Blend weights for train_data_paths.")
    valid_data_paths: Optional[list[str]] = setting(None, "Prefixes of validation datasets (blend).")
    valid_data_weights: Optional[list[float]] = setting(None, "Blend weights for valid_data_paths (unset: equal, as "
                                                              "GPT-NeoX).")
    train_label_data_paths: Optional[list[str]] = setting(
        None, "Label datasets of train_data_paths, one per path (data_prep.chat's PREFIX_label: the token where the "
        "loss is on, -100 where off). With labels every sample is one conversation, padded per micro-batch and "
        "grouped by length, never packed with another.")
    valid_label_data_paths: Optional[list[str]] = setting(None, "Label datasets of valid_data_paths, one per path.")
    split: str = setting("969,30,1", "train,valid,test shares of data_path's documents (',' or '/'; missing shares "
                                     "are 0).",
                         rule=when(lambda v: split_shares(v) is not None, "must be 1 to 3 non-negative numbers "
                                   "'train,valid,test' with a positive sum; missing shares are 0"))
    data_shuffle: bool = setting(True, "Shuffle documents and samples (seeded); false reads samples in file order "
                                       "(Pythia's preshuffled data).")
    data_fixed_length: Optional[bool] = setting(
        None, "One document per sample (every document must hold seq_length + 1 tokens, e.g. Pythia's 2049-token "
        "Pile) instead of GPT-NeoX's packing; unset: only when data_shuffle is false and every document has that "
        "length.")
    data_token_check: Literal["full", "sample", "skip"] = setting(
        "full", "Start-up check that token ids are in [0, vocab_size): full scan of each .bin (cached by file size "
        "and mtime), sample (64 windows of 1M tokens) or skip; headers and sizes are always checked.")
    data_cache_path: Optional[str] = setting(None, "Directory for cached index maps (default: next to the data).",
                                             rule=when(lambda v: bool(v.strip()), "must be a directory path"))
    num_workers: int = setting(2, "Data-loader worker processes.", rule=at_least(0))


@dataclass
class CorpusEvalConfig:
    interval: int = setting(0, "Every this many steps (and after the last), the rolling-window perplexity of the "
                               "evaluation corpora inside the training job, sharded over the ranks: logged and written "
                               "to {save}/eval/step_N.json (DAR Fig. 3). 0: never.", rule=at_least(0))
    source: Literal["local", "hub"] = setting("local", "Corpora from data/eval (local) or the Hugging Face Hub.")
    corpora: list[str] = setting(["fineweb_edu", "c4", "wikitext103"], "Corpora to score (fineweb_edu, c4, "
                                                                        "wikitext103).",
                                 rule=when(lambda v: bool(v) and all(c in CORPORA for c in v),
                                           f"must be a non-empty list of {', '.join(CORPORA)}"))
    max_docs: Optional[int] = setting(None, "Documents per corpus (unset: every local document; the Hub's documented "
                                            "default counts).", rule=at_least(1))
    batch_size: int = setting(8, "Windows per forward.", rule=at_least(1))


@dataclass
class RunConfig:
    """The run directory, checkpoints, validation and logs."""

    save: Optional[str] = setting(None, "Run directory: checkpoints, metrics.jsonl, resolved config.")
    load: Optional[str] = setting(None, "Checkpoint directory to start from when save holds none (run dir, its "
                                        "checkpoints/ or one step dir).")
    finetune: bool = setting(
        False, "Start from load='s weights only (a from-hf import or another run's checkpoint; parameters it lacks, "
        "such as a variant's, are new and initialised by the variant's *_init keys) with a fresh optimizer, LR "
        "schedule and step count (GPT-NeoX's finetune). A stage of a multi-stage recipe.")
    resume: Literal["auto", "never"] = setting(
        "auto", "auto: continue this run from the newest complete checkpoint in save (else start from load's); "
        "never: start fresh.")
    overwrite: bool = setting(False, "Discard checkpoints, metrics, status and evaluations of another run found in "
                                     "save (without it such a save is an error).")
    checkpoint_factor: int = setting(1000, "Save a checkpoint every this many steps.", rule=at_least(1))
    checkpoint_minutes: Optional[float] = setting(
        None, "Also save a checkpoint once this many minutes of wall time have passed since the last save (or the "
        "start), so a lost node costs at most that much training; the ranks agree on the step (unset: by steps "
        "only).", rule=when(lambda v: v > 0, "must be a positive number of minutes"))
    keep_last_n: Optional[int] = setting(2, "Keep this many newest checkpoints; null keeps every one (what a GPT-NeoX "
                                         "config without keep_last_n_checkpoints means).", rule=at_least(1))
    exit_interval: Optional[int] = setting(None, "Checkpoint and stop (exit code 3) after every step divisible by "
                                                 "this; rerun to continue.", rule=at_least(1))
    log_interval: int = setting(10, "Log every this many steps.", rule=at_least(1))
    eval_interval: int = setting(1000, "Validate every this many steps (0 disables).", rule=at_least(0))
    eval_iters: int = setting(10, "Validation global batches (train_batch_size sequences each) per evaluation, "
                                  "GPT-NeoX's count.", rule=at_least(1))
    eval_mode: Literal["continuous", "fixed"] = setting(
        "continuous", "continuous (GPT-NeoX): each evaluation reads the next eval_iters batches of the validation "
        "set; fixed: every evaluation reads the first eval_iters batches (the same data each time).")
    use_wandb: bool = setting(False, "Log to Weights & Biases (rank 0 only; WANDB_MODE=offline works).")
    wandb_project: str = setting("neox-dar", "W&B project.")
    wandb_group: Optional[str] = setting(None, "W&B group (a sweep's name).")
    wandb_run_name: Optional[str] = setting(None, "W&B run name.")
    wandb_team: Optional[str] = setting(None, "W&B entity.")
    tensorboard_dir: Optional[str] = setting(None, "Write TensorBoard events here.")
    peak_flops: Optional[float] = setting(None, "Peak FLOP/s per device for MFU (default: detected device).")
    eval_perplexity: CorpusEvalConfig = setting(CorpusEvalConfig(), "Perplexity of the evaluation corpora during "
                                                                    "training: interval, source, corpora, max_docs, "
                                                                    "batch_size.")


# section name -> dataclass, in file order; the model's attention is the "attention" section
SECTIONS: dict[str, type] = {"model": ModelConfig, "training": TrainingConfig, "data": DataConfig,
                             "run": RunConfig}


def section_fields(name: str) -> list[dataclasses.Field]:
    """The keys of one section ("model", "attention", "training", "data", "run"), as dataclass fields."""
    cls = attention_config_class() if name == "attention" else SECTIONS[name]
    return [f for f in dataclasses.fields(cls) if not f.metadata.get("section")]


def key_sections() -> dict[str, str]:
    """Every top-level flat key -> its section, in file order (model, attention, training, data, run)."""
    out = {}
    for name in ("model", "attention", "training", "data", "run"):
        out.update({f.name: name for f in section_fields(name)})
    return out


def key_field(key: str) -> dataclasses.Field | None:
    """The field of a top-level flat key (its help, label, arch metadata), or None."""
    section = key_sections().get(key)
    return next((f for f in section_fields(section) if f.name == key), None) if section else None
