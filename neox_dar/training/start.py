"""Where a run starts: its own newest checkpoint in ``save``, ``load``'s checkpoint, or scratch, decided on rank 0
before anything is built; what ``save`` may hold (:class:`SaveInUseError`, ``overwrite``), and the tokenizer the run
records."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import torch.distributed as dist

from ..config import Config, load_config
from ..data.identity import data_change, data_identity
from ..evaluation.perplexity import SWEEP_MANIFEST
from ..rundir import (CONFIG, EVAL_DIR, FAILED_PREFIX, LATEST, METRICS, STATUS, WANDB_ID, WANDB_STEP, CheckpointError,
                      CheckpointHold, RunFileError, checkpoints_dir, clean_leftovers, hold_checkpoint, newest_checkpoint,
                      read_state, read_status, recorded_checkpoint, remove_tree, set_aside_newer, step_dirs)
from ..tokenizer import RUN_TOKENIZER_DIR, record_run_tokenizer, run_tokenizer
from .checkpointing import model_mismatch
from .checks import WEIGHTS_ONLY, weights_only
from .distributed import DistInfo
from .finetune import finetune_mismatch

log = logging.getLogger("neox_dar.train")


def source_path(path: str | None) -> str | None:
    return os.path.abspath(path) if path else None


def discard_run(save: Path) -> None:
    """Remove another run's checkpoints, metrics, status, evaluations and W&B id from ``save`` (overwrite=true)."""
    root = checkpoints_dir(save)
    for d in [d for _, d in step_dirs(root)] + sorted(root.glob(FAILED_PREFIX + "*")):  # and those set aside
        remove_tree(d)
    for name in (METRICS, STATUS, WANDB_ID, WANDB_STEP, SWEEP_MANIFEST):
        (save / name).unlink(missing_ok=True)
    (root / LATEST).unlink(missing_ok=True)
    if (save / EVAL_DIR).is_dir():
        shutil.rmtree(save / EVAL_DIR)
    log.warning("overwrite=true: removed the previous run's checkpoints, metrics, status and evaluations in %s", save)


class SaveInUseError(CheckpointError):
    """``save`` holds another run's checkpoints, or records checkpoints it no longer holds: this run refuses to start
    and leaves that run's files alone."""


def choose_start(cfg: Config, data: dict) -> tuple[Path | None, CheckpointHold | None]:
    """Rank 0: the checkpoint this run continues (its own, in ``save``) or starts from (``load``; held until it is
    read, so that the run writing it cannot prune it meanwhile); None = fresh.

    ``save`` may hold only this run's own checkpoints: ones written by a run with the same ``load`` source and the
    same model. Anything else (another run's checkpoints, only incomplete ones, or any with resume=never), its own
    checkpoint trained on other data than ``data`` (:func:`~neox_dar.data.identity.data_identity`: the run could
    not continue exactly), and a ``save`` whose status.json records a checkpoint when it holds none (its checkpoints
    moved or deleted: starting again would replace its metrics), is a SaveInUseError unless ``overwrite`` discards
    it first."""
    save = Path(cfg.run.save)
    clean_leftovers(checkpoints_dir(save))
    how = "train into another 'save', or set overwrite=true to discard them (they are kept otherwise)"
    problem = None
    if step_dirs(checkpoints_dir(save)):
        own = None if cfg.run.resume == "never" else newest_checkpoint(save)
        if cfg.run.resume == "never":
            problem = f"{save} already holds checkpoints and resume=never starts a fresh run"
        elif own is None:
            problem = f"{save} holds checkpoints but none is complete (see the warnings above)"
        else:
            problem = model_mismatch(own, cfg)
            prior = None if problem else load_config(own / CONFIG)
            if prior is not None and source_path(prior.run.load) != source_path(cfg.run.load):
                problem = (f"{save} holds the checkpoints of another run (started from {prior.run.load or 'scratch'}; "
                           f"this one starts from {cfg.run.load or 'scratch'})")
            elif (change := data_change(read_state(own).get("data"), data)) is not None:
                problem = f"the data changed since {own} was written: {change}"
                how = (f"restore that data to continue the run exactly, continue from its checkpoint in a new run "
                       f"(save=NEW load={save}), or set overwrite=true to discard it")
        if problem is None:
            set_aside_newer(checkpoints_dir(save), own)  # each failed its check (warned above)
            return own, None
    elif recorded := recorded_checkpoint(save):
        problem = (f"{save} holds no checkpoint but its {STATUS} records one at step {recorded} (were its "
                   f"{checkpoints_dir(save).name}/ moved or deleted?)")
        how = ("restore its checkpoints to continue it, or set overwrite=true to start it again "
               "(discarding its metrics, status and evaluations)")
    if problem is not None:
        if not cfg.run.overwrite:
            raise SaveInUseError(f"{problem}: {how}")
        discard_run(save)
    if cfg.run.load and cfg.run.resume != "never":
        held = hold_checkpoint(cfg.run.load)
        found = held.path
        # weights only, without finetune: said first (a variant the config adds is what finetune=true takes)
        if not cfg.run.finetune and weights_only(found):
            mismatch = WEIGHTS_ONLY
        else:
            mismatch = finetune_mismatch(found, cfg) if cfg.run.finetune else model_mismatch(found, cfg)
        if mismatch:
            held.release()
            raise CheckpointError(f"load={cfg.run.load}: {mismatch}")
        if (unfinished := _unfinished(cfg.run.load, found)) is not None:
            log.warning(unfinished)
        return found, held
    return None, None


def _unfinished(load: str, found: Path) -> str | None:
    """A warning when ``load`` names a run directory whose run has not finished (interrupted, failed, running: a
    later stage would start from an earlier stage's middle), naming the checkpoint taken; None for a finished run,
    a checkpoint named by its step directory, or an import."""
    try:
        status = read_status(load)
    except (RunFileError, OSError):
        return None
    if not status or status.get("state") == "done":
        return None
    return (f"load={load} is a run that has not finished ({status.get('state')} at step {status.get('step')} of "
            f"{status.get('train_iters')}): starting from its newest checkpoint, {found.name}; load its run again "
            "once it is done to start from its end")


def start_point(cfg: Config, info: DistInfo
                 ) -> tuple[Path | None, Path | None, CheckpointHold | None, dict | None]:
    """The checkpoint to continue (or, finetuning, take the weights of) and the tokenizer the run records
    (:func:`neox_dar.tokenizer.run_tokenizer`), decided by rank 0 and shared with every rank (collective); and, on
    rank 0, the hold on a ``load`` checkpoint (release it once every rank has read it) and the identity of the
    data (:func:`~neox_dar.data.identity.data_identity`, for the checkpoints to record)."""
    decision: list = [None]
    held = data = None
    if info.is_main:
        try:
            data = data_identity(cfg)
            start, held = choose_start(cfg, data)
            decision[0] = ("start", (start, run_tokenizer(cfg.model, start)))
        except Exception as e:  # shared with the other ranks, which would otherwise wait forever
            if held is not None:
                held.release()
            decision[0] = ("error", e)
    dist.broadcast_object_list(decision, src=0)
    kind, value = decision[0]
    if kind == "error":
        raise value
    return (*value, held, data)


def is_own(step_dir: Path, save: Path) -> bool:
    """Whether ``step_dir`` is one of ``save``'s own checkpoints (a run continuing) rather than ``load``'s."""
    return step_dir.resolve().parent == checkpoints_dir(save).resolve()


def record_tokenizer(save: Path, tokenizer: Path | None) -> None:
    """Rank 0, lock held: the run's tokenizer into ``save/tokenizer/`` (checkpoints copy it from there); a run
    without one says what that means, and drops a previous run's copy."""
    if tokenizer is not None:
        record_run_tokenizer(tokenizer, save)
        log.info("tokenizer: %s (recorded in %s)", tokenizer, save / RUN_TOKENIZER_DIR)
        return
    shutil.rmtree(save / RUN_TOKENIZER_DIR, ignore_errors=True)
    log.warning("this run records no tokenizer (no vocab_file, and the checkpoint it starts from has none): "
                "evaluation, generation and export of its checkpoints will need --tokenizer")
