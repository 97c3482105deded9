"""Validation loss on the held-out split: ``eval_iters`` micro-batches per rank, always the same ones
(the first ``eval_iters * micro * world_size`` validation samples), so successive values are comparable."""

from __future__ import annotations

import torch

from ..config import Config
from .batches import inputs_and_targets, lm_loss, micro_batches
from .distributed import DistInfo, all_reduce_mean
from .logging_sinks import perplexity


def validation_samples(cfg: Config, world_size: int) -> int:
    """Validation samples the run needs (0 when validation is off)."""
    return cfg.eval_iters * cfg.train_micro_batch_size_per_gpu * world_size if cfg.eval_interval > 0 else 0


@torch.no_grad()
def evaluate(engine, valid_ds, cfg: Config, info: DistInfo) -> dict[str, float]:
    """``{"valid_loss", "valid_ppl"}``: mean LM loss over the fixed validation micro-batches, all ranks."""
    total = min(len(valid_ds), validation_samples(cfg, info.world_size))
    engine.eval()
    losses = []
    try:
        for tokens in micro_batches(valid_ds, cfg, info, total, 0):
            x, y = inputs_and_targets(tokens, info.device)
            losses.append(lm_loss(engine(x), y))
    finally:
        engine.train()
    local = torch.stack(losses).mean().item() if losses else float("nan")
    (loss,) = all_reduce_mean([local], info.device)
    return {"valid_loss": loss, "valid_ppl": perplexity(loss)}
