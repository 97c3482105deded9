"""The training loop: resume, train ``train_iters`` optimizer steps, log, validate, checkpoint, stop on signals.

Exit codes: 0 done; 3 stopped early with a checkpoint (SIGTERM/SIGUSR1, or ``exit_interval``): run the
same command again to continue.
"""

from __future__ import annotations

import logging
import math
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..config import Config, load_config
from ..data import build_datasets
from ..data.identity import data_change, data_identity
from ..evaluation.perplexity import SWEEP_MANIFEST
from ..rundir import (CONFIG, EVAL_DIR, LATEST, METRICS, STATUS, WANDB_ID, CheckpointError, CheckpointHold,
                      RunFileError, checkpoints_dir, clean_leftovers, hold_checkpoint, lock_run_dir, newest_checkpoint,
                      read_state, recorded_checkpoint, remove_tree, step_dirs, write_status)
from ..tokenizer import RUN_TOKENIZER_DIR, record_run_tokenizer, run_tokenizer
from . import startup
from .batches import inputs_and_targets, micro_batch_loss, micro_batches
from .checkpointing import (TrainState, check_resumable, load_checkpoint, model_mismatch, sampling_changes,
                            save_checkpoint)
from .corpus_eval import CorpusEvaluator
from .distributed import DistInfo, all_reduce_mean, any_rank, barrier
from .engine import build_engine
from .finetune import finetune_mismatch, prepare_model
from .logging_sinks import RunLogger
from .metrics import attention_stat_metrics, memory_gb, peak_flops, summary_line, throughput
from .signals import EXIT_INTERRUPTED, StopRequest
from .validation import evaluate, validation_samples

log = logging.getLogger("neox_dar.train")
EXIT_DONE = 0


def _seed_rank(cfg: Config, rank: int) -> None:
    """Per-rank seeds for everything random after model init (dropout differs across data-parallel ranks)."""
    seed = cfg.training.seed + rank
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _source(path: str | None) -> str | None:
    return os.path.abspath(path) if path else None


def _discard_run(save: Path) -> None:
    """Remove another run's checkpoints, metrics, status, evaluations and W&B id from ``save`` (overwrite=true)."""
    root = checkpoints_dir(save)
    for _, d in step_dirs(root):
        remove_tree(d)
    for name in (METRICS, STATUS, WANDB_ID, SWEEP_MANIFEST):
        (save / name).unlink(missing_ok=True)
    (root / LATEST).unlink(missing_ok=True)
    if (save / EVAL_DIR).is_dir():
        shutil.rmtree(save / EVAL_DIR)
    log.warning("overwrite=true: removed the previous run's checkpoints, metrics, status and evaluations in %s", save)


class SaveInUseError(CheckpointError):
    """``save`` holds another run's checkpoints, or records checkpoints it no longer holds: this run refuses to start
    and leaves that run's files alone."""


def _choose_start(cfg: Config, data: dict) -> tuple[Path | None, CheckpointHold | None]:
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
            if prior is not None and _source(prior.run.load) != _source(cfg.run.load):
                problem = (f"{save} holds the checkpoints of another run (started from {prior.run.load or 'scratch'}; "
                           f"this one starts from {cfg.run.load or 'scratch'})")
            elif (change := data_change(read_state(own).get("data"), data)) is not None:
                problem = f"the data changed since {own} was written: {change}"
                how = (f"restore that data to continue the run exactly, continue from its checkpoint in a new run "
                       f"(save=NEW load={save}), or set overwrite=true to discard it")
        if problem is None:
            return own, None
    elif recorded := recorded_checkpoint(save):
        problem = (f"{save} holds no checkpoint but its {STATUS} records one at step {recorded} (were its "
                   f"{checkpoints_dir(save).name}/ moved or deleted?)")
        how = ("restore its checkpoints to continue it, or set overwrite=true to start it again "
               "(discarding its metrics, status and evaluations)")
    if problem is not None:
        if not cfg.run.overwrite:
            raise SaveInUseError(f"{problem}: {how}")
        _discard_run(save)
    if cfg.run.load and cfg.run.resume != "never":
        held = hold_checkpoint(cfg.run.load)
        found = held.path
        mismatch = finetune_mismatch(found, cfg) if cfg.run.finetune else model_mismatch(found, cfg)
        if not mismatch and not cfg.run.finetune and read_state(found).get("world_size") is None:
            mismatch = ("holds weights only (an import or an export), no training state to continue: set "
                        "finetune=true to start a new run from its weights")
        if mismatch:
            held.release()
            raise CheckpointError(f"load={cfg.run.load}: {mismatch}")
        return found, held
    return None, None


def _start_point(cfg: Config, info: DistInfo
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
            start, held = _choose_start(cfg, data)
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


def _is_own(step_dir: Path, save: Path) -> bool:
    """Whether ``step_dir`` is one of ``save``'s own checkpoints (a run continuing) rather than ``load``'s."""
    return step_dir.resolve().parent == checkpoints_dir(save).resolve()


def calibration_sequences(train_ds, cfg: Config) -> list[torch.Tensor]:
    """The first ``dar_init_samples`` training samples' tokens (the same on every rank), for variants whose new
    parameters start from the data (DAR's ``dar_init: pca``)."""
    n = min(len(train_ds), getattr(cfg.model.attention, "dar_init_samples", 16))
    out = []
    for i in range(n):
        item = train_ds[i]
        tokens = item[0] if isinstance(item, tuple) else item  # a conversation: (tokens, labels)
        out.append(torch.as_tensor(np.asarray(tokens[:cfg.model.seq_length], dtype=np.int64)))
    return out


def _averaged_stats(model, info: DistInfo) -> dict:
    """The model's attention statistics from the last forward, averaged over ranks, as metrics fields."""
    stats = model.attention_stats()
    if not stats:
        return {}
    keys = sorted(stats)
    flat = torch.cat([stats[k].detach().float().reshape(-1) for k in keys]).tolist()
    mean = all_reduce_mean(flat, info.device)
    out, i = {}, 0
    for k in keys:
        n = stats[k].numel()
        out[k] = torch.tensor(mean[i:i + n])
        i += n
    return attention_stat_metrics(out)


def unclipped_grad_norm(model) -> torch.Tensor:
    """L2 norm of all gradients (already averaged over ranks by DeepSpeed's backward at the boundary)."""
    return torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])


def _record_tokenizer(save: Path, tokenizer: Path | None) -> None:
    """Rank 0, lock held: the run's tokenizer into ``save/tokenizer/`` (checkpoints copy it from there); a run
    without one says what that means, and drops a previous run's copy."""
    if tokenizer is not None:
        record_run_tokenizer(tokenizer, save)
        log.info("tokenizer: %s (recorded in %s)", tokenizer, save / RUN_TOKENIZER_DIR)
        return
    shutil.rmtree(save / RUN_TOKENIZER_DIR, ignore_errors=True)
    log.warning("this run records no tokenizer (no vocab_file, and the checkpoint it starts from has none): "
                "evaluation, generation and export of its checkpoints will need --tokenizer")


def _mark_failed(save: Path, state: TrainState, train_iters: int, error: BaseException) -> None:
    """status.json = failed with the error's first line, still recording the newest checkpoint (this run's, or the
    one the status recorded before a start that failed before reading it) and at least its step; a failing status
    write is logged, not raised."""
    reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:500]
    try:
        recorded = recorded_checkpoint(save)
    except RunFileError:  # a torn status.json: replaced
        recorded = 0
    try:
        checkpoint = max(state.checkpoint, recorded)
        write_status(save, "failed", max(state.step, checkpoint), train_iters, checkpoint=checkpoint, reason=reason)
    except OSError as e:
        log.error("could not record the failure in %s: %s", save / STATUS, e)


class DivergedError(RuntimeError):
    """The logged loss is not finite: the run stops (status failed) instead of training on, one line."""


def train(cfg: Config, info: DistInfo) -> int:
    """Run (or continue) training; return the process exit code. Every exit writes a final status.json:
    done, interrupted (stopped at a checkpoint: run again to continue) or failed (with the reason)."""
    save = Path(cfg.run.save)
    ckpt_root = checkpoints_dir(save)
    run_lock = lock_run_dir(save) if info.is_main else None  # a second trainer on this save stops here, one line
    stop = StopRequest()  # from here on, SIGTERM/SIGUSR1 stop the run at the first step boundary
    state = TrainState()
    logger = held = None
    try:
        start_dir, tokenizer, held, data = _start_point(cfg, info)
        if run_lock is not None:
            run_lock.record()
            _record_tokenizer(save, tokenizer)
        startup.mark("run directory")
        # finetune: a new run from load='s weights (its own checkpoints, once it has some, are resumed as usual)
        pretrained = start_dir if cfg.run.finetune and start_dir is not None and not _is_own(start_dir, save) else None
        if start_dir is not None and pretrained is None:
            check_resumable(start_dir, cfg, info)  # before the data index and the engine
        world = info.world_size
        global_batch = cfg.training.global_batch_for(world)
        train_samples = cfg.training.train_iters * global_batch
        train_ds, valid_ds = build_datasets(cfg, train_samples, validation_samples(cfg, world), world)
        startup.mark("data index")
        prepared: list[str] = []

        def prepare(model) -> None:
            calibration = calibration_sequences(train_ds, cfg) if pretrained is not None else []
            prepared.extend(prepare_model(model, cfg, pretrained, calibration))

        engine, model, flops = build_engine(cfg, info, prepare)
        startup.mark("engine")
        grad_accum = engine.gradient_accumulation_steps()

        if start_dir is not None and pretrained is None:
            state = load_checkpoint(engine, cfg, info, start_dir)
            if _is_own(start_dir, save):
                state.checkpoint = state.step
        else:
            _seed_rank(cfg, info.rank)
        barrier()  # every rank has read the start checkpoint
        if held is not None:
            held.release()
        batches = iter(micro_batches(train_ds, cfg, info, max(train_samples, state.consumed_samples),
                                     state.consumed_samples))

        logger = RunLogger(cfg, info.is_main, state.step)
        for line in prepared:
            logger.message(line)
        if cfg.run.eval_interval and valid_ds is None:
            logger.message("no validation data (split gives it no share and no valid_data_paths): no valid_loss")
        if start_dir is not None and pretrained is None:
            logger.message(f"resumed from {start_dir} at step {state.step} ({state.consumed_samples} samples)")
            if (changes := sampling_changes(start_dir, cfg, info)) is not None:
                logger.message(changes)
            if state.step > cfg.training.train_iters:
                logger.message(f"step {state.step} is past train_iters={cfg.training.train_iters}: nothing to "
                               "train (raise train_iters to continue the run)")
        corpus_eval = CorpusEvaluator(cfg, info) if cfg.run.eval_perplexity.interval else None
        if info.is_main:
            write_status(save, "running", state.step, cfg.training.train_iters, checkpoint=state.checkpoint)
        peak = peak_flops(cfg.run.peak_flops, info.device, cfg.training.dtype)
        interval_t0, interval_steps = time.time(), 0
        intervals: list[tuple[int, float]] = []  # (steps, seconds) of each log interval: the run's summary line
        last_save = interval_t0  # checkpoint_minutes counts from the start, then from each save
        exit_code = EXIT_DONE
        # DeepSpeed reports the global gradient norm from its ZeRO/mixed-precision optimizers, not at fp32 ZeRO-0
        own_grad_norm = engine.zero_optimization_stage() == 0 and cfg.training.dtype == "fp32"
        grad_norm = None
        startup.mark("checkpoint and logs")
        first_step = True
        while state.step < cfg.training.train_iters:
            lr = engine.get_lr()[0]
            lm_sum = torch.zeros((), device=info.device)
            aux_sum = torch.zeros((), device=info.device)
            for micro_step in range(grad_accum):
                x, y = inputs_and_targets(next(batches), info.device)
                lm = micro_batch_loss(engine, x, y)
                aux = model.aux_loss().float()
                engine.backward(lm + aux)
                if own_grad_norm and micro_step == grad_accum - 1:
                    grad_norm = unclipped_grad_norm(model)
                engine.step()
                lm_sum += lm.detach()
                aux_sum += aux.detach()
            state.step += 1
            state.consumed_samples += global_batch
            state.interval_losses.append(torch.stack([lm_sum, aux_sum]) / grad_accum)
            interval_steps += 1
            logger.advance(state.step)
            if first_step:
                startup.mark("first step")
                logger.message(startup.line())
                first_step = False

            if state.step % cfg.run.log_interval == 0 or state.step == cfg.training.train_iters:
                if info.device.type == "cuda":
                    torch.cuda.synchronize(info.device)
                lm_mean, aux_mean = all_reduce_mean(torch.stack(state.interval_losses).mean(0).tolist(), info.device)
                if not own_grad_norm:
                    grad_norm = engine.get_global_grad_norm()
                intervals.append((interval_steps, time.time() - interval_t0))
                row = {"step": state.step, "loss": lm_mean + aux_mean, "lm_loss": lm_mean, "aux_loss": aux_mean,
                       "lr": lr, "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
                       "consumed_samples": state.consumed_samples,
                       **throughput(*intervals[-1], global_batch, cfg.model.seq_length, world, flops, peak),
                       **memory_gb(info.device), **_averaged_stats(model, info)}
                scale = getattr(engine.optimizer, "cur_scale", None) if engine.fp16_enabled() else None
                if scale is not None:
                    row["loss_scale"] = float(scale)
                logger.log(row)
                if not math.isfinite(lm_mean + aux_mean):
                    raise DivergedError(
                        f"the loss is {lm_mean + aux_mean} at step {state.step}: training diverged (lower "
                        f"optimizer.params.lr, raise warmup or gradient_clipping, or check the data); "
                        + (f"its last checkpoint is step {state.checkpoint}" if state.checkpoint else
                           "no checkpoint was written"))
                state.interval_losses, interval_t0, interval_steps = [], time.time(), 0

            if valid_ds is not None and cfg.run.eval_interval and (state.step % cfg.run.eval_interval == 0
                                                               or state.step == cfg.training.train_iters):
                evaluation = -(-state.step // cfg.run.eval_interval) - 1  # evaluations before this one: stream position
                logger.log({"step": state.step, **evaluate(engine, valid_ds, cfg, info, evaluation),
                            "consumed_samples": state.consumed_samples})
                interval_t0 = time.time()

            if corpus_eval is not None and (state.step % cfg.run.eval_perplexity.interval == 0
                                            or state.step == cfg.training.train_iters):
                logger.log(corpus_eval(engine, state.step))
                interval_t0 = time.time()

            stopping = any_rank(stop.received is not None, info.device)
            early_exit = bool(cfg.run.exit_interval) and state.step % cfg.run.exit_interval == 0
            timed = cfg.run.checkpoint_minutes is not None and any_rank(
                time.time() - last_save >= 60 * cfg.run.checkpoint_minutes, info.device)  # one step on every rank
            if (state.step % cfg.run.checkpoint_factor == 0 or state.step == cfg.training.train_iters or stopping
                    or early_exit or timed):
                where = save_checkpoint(engine, cfg, info, ckpt_root, state, cfg.run.keep_last_n, data)
                state.checkpoint = state.step
                if info.is_main:
                    write_status(save, "running", state.step, cfg.training.train_iters, checkpoint=state.checkpoint)
                logger.message(f"saved checkpoint {where}")
                interval_t0 = last_save = time.time()
            if (stopping or early_exit) and state.step < cfg.training.train_iters:
                why = stop.received or ("another rank's signal" if stopping
                                        else f"exit_interval={cfg.run.exit_interval}")
                logger.message(f"stopped at step {state.step} ({why}); run the same command again to continue")
                exit_code = EXIT_INTERRUPTED
                break
        if intervals:
            logger.message(summary_line(intervals, global_batch, cfg.model.seq_length, world, flops, peak, info.device))
        if info.is_main:
            write_status(save, "done" if exit_code == EXIT_DONE else "interrupted", state.step,
                         cfg.training.train_iters, checkpoint=state.checkpoint)
        return exit_code
    except BaseException as e:
        if info.is_main and not isinstance(e, SaveInUseError):
            _mark_failed(save, state, cfg.training.train_iters, e)
        raise
    finally:
        stop.restore()
        if held is not None:
            held.release()
        if logger is not None:
            logger.close()
        if run_lock is not None:
            run_lock.release()
