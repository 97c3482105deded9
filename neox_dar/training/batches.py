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


def token_weights(targets: list[torch.Tensor], world_size: int) -> list[torch.Tensor]:
    """Per micro-batch factors that turn its mean loss into its share of a per-token step loss
    (``calculate_per_token_loss``): ``targets`` are this rank's micro-batches of one step (each (B, T), -100 off);
    micro-batch ``i`` with ``n_i`` labelled targets gets ``n_i * len(targets) * world_size / N``, ``N`` the step's
    labelled targets on every rank (one all-reduce when a process group runs). DeepSpeed divides each backward by the
    accumulation steps and averages the gradients over ranks, so the step's gradient is that of the summed
    cross-entropy over ``N``: every labelled token weighs the same, whichever micro-batch or rank holds it."""
    counts = torch.stack([(t != IGNORE).sum() for t in targets]).to(torch.float64)
    total = counts.sum()
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(total)
    return list((counts * (len(targets) * world_size) / total.clamp(min=1)).float())


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
