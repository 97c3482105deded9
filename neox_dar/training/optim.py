"""Pythia's optimizer and learning-rate schedule.

Adam with decoupled weight decay (GPT-NeoX's ``Adam`` with ``weight_decay`` is AdamW); no weight decay on
biases and LayerNorm parameters (every parameter with fewer than 2 dims), decay on matrices and embeddings.

LR schedule (GPT-NeoX ``AnnealingLR``, with the step counted from 1): for optimizer step ``s = it + 1``
(``it`` = steps already taken), with ``W = warmup_iters``, ``D = lr_decay_iters``, peak ``lr``, final ``min_lr``:

    s <= W:          lr * s / W                                         (linear warmup)
    W < s <= D:      min_lr + (lr - min_lr) * f((s - W) / (D - W))       f: cosine 0.5 (1 + cos(pi p)),
                                                                            linear 1 - p, constant 1
    s > D:           min_lr                                             (constant: lr)
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ..config import Config


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Up to two groups of the parameters that train: matrices/embeddings with ``weight_decay``, biases and norm
    weights (ndim < 2) without (an empty group is left out: DeepSpeed's ZeRO optimizers drop them)."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:  # ZeRO-3 keeps a partitioned parameter's own shape as ds_shape
            (decay if len(getattr(p, "ds_shape", p.shape)) >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, cfg: Config, device: torch.device) -> torch.optim.Optimizer:
    """``torch.optim.AdamW`` over Pythia's parameter groups (fused kernel on CUDA, foreach on CPU)."""
    p = cfg.training.optimizer.params
    impl = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(param_groups(model, cfg.training.weight_decay), lr=p.lr, betas=tuple(p.betas), eps=p.eps,
                             **impl)


def lr_at(cfg: Config, it: int) -> float:
    """Learning rate of optimizer step ``it + 1`` (``it`` steps already taken)."""
    peak, final = cfg.training.optimizer.params.lr, cfg.training.min_lr
    s, warm, decay = it + 1, cfg.training.warmup_iters, cfg.training.lr_decay_iters
    if warm > 0 and s <= warm:
        return peak * s / warm
    if cfg.training.lr_decay_style == "constant":
        return peak
    if s >= decay:  # also when the decay ends within the warmup
        return final
    progress = (s - warm) / (decay - warm)
    if cfg.training.lr_decay_style == "linear":  # GPT-NeoX's: toward 0, floored at min_lr
        return max(final, peak * (1.0 - progress))
    return final + (peak - final) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Config) -> LambdaLR:
    """A :class:`LambdaLR` stepping once per optimizer step (DeepSpeed steps it after each update).

    The multiplier is a plain function, so checkpoints hold the step count and the peak (``base_lrs``): a resumed
    run follows the schedule of its current config (e.g. a longer ``train_iters``, another ``lr``) once
    :func:`resume_schedule` has replaced the saved peak and learning rate."""
    peak = cfg.training.optimizer.params.lr

    def multiplier(it: int) -> float:
        return lr_at(cfg, it) / peak

    return LambdaLR(optimizer, multiplier)


def resume_schedule(scheduler: LambdaLR, cfg: Config, model: nn.Module) -> None:
    """After a checkpoint's scheduler and optimizer states are loaded: the current config's peak as the scheduler's
    ``base_lrs`` (the state holds the saved run's) and the learning rate of the next step in every parameter group
    (the optimizer state holds the saved run's last one), computed as the scheduler's own step computes it; and
    the config's ``weight_decay`` (on the groups of :func:`param_groups` over ``model``), ``betas`` and ``eps``,
    which the loaded groups also hold as the saved run had them (the same values when the config is unchanged)."""
    p = cfg.training.optimizer.params
    groups = scheduler.optimizer.param_groups
    for group, fresh in zip(groups, param_groups(model, cfg.training.weight_decay), strict=True):
        group["weight_decay"], group["betas"], group["eps"] = fresh["weight_decay"], tuple(p.betas), p.eps
    peak = p.lr
    scheduler.base_lrs = [peak] * len(scheduler.optimizer.param_groups)
    values = [base * rule(scheduler.last_epoch) for base, rule in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(scheduler.optimizer.param_groups, values):
        group["initial_lr"], group["lr"] = peak, lr
    scheduler._last_lr = values
