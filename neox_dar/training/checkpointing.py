"""DeepSpeed training checkpoints: saving and restoring the engine, the RNG states and the data position.

File names, atomic publication, manifests with checksums, pruning and finding checkpoints belong to
:mod:`neox_dar.rundir`; this module adds what needs the DeepSpeed engine. A save writes everything into
``.tmp-step_X`` (DeepSpeed's model/optimizer files of every rank, every rank's RNG state, the consolidated fp32
``model.safetensors`` and ``config.yml``), rank 0 writes the manifest (size and xxh3-64 checksum of every file)
and publishes the directory as ``step_X``; on any error (a full disk) the temporary directory is removed, the
previous checkpoints stay intact, and the error names the path and the free space.

Loading never unpickles code: every DeepSpeed state file is read with ``torch.load(weights_only=True)``, with
only the few plain DeepSpeed classes its optimizer state holds allowed (:data:`SAFE_GLOBALS`).
"""

from __future__ import annotations

import errno
import os
import pickle
import random
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..saved_model import model_yaml, read_model_config
from ..config import Config, ConfigError, load_config, model_config_diff
from ..data.conversations import ORDER as CONVERSATION_ORDER
from ..provenance import code_version
from ..rundir import (CONFIG, MODEL_CONFIG, STATE, TMP_PREFIX, WEIGHTS, CheckpointError, free_space, prune,
                      publish, read_state, save_safetensors, step_dir_name, write_manifest)
from ..tokenizer import RUN_TOKENIZER_DIR, copy_tokenizer, tokenizer_sha256
from .distributed import DistInfo, any_rank, barrier
from .finetune import merge_lora
from .optim import resume_schedule


@dataclass
class TrainState:
    """Where training stands: optimizer steps taken, GLOBAL samples consumed (the data position), the step of
    the newest checkpoint written or resumed (0: none), and this rank's ``(lm, aux)`` losses (each a (2,) float32
    tensor) of the steps since the last log row, which the next row averages (a checkpoint keeps them, so a resumed
    run logs the rows of an uninterrupted one)."""

    step: int = 0
    consumed_samples: int = 0
    checkpoint: int = 0
    interval_losses: list[torch.Tensor] = field(default_factory=list)


def rng_file(rank: int) -> str:
    return f"rng_rank{rank:05d}.pt"


# ----------------------------------------------------------------------------------------------
# RNG states


def capture_rng() -> dict:
    """Python, NumPy, torch CPU and CUDA generator states in ``torch.load(weights_only=True)``-safe types."""
    np_state = np.random.get_state()
    out = {
        "python": random.getstate(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def restore_rng(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------------------------
# loading DeepSpeed state without unpickling code


def _safe_globals() -> list:
    """The plain classes DeepSpeed's optimizer states hold (checked for ZeRO 0-3 in fp32, fp16 and bf16)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def safe_torch_load(path: str | Path, map_location=None):
    """``torch.load(weights_only=True)`` with DeepSpeed's few state classes allowed; a file that holds anything
    else (a pickled callable) is a one-line CheckpointError, and nothing in it runs."""
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = found.group(1) if found else "objects"
        raise CheckpointError(f"refusing {path}: it holds pickled {what}, which no neox-dar checkpoint contains; "
                              "load only checkpoints you trust") from None


def _torch_checkpoint_engine(engine):
    """DeepSpeed's checkpoint engine of ``engine``, which must be its plain torch one (CheckpointError otherwise)."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    if type(engine.checkpoint_engine) is not TorchCheckpointEngine:
        raise CheckpointError(f"unexpected DeepSpeed checkpoint engine {type(engine.checkpoint_engine).__name__}; "
                              "neox-dar reads and writes checkpoints only through the torch engine")
    return engine.checkpoint_engine


def use_safe_loading(engine) -> None:
    """Make ``engine.load_checkpoint`` read every file through :func:`safe_torch_load`."""
    _torch_checkpoint_engine(engine).load = lambda path, map_location=None: safe_torch_load(path, map_location)


def torch_save(obj, path: str | Path, **kwargs) -> None:
    """``torch.save`` through a Python file: on a full disk torch says only "[enforce fail at inline_container.cc]
    unexpected pos", and the file's OSError (:func:`write_failure` finds it) is then that error's context."""
    with open(path, "wb") as f:
        torch.save(obj, f, **kwargs)


def use_file_saving(engine) -> None:
    """Make ``engine.save_checkpoint`` write every file through :func:`torch_save`."""
    ce = _torch_checkpoint_engine(engine)
    ce.save = lambda state_dict, path: torch_save(state_dict, path,
                                                  _use_new_zipfile_serialization=ce.zipfile_serialization)


# ----------------------------------------------------------------------------------------------
# consolidated weights


def consolidated_fp32_state(engine, lora_scale: float | None = None) -> dict[str, torch.Tensor]:
    """Full fp32 weights on CPU by their ``state_dict`` names, gathered from every rank's partition (collective:
    call on all ranks); with ``lora_scale``, peft's LoRA layers merged into plain weights (:func:`merge_lora`).

    The fp32 master copy where DeepSpeed keeps one (ZeRO 1/2/3, bf16), else the parameter itself: exact for fp32
    training, and for a frozen parameter (which has no master copy) its value in the training dtype (gathered
    from its ZeRO-3 partitions)."""
    from deepspeed import zero
    from deepspeed.utils import safe_get_full_fp32_param

    out = {}
    tied = engine.module.tied_keys
    for name, t in engine.module.state_dict(keep_vars=True).items():
        if name in tied:
            continue
        full = safe_get_full_fp32_param(t) if isinstance(t, torch.nn.Parameter) and t.requires_grad else None
        if full is None and hasattr(t, "ds_id"):  # a frozen ZeRO-3 parameter: gather its partitions
            with zero.GatheredParameters([t]):
                full = t.detach().to("cpu", torch.float32).clone()
        out[name] = (t.detach() if full is None else full).to("cpu", torch.float32).contiguous().clone()
    return merge_lora(out, lora_scale) if lora_scale is not None else out


# ----------------------------------------------------------------------------------------------
# saving


def save_checkpoint(engine, cfg: Config, info: DistInfo, root: Path, state: TrainState, keep_last_n: int | None,
                    data: dict | None, epochs: list[int] | None = None) -> Path:
    """Write the checkpoint of ``state`` under ``root`` (collective) and return its directory; its ``state.json``
    records ``data``, the identity of the data trained on (rank 0's; :func:`~neox_dar.data.identity.data_identity`),
    and ``epochs``, those its training index spans (:func:`~neox_dar.data.index_epochs`, as ``index_epochs``).

    A checkpoint of the same step already there (one that failed its check and was skipped on resume) is
    replaced, never kept. Any error removes the temporary directory and raises CheckpointError on every rank."""
    final = root / step_dir_name(state.step)
    tag = TMP_PREFIX + final.name
    tmp = root / tag
    error = None
    try:
        if info.is_main:
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
        barrier()
        use_file_saving(engine)
        engine.save_checkpoint(str(root), tag=tag, save_latest=False)
        losses = torch.stack(state.interval_losses).cpu() if state.interval_losses else torch.zeros(0, 2)
        torch_save({**capture_rng(), "interval_losses": losses}, tmp / rng_file(info.rank))
    except Exception as e:  # OSError from a full disk, or torch's RuntimeError wrapping one
        error = failed_write(e)
    lora = cfg.training.lora
    weights = consolidated_fp32_state(engine, lora.alpha / lora.r if lora is not None else None)
    if any_rank(error is not None, info.device):
        _abandon(tmp, info, error)
    barrier()
    if info.is_main:
        try:
            save_safetensors(weights, tmp / WEIGHTS, metadata={"format": "pt"})
            (tmp / CONFIG).write_text(cfg.to_yaml())
            (tmp / MODEL_CONFIG).write_text(model_yaml(cfg.model))
            tokenizer = _copy_run_tokenizer(Path(cfg.run.save), tmp)
            write_manifest(tmp, {
                "step": state.step,
                "consumed_samples": state.consumed_samples,
                "train_iters": cfg.training.train_iters,
                "world_size": info.world_size,
                "zero_stage": cfg.training.zero_optimization.stage,
                "precision": cfg.training.dtype,
                "code_version": code_version(),
                "tokenizer_sha256": tokenizer,
                "data": data,
                "index_epochs": epochs,
                "conversation_order": CONVERSATION_ORDER,
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            })
            publish(tmp, final)
            prune(root, keep_last_n)
        except Exception as e:
            error = failed_write(e)
    if any_rank(error is not None, info.device):
        _abandon(tmp, info, error)
    barrier()
    return final


def _copy_run_tokenizer(save: Path, step_dir: Path) -> str | None:
    """Copy the run's recorded tokenizer files (``save/tokenizer/``) into a checkpoint being written; returns the
    sha256 of its ``tokenizer.json`` (None: the run records no tokenizer)."""
    recorded = save / RUN_TOKENIZER_DIR / "tokenizer.json"
    if not recorded.is_file():
        return None
    copy_tokenizer(recorded, step_dir)
    return tokenizer_sha256(recorded)


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the errors behind it: each one's cause, else the error it was raised while handling."""
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def failed_write(error: Exception) -> Exception:
    """``error``, the failure of a checkpoint write; but a Ctrl-C that interrupted torch's writer (the second one,
    which aborts the run) surfaces as the writer's own error, "[enforce fail at inline_container.cc] unexpected
    pos", with the KeyboardInterrupt as its context: that interrupt is raised instead, so the run ends interrupted
    as at any other moment, not failed as if the disk had been."""
    for seen in _chain(error):
        if isinstance(seen, KeyboardInterrupt):
            raise seen
    return error


def write_failure(error: BaseException) -> str:
    """Why a checkpoint write failed, in words: the OSError behind it (torch reports a full disk only as "[enforce
    fail at inline_container.cc] unexpected pos", with the OSError of a Python file as its context; safetensors
    as "os error 28"), else the error's first line."""
    for seen in _chain(error):
        code = getattr(seen, "errno", None)
        if code is None:
            found = re.search(r"os error (\d+)", str(seen))
            code = int(found.group(1)) if found else None
        if code in (errno.ENOSPC, errno.EDQUOT):
            return "no space left on device"
        if code is not None:
            return os.strerror(code)
    return (str(error).splitlines() or [type(error).__name__])[0]


def _abandon(tmp: Path, info: DistInfo, error: Exception | None) -> None:
    """Remove a half-written checkpoint (rank 0) and raise one line saying where and why on every rank."""
    if info.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    why = "another rank failed to write its part" if error is None else write_failure(error)
    raise CheckpointError(f"could not write checkpoint {tmp.with_name(tmp.name[len(TMP_PREFIX):])}: {why} "
                          f"({free_space(tmp.parent)}); the previous checkpoints are intact")


# ----------------------------------------------------------------------------------------------
# resuming


def model_mismatch(step_dir: Path, cfg: Config) -> str | None:
    """Why the checkpoint holds another model than ``cfg`` describes (continuing it would load mismatched weights
    or silently change the architecture), or None when it is the same model."""
    try:
        diff = model_config_diff(read_model_config(step_dir), cfg.model)
    except CheckpointError as e:
        return str(e)
    if not diff:
        return None
    shown = ", ".join(f"{k} ({a!r} in the checkpoint, {b!r} now)" for k, (a, b) in list(diff.items())[:3])
    return f"{step_dir} is a checkpoint of another model: {shown}"


def check_resumable(step_dir: Path, cfg: Config, info: DistInfo) -> None:
    """CheckpointError (one line) unless this run can resume the verified ``step_dir`` (whose model the start point
    has checked): the world size (under ZeRO), ZeRO stage (1 and 2 store their optimizer state alike) and precision
    its optimizer state was written for. Checked before the engine is built."""
    meta = read_state(step_dir)
    fresh = f"or continue from its weights in a new run: save=NEW load={step_dir} finetune=true (a fresh optimizer " \
            "state and schedule)"
    if meta["world_size"] != info.world_size and meta["zero_stage"] > 0:
        raise CheckpointError(
            f"{step_dir} was written by {meta['world_size']} ranks under ZeRO-{meta['zero_stage']}, whose optimizer "
            f"state is split {meta['world_size']} ways; resume it with {meta['world_size']} ranks (this run has "
            f"{info.world_size}), {fresh}")
    stages = {meta["zero_stage"], cfg.training.zero_optimization.stage}
    if len(stages) > 1 and stages != {1, 2}:
        raise CheckpointError(
            f"{step_dir} was written under ZeRO-{meta['zero_stage']}, this run has zero_optimization.stage="
            f"{cfg.training.zero_optimization.stage}, which stores the optimizer state otherwise; resume it with "
            f"zero_optimization.stage={meta['zero_stage']}, {fresh}")
    if meta.get("precision", cfg.training.dtype) != cfg.training.dtype:  # older checkpoints lack it
        raise CheckpointError(
            f"{step_dir} was written in {meta['precision']}, this run trains in {cfg.training.dtype}, whose optimizer "
            f"state differs; resume it with precision={meta['precision']}, {fresh}")


SAMPLING_KEYS = ("model.seq_length", "training.seed", "data.split", "data.train_data_weights", "data.data_shuffle",
                 "data.data_fixed_length")


def sampling_changes(step_dir: Path, cfg: Config, info: DistInfo, epochs: list[int]) -> str | None:
    """What a resume of ``step_dir`` changes in the samples the run reads (None: nothing), for one line in the log:
    the keys of :data:`SAMPLING_KEYS` that make another sample order, the global batch, and the epochs the training
    index spans (``epochs`` now; a longer ``train_iters`` may need more, whose shuffle is another). The run continues at
    the checkpoint's ``consumed_samples`` in the order the current config makes, which is not where the
    checkpoint's run would have gone on when one of these differs; so these are allowed (a larger batch later in
    a run is common) and said."""
    meta = read_state(step_dir)
    try:
        prior = load_config(step_dir / CONFIG)
    except ConfigError as e:  # written by another version of the config schema
        return f"the sampling settings {step_dir} was trained with are not compared: its {CONFIG} does not load ({e})"
    changed = []
    for key in SAMPLING_KEYS:
        section, name = key.split(".")
        old, new = getattr(getattr(prior, section), name), getattr(getattr(cfg, section), name)
        if old != new:
            changed.append(f"{name} {old!r} -> {new!r}")
    old_batch = prior.training.global_batch_for(meta["world_size"])
    new_batch = cfg.training.global_batch_for(info.world_size)
    if old_batch != new_batch:
        changed.append(f"global batch {old_batch} -> {new_batch} samples a step")
    if meta.get("index_epochs") not in (None, epochs):  # older checkpoints do not record them
        changed.append(f"the training data's index spans {_epochs(epochs)} now, {_epochs(meta['index_epochs'])} "
                       "when the checkpoint was written, so its documents and samples are shuffled anew")
    if (cfg.data.train_label_data_paths and prior.data.train_label_data_paths
            and meta.get("conversation_order") != CONVERSATION_ORDER):
        old_order = meta.get("conversation_order", "by an earlier rule (per global micro-batch)")
        changed.append(f"conversations ordered {old_order} -> {CONVERSATION_ORDER}")
    if not changed:
        return None
    return (f"resumed with other sampling settings than {step_dir} was trained with ({'; '.join(changed)}): the run "
            f"reads on from sample {meta['consumed_samples']} of the order this config makes, not the samples the "
            "checkpoint's run would have read next")


def _epochs(epochs: list[int]) -> str:
    """``[3]`` -> "3 epochs"; ``[1, 2]`` -> "1, 2 epochs of its 2 datasets"."""
    if len(epochs) == 1:
        return f"{epochs[0]} epoch{'s' if epochs[0] != 1 else ''}"
    return f"{', '.join(map(str, epochs))} epochs of its {len(epochs)} datasets"


def load_checkpoint(engine, cfg: Config, info: DistInfo, step_dir: Path) -> TrainState:
    """Restore DeepSpeed state, this rank's RNG, the data position and the losses of the log interval it was in
    from a verified ``step_dir`` that :func:`check_resumable` accepted (collective); the learning-rate schedule and
    the optimizer's weight decay, betas and eps are the current config's
    (:func:`~neox_dar.training.optim.resume_schedule`)."""
    meta = read_state(step_dir)
    use_safe_loading(engine)
    loaded, _ = engine.load_checkpoint(str(step_dir.parent), tag=step_dir.name,
                                       load_optimizer_states=True, load_lr_scheduler_states=True)
    if loaded is None:
        raise CheckpointError(f"DeepSpeed could not load {step_dir}")
    if engine.global_steps != meta["step"]:
        raise CheckpointError(f"{step_dir}: its {STATE} says step {meta['step']} but DeepSpeed's files say step "
                              f"{engine.global_steps}")
    resume_schedule(engine.lr_scheduler, cfg, engine.module)
    state = TrainState(step=int(meta["step"]), consumed_samples=int(meta["consumed_samples"]))
    rng = step_dir / rng_file(info.rank)
    if rng.is_file():
        saved = safe_torch_load(rng)
        restore_rng(saved)
        state.interval_losses = list(saved.get("interval_losses", torch.zeros(0, 2)).to(info.device))
    return state
