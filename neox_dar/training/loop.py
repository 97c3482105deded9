"""The training loop: resume, train ``train_iters`` optimizer steps, log, validate, checkpoint, stop on signals.

Exit codes: 0 done; 3 stopped early with a checkpoint (SIGTERM/SIGUSR1, or ``exit_interval``): run the
same command again to continue.
"""

from __future__ import annotations

import logging
import math
import random
import time
from pathlib import Path

import numpy as np
import torch

from ..config import Config
from ..data import build_datasets, index_epochs
from ..rundir import (STATUS, RunFileError, checkpoints_dir, lock_run_dir, read_state, recorded_checkpoint,
                      write_status)
from . import startup
from .batches import inputs_and_targets, micro_batch_loss, micro_batches, token_weights
from .checkpointing import TrainState, check_resumable, load_checkpoint, sampling_changes, save_checkpoint
from .corpus_eval import CorpusEvaluator
from .distributed import DistInfo, all_reduce_mean, any_rank, barrier
from .engine import build_engine
from .finetune import prepare_model
from .logging_sinks import RunLogger
from .metrics import IntervalClock, attention_stat_metrics, memory_gb, peak_flops, summary_line, throughput
from .signals import EXIT_INTERRUPTED, StopRequest
from .start import SaveInUseError, is_own, record_tokenizer, start_point
from .validation import evaluate, validation_samples

log = logging.getLogger("neox_dar.train")
EXIT_DONE = 0


def _seed_rank(cfg: Config, rank: int) -> None:
    """Per-rank seeds for everything random after model init (dropout differs across data-parallel ranks)."""
    seed = cfg.training.seed + rank
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


def _averaged_stats(model, info: DistInfo, real: torch.Tensor | None) -> dict:
    """The model's attention statistics from the last forward (the step's last micro-batch; over its ``real``
    positions, :func:`~neox_dar.training.batches.inputs_and_targets`), averaged over ranks, as metrics fields."""
    stats = model.attention_stats(real)
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
    """L2 norm of all gradients (already averaged over ranks by DeepSpeed's backward at the boundary), summed in
    float64 as DeepSpeed's ZeRO norm is (float32 sums lost ~1e-4 relative on a few million elements)."""
    return torch.stack([p.grad.double().pow(2).sum() for p in model.parameters() if p.grad is not None]).sum().sqrt()


def _mark_failed(save: Path, state: TrainState, train_iters: int, error: BaseException) -> None:
    """status.json = failed with the error's first line (interrupted, for a Ctrl-C that aborted the run), still
    recording the newest checkpoint (this run's, or the one the status recorded before a start that failed before
    reading it) and at least its step; a failing status write is logged, not raised."""
    aborted = isinstance(error, KeyboardInterrupt)
    reason = ("aborted with a second Ctrl-C" if aborted else
              f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:500])
    try:
        recorded = recorded_checkpoint(save)
    except RunFileError:  # a torn status.json: replaced
        recorded = 0
    try:
        checkpoint = max(state.checkpoint, recorded)
        write_status(save, "interrupted" if aborted else "failed", max(state.step, checkpoint), train_iters,
                     checkpoint=checkpoint, reason=reason)
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
        start_dir, tokenizer, held, data = start_point(cfg, info)
        if run_lock is not None:
            run_lock.record()
            record_tokenizer(save, tokenizer)
        startup.mark("run directory")
        # finetune: a new run from load='s weights (its own checkpoints, once it has some, are resumed as usual)
        pretrained = start_dir if cfg.run.finetune and start_dir is not None and not is_own(start_dir, save) else None
        if start_dir is not None and pretrained is None:
            check_resumable(start_dir, cfg, info)  # before the data index and the engine
        world = info.world_size
        global_batch = cfg.training.global_batch_for(world)
        train_samples = cfg.training.train_iters * global_batch
        if start_dir is not None and pretrained is None:  # a resume reads on from the samples it has consumed
            done = read_state(start_dir)  # with another global batch than its run's, more may be left than this
            left = max(0, cfg.training.train_iters - done["step"]) * global_batch
            train_samples = max(train_samples, done["consumed_samples"] + left)
        train_ds, valid_ds = build_datasets(cfg, train_samples, validation_samples(cfg, world), world)
        epochs = index_epochs(train_ds)
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
            if is_own(start_dir, save):
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
            if (changes := sampling_changes(start_dir, cfg, info, epochs)) is not None:
                logger.message(changes)
            if state.step > cfg.training.train_iters:
                logger.message(f"step {state.step} is past train_iters={cfg.training.train_iters}: nothing to "
                               "train (raise train_iters to continue the run)")
        corpus_eval = CorpusEvaluator(cfg, info) if cfg.run.eval_perplexity.interval else None
        if info.is_main:
            write_status(save, "running", state.step, cfg.training.train_iters, checkpoint=state.checkpoint)
        peak = peak_flops(cfg.run.peak_flops, info.device, cfg.training.dtype)
        clock, interval_steps = IntervalClock(), 0
        intervals: list[tuple[int, float]] = []  # (steps, seconds) of each log interval: the run's summary line
        last_save = clock.start  # checkpoint_minutes counts from the start, then from each save
        exit_code = EXIT_DONE
        # DeepSpeed reports the global gradient norm from its ZeRO/mixed-precision optimizers, not at fp32 ZeRO-0
        own_grad_norm = engine.zero_optimization_stage() == 0 and cfg.training.dtype == "fp32"
        grad_norm = None
        per_token = cfg.training.calculate_per_token_loss
        skipped_seen = engine.skipped_steps  # optimizer steps DeepSpeed skipped (restored with a checkpoint)
        startup.mark("checkpoint and logs")
        first_step = True
        while state.step < cfg.training.train_iters:
            lr = engine.get_lr()[0]
            lm_sum = torch.zeros((), device=info.device)
            aux_sum = torch.zeros((), device=info.device)
            step_batches = [inputs_and_targets(next(batches), info.device) for _ in range(grad_accum)]
            weights = token_weights([y for _, y, _ in step_batches], world) if per_token else None
            for micro_step, (x, y, real) in enumerate(step_batches):
                lm = micro_batch_loss(engine, x, y)
                if weights is not None:
                    lm = lm * weights[micro_step]
                aux = model.aux_loss(real).float()
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
                intervals.append((interval_steps, clock.seconds()))
                row = {"step": state.step, "loss": lm_mean + aux_mean, "lm_loss": lm_mean, "aux_loss": aux_mean,
                       "lr": lr, "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
                       "consumed_samples": state.consumed_samples,
                       **throughput(*intervals[-1], global_batch, cfg.model.seq_length, world, flops, peak),
                       **memory_gb(info.device), **_averaged_stats(model, info, real)}
                scale = getattr(engine.optimizer, "cur_scale", None) if engine.fp16_enabled() else None
                if scale is not None:
                    row["loss_scale"] = float(scale)
                if engine.skipped_steps:  # DeepSpeed's: fp16 overflows, and bf16 non-finite gradients (0.19)
                    row["skipped_steps"] = int(engine.skipped_steps)
                logger.log(row)
                if engine.skipped_steps > skipped_seen:
                    logger.message(f"warning: DeepSpeed skipped {engine.skipped_steps - skipped_seen} optimizer "
                                   f"step(s) up to step {state.step} (non-finite gradients; in fp16 also while its "
                                   "loss scale settles): the weights and the LR schedule did not advance there, "
                                   "while the step count did")
                    skipped_seen = engine.skipped_steps
                if not math.isfinite(lm_mean + aux_mean):
                    raise DivergedError(
                        f"the loss is {lm_mean + aux_mean} at step {state.step}: training diverged (lower "
                        f"optimizer.params.lr, raise warmup or gradient_clipping, or check the data); "
                        + (f"its last checkpoint is step {state.checkpoint}" if state.checkpoint else
                           "no checkpoint was written"))
                state.interval_losses, interval_steps = [], 0
                clock.restart()

            if valid_ds is not None and cfg.run.eval_interval and (state.step % cfg.run.eval_interval == 0
                                                               or state.step == cfg.training.train_iters):
                evaluation = -(-state.step // cfg.run.eval_interval) - 1  # evaluations before this one: stream position
                with clock.paused():
                    logger.log({"step": state.step, **evaluate(engine, valid_ds, cfg, info, evaluation),
                                "consumed_samples": state.consumed_samples})

            if corpus_eval is not None and (state.step % cfg.run.eval_perplexity.interval == 0
                                            or state.step == cfg.training.train_iters):
                with clock.paused():
                    logger.log(corpus_eval(engine, state.step))

            stopping = any_rank(stop.received is not None, info.device)
            early_exit = bool(cfg.run.exit_interval) and state.step % cfg.run.exit_interval == 0
            timed = cfg.run.checkpoint_minutes is not None and any_rank(
                time.time() - last_save >= 60 * cfg.run.checkpoint_minutes, info.device)  # one step on every rank
            if (state.step % cfg.run.checkpoint_factor == 0 or state.step == cfg.training.train_iters or stopping
                    or early_exit or timed):
                with clock.paused():
                    where = save_checkpoint(engine, cfg, info, ckpt_root, state, cfg.run.keep_last_n, data,
                                            epochs)
                    state.checkpoint = state.step
                    if info.is_main:
                        write_status(save, "running", state.step, cfg.training.train_iters,
                                     checkpoint=state.checkpoint)
                    logger.message(f"saved checkpoint {where}")
                last_save = time.time()
                # a signal that came while the checkpoint was written stops here, at the checkpoint just written
                stopping = stopping or any_rank(stop.received is not None, info.device)
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
