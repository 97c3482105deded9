"""Config rules that only training has: they need the model's parameter names, the data-parallel size, the run
directory or the data files."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..attention.triton_bridge import DQ_PASS_ENV, DQ_PASSES
from ..config import Config, ConfigError, load_config, split_shares
from ..data import IndexedDataset, IndexedDatasetError
from ..data.check import check_data_files, data_prefixes, other_tokenizer
from ..rundir import (CHECKPOINTS, CONFIG, LOCK, METRICS, RUN_META, STATUS, CheckpointError, check_writable,
                      checkpoints_dir, is_hf_folder, read_state, resolve_checkpoint, step_dirs)

# a token budget that reads the training data more often than this is warned about, by train.py and `sweep plan`
# alike, unless the user says more is intended (train.py --max-epochs, a sweep file's max_epochs, plan --max-epochs)
MAX_EPOCHS = 1.0
SWEEP_COPY = "sweep.yml"  # a sweep's copy of its file, beside its run directories (neox_dar.sweep.spec.SWEEP_COPY)
# a load without finetune that holds weights only (said by train.py's checks before the run directory is made, and
# by the run's start for a load that appears or changes meanwhile)
WEIGHTS_ONLY = ("holds weights only (an import or an export), no training state to continue: set finetune=true to "
                "start a new run from its weights")


def check_what_trains(cfg: Config) -> None:
    """The rules that need the model's parameter names (the model built on the meta device): every
    ``trainable_params`` pattern matches a parameter, every LoRA target a linear layer
    (:func:`~neox_dar.training.finetune.check_trainable`). A one-line ConfigError naming the key and where it was
    set. Every command that takes a config to train (``train.py``, ``sweep plan``) or shows it (``python -m
    neox_dar.config``, ``describe``) calls it after loading."""
    if cfg.training.trainable_params is None and cfg.training.lora is None:
        return
    from ..model import build_meta_model  # only here: the other checks, and plans without these keys, need no model
    from .finetune import check_trainable

    model = build_meta_model(cfg.model)
    cfg.validate(lambda c: check_trainable(c, model))


def load_checked(paths: list[str], overrides: list[str]) -> Config | None:
    """The config of ``paths`` and ``overrides`` (:func:`~neox_dar.config.load_config`) checked by
    :func:`check_what_trains`; on a ConfigError, prints ``config error: ...`` on stderr and returns None (the commands
    then exit with status 2)."""
    try:
        cfg = load_config(*paths, overrides=overrides)
        check_what_trains(cfg)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return None
    return cfg


def check_training_config(cfg: Config, world_size: int, here: bool = True) -> None:
    """Raise a one-line ConfigError when ``cfg`` cannot train with ``world_size`` data-parallel ranks: no ``save``
    (or one that is a file, or a name too long for the file system), a global batch that does not divide, no data,
    what needs CUDA on a machine without it (:func:`check_without_cuda`; only when it trains ``here``, on this
    machine, not when a login node checks a job for GPU nodes), finetune without load, a load that is a Hugging
    Face folder (import it first), a new run's load that does not exist (``here`` only: a sweep's later stage loads
    a run its earlier stage has not trained yet), bf16 without ZeRO, or a damaged data file (header, sizes, dtype
    and token ids against ``vocab_size``:
    :func:`neox_dar.data.check_data_files`)."""
    if not cfg.run.save:
        raise ConfigError("'save' (the run directory) must be set, e.g. save=runs/my_run")
    try:
        is_file = Path(cfg.run.save).exists() and not Path(cfg.run.save).is_dir()
    except OSError as e:  # a name longer than the file system allows
        raise ConfigError(f"save={cfg.run.save} cannot be a directory here: {e.strerror}") from None
    if is_file:
        raise ConfigError(f"save={cfg.run.save} is a file, not a directory: name a directory for the run")
    try:
        cfg.training.gradient_accumulation_for(world_size)
    except ConfigError as e:  # name where the batch keys were set
        where = "; ".join(f"{k} from {cfg.origins[k]}" for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                                  "gradient_accumulation_steps") if k in cfg.origins)
        raise ConfigError(f"{e} ({where})" if where else str(e)) from None
    if not (cfg.data.data_path or cfg.data.train_data_paths):
        raise ConfigError("no training data: set 'data_path' (one dataset split by 'split') or 'train_data_paths'")
    if here and not _cuda():
        check_without_cuda(cfg)
    if here and cfg.run.tensorboard_dir:  # a file there was a FileExistsError traceback after start-up
        check_writable(cfg.run.tensorboard_dir, "tensorboard_dir", folder=True)
    if cfg.run.finetune and not cfg.run.load:
        raise ConfigError("finetune=true starts from load='s weights, but load is not set: name the checkpoint or "
                          "import to start from (load=...), or drop finetune to train from scratch")
    if cfg.run.load and is_hf_folder(cfg.run.load):
        raise ConfigError(f"load={cfg.run.load} is a Hugging Face folder: import it first (python -m "
                          f"neox_dar.convert from-hf {cfg.run.load} OUT), then train with load=OUT finetune=true")
    # a new run (a run with checkpoints of its own continues from them, whatever became of its load) whose load is
    # missing: said before the run directory is made
    if here and cfg.run.load and not Path(cfg.run.load).exists() and not step_dirs(checkpoints_dir(cfg.run.save)):
        raise ConfigError(f"load={cfg.run.load} does not exist: name a run directory, one of its checkpoints or an "
                          "import (python -m neox_dar.convert from-hf)")
    if here and cfg.run.load and not cfg.run.finetune and cfg.run.resume != "never" \
            and not step_dirs(checkpoints_dir(cfg.run.save)) and _load_is_weights_only(cfg.run.load):
        raise ConfigError(f"load={cfg.run.load}: {WEIGHTS_ONLY}")
    if os.environ.get(DQ_PASS_ENV, DQ_PASSES[0]) not in DQ_PASSES:
        raise ConfigError(f"{DQ_PASS_ENV}={os.environ[DQ_PASS_ENV]} (environment): the Triton backward's dq pass is "
                          f"{' or '.join(map(repr, DQ_PASSES))} (unset: chosen by timing)")
    if cfg.training.dtype == "bf16" and cfg.training.zero_optimization.stage == 0:
        raise ConfigError("precision bf16 (the default on GPUs) needs zero_optimization.stage >= 1: DeepSpeed keeps "
                          "fp32 master weights for bf16 only under ZeRO (stage 1 on one GPU costs nothing)")
    try:
        check_data_files(cfg)
    except IndexedDatasetError as e:
        raise ConfigError(str(e)) from None


def weights_only(step_dir: Path) -> bool:
    """Whether the checkpoint directory ``step_dir`` holds weights and no training state (an import or an export:
    its manifest records no world size)."""
    return read_state(step_dir).get("world_size") is None


def _load_is_weights_only(load: str) -> bool:
    """:func:`weights_only` of the checkpoint ``load`` names; False when it cannot be read (the run says why when it
    opens it)."""
    try:
        return weights_only(resolve_checkpoint(load, checksums=False, warn=None))
    except CheckpointError:
        return False


def other_run_warning(paths: list[str], cfg: Config) -> str | None:
    """A warning when a config file given is a run directory's ``config.yml`` (beside its ``status.json`` or
    ``checkpoints/``: a run copied or moved elsewhere, started again from its config) while ``save`` names another
    directory: training continues ``save``, not the run the config came from."""
    save = Path(cfg.run.save).resolve()
    for path in map(Path, paths):
        folder = path.parent.resolve()
        is_run = (folder / STATUS).is_file() or checkpoints_dir(folder).is_dir()
        if path.name == CONFIG and is_run and folder != save:
            return (f"warning: {path} is the config of the run directory {path.parent}, but it names "
                    f"save={cfg.run.save}: this trains (and continues) {cfg.run.save}, not {path.parent}; add "
                    f"save={path.parent} to train the run in that directory")
    return None


def foreign_save_warning(cfg: Config) -> str | None:
    """A warning when ``save`` is a directory that holds files but no run's (no status, config, metrics, lock or
    checkpoints: a data folder, a home directory named by mistake): the run's files go in beside them."""
    save = Path(cfg.run.save)
    run_files = (STATUS, CONFIG, METRICS, LOCK, RUN_META, CHECKPOINTS)
    if not save.is_dir() or any((save / name).exists() for name in run_files):
        return None
    names = sorted(p.name for p in save.iterdir())
    if not names:
        return None
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    count = f"{len(names)} {'entry' if len(names) == 1 else 'entries'}"
    return (f"warning: save={cfg.run.save} holds {count} of no run ({shown}): the run writes its files "
            "beside them (config.yml, metrics.jsonl, status.json, checkpoints/); name a new directory to keep them "
            "apart")


def tokenizer_warnings(cfg: Config) -> list[str]:
    """A warning per data prefix whose manifest names another tokenizer than the config's ``vocab_file`` (the token
    ids then mean other words; ``python -m neox_dar.data.check`` says the same)."""
    return [f"warning: {w}: the model learns other words than the tokenizer it will be used with"
            for prefix in data_prefixes(cfg) if (w := other_tokenizer(prefix, cfg))]


def data_epochs(cfg: Config, world_size: int) -> tuple[int, float]:
    """``(tokens, epochs)``: the tokens ``train_iters`` steps read, and how many times that reads the training data
    (its ``split`` share of ``data_path``, or, for ``train_data_paths``, the dataset the blend repeats most; for chat
    data, whose samples are one conversation each, padded or cut to ``seq_length``, the samples over the
    conversations). Call after :func:`check_training_config`."""
    samples = cfg.training.train_iters * cfg.training.global_batch_for(world_size)
    budget = samples * cfg.model.seq_length
    d = cfg.data
    if d.train_label_data_paths:
        conversations = sum(len(IndexedDataset(p)) for p in d.train_data_paths)
        return budget, samples / conversations if conversations else float("inf")
    if d.train_data_paths:
        weights = d.train_data_weights or [1.0] * len(d.train_data_paths)
        shares = [w / sum(weights) for w in weights]
        sizes = [IndexedDataset(p).num_tokens for p in d.train_data_paths]
    else:
        split = split_shares(d.split)
        shares, sizes = [1.0], [IndexedDataset(d.data_path).num_tokens * split[0] / sum(split)]
    return budget, max(budget * share / size if size else float("inf") for share, size in zip(shares, sizes))


def epochs_warning(tokens: int, epochs: float, max_epochs: float, how: str) -> str | None:
    """The warning about a token budget of ``tokens`` that reads the training data ``epochs`` times, more than
    ``max_epochs``; ``how`` says how to declare more intended. None within ``max_epochs``."""
    if epochs <= max_epochs:
        return None
    return (f"token budget: {tokens:,} tokens = {epochs:.3g} epochs of the training data, more than max_epochs = "
            f"{max_epochs:g}: use more data or fewer train_iters, or say that it is intended ({how})")


def sweep_max_epochs(save: str | Path | None) -> float | None:
    """The ``max_epochs`` of the sweep whose run directory ``save`` is (its ``run.json``, and the sweep's
    ``sweep.yml`` one folder up); None for another directory or a sweep that does not set it."""
    import yaml

    if not save or not (Path(save) / RUN_META).is_file():
        return None
    try:
        data = yaml.safe_load((Path(save).parent / SWEEP_COPY).read_text())
    except (OSError, yaml.YAMLError):
        return None
    value = data.get("max_epochs") if isinstance(data, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def epochs_line(cfg: Config, world_size: int, max_epochs: float | None = None) -> str:
    """One line saying the epochs :func:`data_epochs` finds: a warning beyond ``max_epochs`` (default: the sweep's
    ``max_epochs`` for a sweep's run, else :data:`MAX_EPOCHS`), worded as ``sweep plan``'s."""
    tokens, epochs = data_epochs(cfg, world_size)
    if max_epochs is None:
        max_epochs = sweep_max_epochs(cfg.run.save) or MAX_EPOCHS
    warning = epochs_warning(tokens, epochs, max_epochs, "train.py --max-epochs N; in a sweep, max_epochs: N")
    if warning:
        return f"warning: {warning}"
    return f"token budget: {tokens:,} tokens = {epochs:.3g} epochs of the training data"


def check_without_cuda(cfg: Config) -> None:
    """What ``cfg`` cannot do on a machine without CUDA: precision fp16 (DeepSpeed's fp16 optimizer), and
    ``attention_impl: triton``, whose kernels run there only under Triton's interpreter (``TRITON_INTERPRET=1``, for
    tests) and flash-linear-attention's (linear layers) not at all."""
    from ..variants.layers import layer_types

    if cfg.training.dtype == "fp16":
        raise ConfigError("precision fp16 needs a CUDA GPU (DeepSpeed's fp16 optimizer runs on none other): use "
                          "precision=fp32 or bf16 here")
    if cfg.model.attention.attention_impl != "triton":
        return
    from ..attention.triton_bridge import interpreter_requested

    if not interpreter_requested():
        raise ConfigError("attention_impl=triton needs a CUDA GPU (on a CPU the kernels run only under "
                          "TRITON_INTERPRET=1, slowly, for tests): use attention_impl=auto or sdpa here")
    if "linear" in layer_types(cfg.model):
        raise ConfigError("attention_impl=triton runs the linear layers with flash-linear-attention's kernels, which "
                          "need a CUDA GPU (not Triton's interpreter): use attention_impl=auto or sdpa here")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
