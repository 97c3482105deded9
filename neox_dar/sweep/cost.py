"""What a planned run costs on GPUs, for `sweep plan`'s cost table (docs/cluster.md):

* the batch as it will run: micro-batch x gradient accumulation x ranks; a micro-batch the config files gave (not
  the user) that does not divide the global batch over the ranks is replaced by the largest one below it that does
  (:func:`fit_micro_batches`);
* GPU-hours and wall time from a measured throughput: the newest GPU result of ``bench/train_throughput.py`` in
  ``bench/results/`` whose run had the same model config (every architecture key, the attention variant and its
  keys, the sequence length), precision and ``torch_compile`` (:func:`measurement_for`); none, and the table says
  "no measurement";
* the epochs of the training data the token budget reads, with a warning above ``max_epochs`` (1 unless the sweep
  file or ``plan --max-epochs`` says more is intended) and for a held-out ``split`` of a file sized to the budget
  (:func:`budget_warnings`);
* the bytes of one checkpoint (:func:`checkpoint_bytes`) and an estimate of the peak GPU memory of a rank
  (:func:`peak_memory`), both from the model's parameter count.

GPU runs train in bf16 when ``precision`` is ``auto``, so the estimates use bf16 for it wherever the plan is made.
"""

from __future__ import annotations

import functools
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..config import Config, ConfigError, load_config, model_config_diff, split_args, split_shares
from ..data.check import manifest_of
from .planning import PlannedRun
from .spec import override_key

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
BENCH = "bench/train_throughput.py"
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
# Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022), Sec. 4.1: a
# transformer layer keeps 34 s b h bytes of 16-bit activations for backward, plus 5 a s^2 b for the attention scores
# and probabilities when the attention materializes them (attention_impl: reference; sdpa and Triton do not)
LAYER_ACTIVATION_BYTES, SCORE_BYTES = 34, 5


def gpu_dtype(cfg: Config) -> str:
    """The precision the run trains in on a GPU ('auto' -> bf16)."""
    return "bf16" if cfg.training.precision == "auto" else cfg.training.dtype


def parameter_count(cfg: Config) -> int:
    """The model's parameters (:func:`neox_dar.model.count_parameters`, the model built on the meta device)."""
    from ..model import build_meta_model, count_parameters

    return count_parameters(build_meta_model(cfg.model))["total"]


def _optimizer_bytes(dtype: str, stage: int) -> int:
    """Optimizer-state bytes per parameter: fp32 master weights and Adam's two moments (12), or the moments alone (8)
    in fp32 without ZeRO, where the weights are their own master copy."""
    return 8 if dtype == "fp32" and stage == 0 else 12


def checkpoint_bytes(cfg: Config, params: int) -> int:
    """Bytes of one checkpoint (neox_dar.training.checkpointing): DeepSpeed's module states (the weights in the
    training precision; ZeRO-3 keeps them only in the optimizer partitions), its optimizer states (fp32 master weights
    and Adam's two moments, 12 bytes per parameter; 8 in fp32 without ZeRO, where the weights are the master copy),
    and the consolidated fp32 ``model.safetensors`` (4 bytes per parameter)."""
    dtype, stage = gpu_dtype(cfg), cfg.training.zero_optimization.stage
    module = 0 if stage == 3 else ITEMSIZE[dtype]
    return params * (module + _optimizer_bytes(dtype, stage) + 4)


@dataclass
class Memory:
    """Estimated peak GPU memory of one rank, in bytes, by part."""

    states: int  # weights, gradients and optimizer states of this rank (ZeRO's partitions)
    activations: int  # kept for backward over one micro-batch
    loss: int  # the output layer's chunked loss: one chunk of logits and the fp32 weight-gradient accumulator

    @property
    def total(self) -> int:
        return self.states + self.activations + self.loss


def peak_memory(cfg: Config, params: int, world_size: int) -> Memory:
    """The peak memory of a rank (docs/cluster.md, "Peak memory"):

    * states (ZeRO paper, Rajbhandari et al. 2020): weights and gradients in the training precision (w bytes each)
      and 12 bytes of fp32 master weights and Adam moments per parameter (8 in fp32 without ZeRO); stage 1
      partitions the optimizer states over the ranks, stage 2 the gradients too, stage 3 the weights too;
    * activations (Korthikanti et al. 2022) of a micro-batch of b sequences of s tokens, hidden size h, L layers,
      a heads: 34 s b h (w / 2) per layer, + 5 a s^2 b (w / 2) when the attention materializes its scores
      (``attention_impl: reference``); with ``checkpoint_activations`` each layer keeps only its input (s b h w)
      and one layer is recomputed at a time;
    * the loss (neox_dar.loss): one chunk of logits (at most :data:`neox_dar.loss.FUSED_CHUNK_BYTES`) and the
      fp32 accumulator of the output layer's weight gradient (4 V h).
    """
    from ..loss import FUSED_CHUNK_BYTES

    m, t = cfg.model, cfg.training
    dtype, stage = gpu_dtype(cfg), t.zero_optimization.stage
    w, optimizer = ITEMSIZE[dtype], _optimizer_bytes(dtype, stage)
    states = params * (w / (world_size if stage >= 3 else 1) + w / (world_size if stage >= 2 else 1)
                       + optimizer / (world_size if stage >= 1 else 1))
    b, s, h = t.train_micro_batch_size_per_gpu, m.seq_length, m.hidden_size
    layer = LAYER_ACTIVATION_BYTES * s * b * h * w / 2
    if m.attention.attention_impl == "reference":
        layer += SCORE_BYTES * m.num_attention_heads * s * s * b * w / 2
    activations = m.num_layers * (s * b * h * w if t.checkpoint_activations else layer) + (
        layer if t.checkpoint_activations else 0)
    loss = min(FUSED_CHUNK_BYTES, b * s * m.padded_vocab_size * w) + 4 * m.padded_vocab_size * h
    return Memory(int(states), int(activations), int(loss))


@dataclass(frozen=True)
class Measurement:
    """One GPU throughput result of ``bench/train_throughput.py``: the file, its card, the config it measured."""

    path: Path
    device: str
    date: str
    tokens_per_sec: float  # of the one GPU
    peak_bytes: float | None  # torch.cuda.max_memory_allocated of the run
    cfg: Config

    def describe(self) -> str:
        """The file, the card, what ran, its tokens/s and its peak memory beside :func:`peak_memory`'s estimate."""
        c = self.cfg
        a = c.model.attention
        peak = "" if self.peak_bytes is None else (
            f", peak memory {_gb(self.peak_bytes)} (estimated: {_gb(peak_memory(c, parameter_count(c), 1).total)})")
        return (f"{self.path.relative_to(RESULTS.parents[1])}: {self.device}, {a.attention_type} "
                f"({a.attention_impl}{', torch_compile' if c.training.torch_compile else ''}), micro-batch "
                f"{c.training.train_micro_batch_size_per_gpu}, ZeRO-{c.training.zero_optimization.stage}, "
                f"{gpu_dtype(c)}: {self.tokens_per_sec:,.0f} tokens/s per GPU{peak}")


def _measured_config(command: str) -> Config | None:
    """The config a ``bench/train_throughput.py`` command line trained: its config files and key=value words (the
    options after them left out), loaded from the repository; None when it does not load any more."""
    words = command.split()
    if BENCH not in words:
        return None
    args = words[words.index(BENCH) + 1:]
    args = args[:next((i for i, a in enumerate(args) if a.startswith("--")), len(args))]
    paths, overrides = split_args(args)
    root = RESULTS.parents[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return load_config(*(root / p for p in paths), overrides=overrides)
        except ConfigError:
            return None


def measurements(results: Path = RESULTS) -> tuple[Measurement, ...]:
    """The GPU throughput results in ``results/*/`` (files with the engine's tokens/s and a CUDA version), read once
    per state of the attention registry (a variant registered later changes what a config holds)."""
    from ..variants.registry import generation

    return _measurements(results, generation())


@functools.lru_cache(maxsize=None)
def _measurements(results: Path, registry_generation: int) -> tuple[Measurement, ...]:
    """:func:`measurements`; ``registry_generation`` is only the cache's key."""
    found = []
    for path in sorted(results.glob("*/*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        engine = data.get("engine") if isinstance(data, dict) else None
        if not (isinstance(engine, dict) and engine.get("tokens_per_sec") and data.get("cuda")):
            continue
        cfg = _measured_config(str(data.get("command", "")))
        if cfg is not None:
            peak = engine.get("max_memory_allocated_gb")
            found.append(Measurement(path, str(data.get("device")), str(data.get("date_utc", "")),
                                     float(engine["tokens_per_sec"]), peak * 1e9 if peak else None, cfg))
    return tuple(found)


def measurement_for(cfg: Config, results: Path = RESULTS) -> Measurement | None:
    """The newest measurement of the run's model config (every architecture and attention key), precision and
    ``torch_compile``, and of its ``attention_impl`` unless that is ``auto``; None when none fits."""
    fits = [m for m in measurements(results)
            if not model_config_diff(cfg.model, m.cfg.model) and gpu_dtype(cfg) == gpu_dtype(m.cfg)
            and cfg.training.torch_compile == m.cfg.training.torch_compile
            and cfg.model.attention.attention_impl in ("auto", m.cfg.model.attention.attention_impl)]
    return max(fits, key=lambda m: m.date, default=None)


def fit_micro_batches(planned: list[PlannedRun], world_size: int, user_overrides: list[str]) -> list[str]:
    """For each run whose micro-batch came from its config files (not from the sweep's ``set:``, grid or runs, nor
    from the ``key=value`` overrides) and does not divide the global batch over ``world_size`` ranks: the largest
    micro-batch below it that does (the memory stays within the config's). Changes the runs' configs; returns the
    notes, each once with the runs it concerns."""
    given = {override_key(o) for o in user_overrides}
    notes: dict[str, list[str]] = {}
    for p in planned:
        t = p.cfg.training
        chosen = {k.replace("-", "_") for k in p.spec.overrides} | given
        if (t.train_batch_size is None or t.gradient_accumulation_steps is not None
                or {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps"} & chosen
                or t.train_batch_size % (t.train_micro_batch_size_per_gpu * world_size) == 0):
            continue
        fits = t.micro_batches_that_fit(world_size, t.train_micro_batch_size_per_gpu)
        if not fits:
            continue  # the ranks do not divide the global batch: check_runs says so
        old, new = t.train_micro_batch_size_per_gpu, fits[-1]
        p.cfg = p.cfg.replace(train_micro_batch_size_per_gpu=new)
        notes.setdefault(f"micro-batch {old} (from the config files) does not divide the global batch "
                         f"{t.train_batch_size} over {world_size} ranks: using {new} (accumulation "
                         f"{t.train_batch_size // (new * world_size)}); set train_micro_batch_size_per_gpu to choose",
                         []).append(p.spec.name)
    return [f"{', '.join(names)}: {note}" for note, names in notes.items()]


def budget_warnings(cfg: Config, world_size: int, max_epochs: float) -> list[str]:
    """Warnings about what the token budget reads on ``world_size`` ranks (:func:`neox_dar.training.checks.data_epochs`,
    data files checked): more than ``max_epochs`` epochs of the training data; and a ``split`` that holds part of
    ``data_path`` out of training where that file was tokenized to a budget (its manifest's ``max_tokens``) or where
    the held-out part is what makes the budget read the data more than once (docs/data.md, "Token budgets")."""
    from ..training.checks import data_epochs, epochs_warning

    tokens, epochs = data_epochs(cfg, world_size)
    warning = epochs_warning(tokens, epochs, max_epochs, "max_epochs: N in the sweep file, or plan --max-epochs N")
    out = [warning] if warning else []
    d = cfg.data
    shares = split_shares(d.split)
    if d.data_path and not d.train_data_paths and shares[0] < sum(shares):
        manifest = manifest_of(d.data_path)
        budgeted = manifest is not None and bool(manifest[1].get("max_tokens"))
        whole = epochs * shares[0] / sum(shares)
        if budgeted or epochs > 1 >= whole:
            out.append(f"split '{d.split}' holds {1 - shares[0] / sum(shares):.1%} of {d.data_path} out of training"
                       + (" (a file tokenized to a budget, --max-tokens)" if budgeted else "")
                       + f": the budget reads the rest {epochs:.3g} times, the whole file it would read {whole:.3g} "
                       "times; train on it with split=100,0,0, or on train_data_paths with a held-out file "
                       "(data_prep.tokenize --valid-tokens) as valid_data_paths (docs/data.md, Token budgets)")
    return out


def _hours(h: float) -> str:
    return f"{h * 60:.0f} min" if h < 1 else f"{h:,.1f} h"


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n < 1e11 else f"{n / 1e12:.2f} TB"


def cost_columns(p: PlannedRun, world_size: int) -> tuple[dict[str, str], Measurement | None]:
    """The cost columns of a run's plan row on ``world_size`` ranks (GPU-hours, wall time, checkpoint, memory per
    rank) and the measurement its times come from."""
    from ..training.checks import data_epochs

    tokens = data_epochs(p.cfg, world_size)[0]
    params = parameter_count(p.cfg)
    found = measurement_for(p.cfg)
    if found is None:
        gpu_h = wall = "no measurement"
    else:
        hours = tokens / found.tokens_per_sec / 3600
        gpu_h, wall = f"{hours:,.1f}", _hours(hours / world_size)
    keep = p.cfg.run.keep_last_n
    return {"GPU-h": gpu_h, "wall": wall,
            "checkpoint": f"{_gb(checkpoint_bytes(p.cfg, params))}" + (" each, every one kept" if keep is None else
                                                                         f" x {keep} kept" if keep > 1 else ""),
            "memory/rank": _gb(peak_memory(p.cfg, params, world_size).total)}, found
