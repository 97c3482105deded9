"""Validation loss, counted and positioned as GPT-NeoX does.

GPT-NeoX builds ``(train_iters // eval_interval + 1) * eval_iters * train_batch_size`` validation
samples (an evaluation every ``eval_interval`` steps plus a final one). An evaluation runs
``eval_iters`` global batches, each ``gradient_accumulation_steps`` micro-batches per rank, and
the validation iterator moves on with every evaluation: evaluation k (0-based) reads global
micro-batches ``[k * eval_iters * grad_accum, (k + 1) * eval_iters * grad_accum)`` of the
validation set, modulo the number of whole global micro-batches it holds. The position comes
from k alone, so a resumed run reads exactly what an uninterrupted one reads. (GPT-NeoX's resume
offset, ``(iteration * grad_accum // eval_interval) * eval_iters`` micro-batches, is the same
number whenever grad_accum is 1 or the checkpoint step is a multiple of eval_interval, and skips
ahead otherwise.) The loss is the mean over every rank's micro-batches that hold a labelled token (all of them
for packed data); with ``calculate_per_token_loss``, the cross-entropy summed over every rank's micro-batches divided
by their labelled tokens; NaN when no micro-batch holds one.

``eval_mode: fixed`` reads the first ``eval_iters`` global batches every time instead (the same
data at every evaluation, so successive values differ only by the model).
"""

from __future__ import annotations

import math
from typing import Iterator

import torch

from ..config import Config
from ..data.conversations import IGNORE
from .batches import inputs_and_targets, micro_batch_loss, micro_batches
from .distributed import DistInfo, all_reduce_mean
from .logging_sinks import perplexity


def validation_samples(cfg: Config, world_size: int) -> int:
    """Validation samples the run needs, GPT-NeoX's count (0 when validation is off)."""
    if cfg.run.eval_interval == 0:
        return 0
    evaluations = cfg.training.train_iters // cfg.run.eval_interval + 1
    return evaluations * cfg.run.eval_iters * cfg.training.global_batch_for(world_size)


def evaluation_micro_batches(valid_ds, cfg: Config, info: DistInfo, evaluation: int) -> Iterator[torch.Tensor]:
    """This rank's micro-batches (B, seq_length + 1) for evaluation number ``evaluation`` (0-based)."""
    per_global = cfg.training.train_micro_batch_size_per_gpu * info.world_size  # samples in one global micro-batch
    # global micro-batches per evaluation
    count = cfg.run.eval_iters * cfg.training.gradient_accumulation_for(info.world_size)
    available = len(valid_ds) // per_global
    if available == 0:
        raise ValueError(f"the validation set holds {len(valid_ds)} samples, fewer than one global micro-batch "
                         f"({per_global})")
    position = 0 if cfg.run.eval_mode == "fixed" else evaluation * count % available
    while count:  # one contiguous stretch at a time, wrapping to the start of the set
        n = min(count, available - position)
        yield from micro_batches(valid_ds, cfg, info, (position + n) * per_global, position * per_global)
        count, position = count - n, 0


@torch.no_grad()
def evaluate(engine, valid_ds, cfg: Config, info: DistInfo, evaluation: int) -> dict[str, float]:
    """``{"valid_loss", "valid_ppl"}`` of evaluation number ``evaluation`` (0-based), averaged over all ranks."""
    engine.eval()
    losses, counts = [], []
    try:
        for tokens in evaluation_micro_batches(valid_ds, cfg, info, evaluation):
            x, y, _ = inputs_and_targets(tokens, info.device)
            losses.append(micro_batch_loss(engine, x, y))
            counts.append((y != IGNORE).sum())
    finally:
        engine.train()
    losses, counts = torch.stack(losses).double(), torch.stack(counts).double()
    if cfg.training.calculate_per_token_loss:  # summed over every rank, then divided: a ratio of two means
        total, n = all_reduce_mean([(losses * counts).sum().item(), counts.sum().item()], info.device)
    else:  # the mean of every rank's micro-batch means; a micro-batch without a labelled token has none
        total, n = all_reduce_mean([losses[counts > 0].sum().item(), (counts > 0).sum().item()], info.device)
    loss = total / n if n else math.nan  # nothing labelled: no loss (it said 0, a perfect score)
    return {"valid_loss": loss, "valid_ppl": perplexity(loss)}
