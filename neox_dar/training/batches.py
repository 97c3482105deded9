"""Micro-batches from the data module, and the language-modelling loss.

A micro-batch is ``tokens`` (B, T + 1) of packed samples, or ``(tokens, labels)`` (B, L) of right-padded
conversations (:mod:`neox_dar.data.conversations`): the loss is then on the labelled tokens only (GPT-NeoX's
label convention, -100 where it is off)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ..config import Config
from ..data import DataParallelSampler
from ..data.conversations import IGNORE, ConversationDataset, pad_collate
from .distributed import DistInfo


def _stack(samples: list[np.ndarray]) -> torch.Tensor:
    """``samples`` of ``int64[seq_length + 1]`` -> LongTensor (B, seq_length + 1)."""
    return torch.from_numpy(np.stack(samples).astype(np.int64, copy=False))


def micro_batches(ds, cfg: Config, info: DistInfo, total_samples: int, consumed_samples: int) -> DataLoader:
    """This rank's micro-batches (B = ``train_micro_batch_size_per_gpu``) of ``ds``, starting after
    ``consumed_samples`` global samples. The loader has its own generator (seeded by ``seed``), so starting its
    iterator leaves the global one, which dropout draws from, as a resumed checkpoint restored it."""
    sampler = DataParallelSampler(total_samples, consumed_samples, cfg.training.train_micro_batch_size_per_gpu,
                                  info.rank, info.world_size)
    collate = pad_collate if isinstance(ds, ConversationDataset) else _stack
    return DataLoader(ds, batch_sampler=sampler, num_workers=cfg.data.num_workers, collate_fn=collate,
                      pin_memory=info.device.type == "cuda",
                      generator=torch.Generator().manual_seed(cfg.training.seed + info.rank))


def inputs_and_targets(batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Packed tokens (B, T + 1), or conversations ``(tokens, labels, real)`` (B, L) -> inputs (B, T), next-token
    targets (B, T) (-100: no loss there) and, for conversations, the inputs whose next token is the conversation's
    (B, T) bool, the positions a conversation alone would have (None: all), on ``device``."""
    if isinstance(batch, (tuple, list)):
        tokens, labels, real = (t.to(device, non_blocking=True) for t in batch)
        return tokens[:, :-1], labels[:, 1:], real[:, 1:]
    tokens = batch.to(device, non_blocking=True)
    return tokens[:, :-1], tokens[:, 1:], None


def micro_batch_loss(model, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The training and validation loss: mean next-token cross-entropy in float32 over the targets that are not
    -100; ``model`` (a :class:`~neox_dar.model.CausalLM` or the engine around it), ``inputs`` and ``targets`` (B, T)
    -> scalar (0 when no target counts). Computed from the final hidden states chunk by chunk
    (:mod:`neox_dar.loss`): the (B, T, V) logits and their float32 copy are never materialised. Equals
    :func:`lm_loss` of ``model(inputs)`` within float rounding, gradients too."""
    return model(inputs, targets)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The same loss of logits already computed: ``logits`` (B, T, V), ``targets`` (B, T) -> scalar mean
    cross-entropy in float32 over the targets that are not -100 (0 when none counts)."""
    flat = targets.reshape(-1)
    total = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), flat, ignore_index=IGNORE, reduction="sum")
    return total / (flat != IGNORE).sum().clamp(min=1)
