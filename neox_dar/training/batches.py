"""Micro-batches from the data module, and the language-modelling loss."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ..config import Config
from ..data import DataParallelSampler
from .distributed import DistInfo


def _stack(samples: list[np.ndarray]) -> torch.Tensor:
    """``samples`` of ``int64[seq_length + 1]`` -> LongTensor (B, seq_length + 1)."""
    return torch.from_numpy(np.stack(samples).astype(np.int64, copy=False))


def micro_batches(ds, cfg: Config, info: DistInfo, total_samples: int, consumed_samples: int) -> DataLoader:
    """This rank's micro-batches (B = ``train_micro_batch_size_per_gpu``) of ``ds``, starting after
    ``consumed_samples`` global samples."""
    sampler = DataParallelSampler(total_samples, consumed_samples, cfg.training.train_micro_batch_size_per_gpu,
                                  info.rank, info.world_size)
    return DataLoader(ds, batch_sampler=sampler, num_workers=cfg.data.num_workers, collate_fn=_stack,
                      pin_memory=info.device.type == "cuda")


def inputs_and_targets(tokens: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T + 1) tokens -> inputs (B, T) and next-token targets (B, T) on ``device``."""
    tokens = tokens.to(device, non_blocking=True)
    return tokens[:, :-1], tokens[:, 1:]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in float32: ``logits`` (B, T, V), ``targets`` (B, T) -> scalar."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
