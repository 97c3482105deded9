"""Chat SFT samples: one conversation per sample, with its labels, never packed with another conversation.

``data_prep.chat`` writes a token dataset ``PREFIX`` and a label dataset ``PREFIX_label`` (GPT-NeoX's convention:
the label is the token itself where the loss is on, -100 where it is off), one document per conversation.
:class:`ConversationDataset` serves ``(tokens int64[n], labels int64[n])`` with ``n <= seq_length + 1`` (longer
conversations are cut there); :func:`pad_collate` right-pads a micro-batch to its longest conversation (tokens with
0, labels with -100), so a conversation's loss does not depend on the others in its batch: causal attention never
reads the padding that follows a token.

Order (:data:`ORDER`): the conversations of every path form one pool; each epoch is a seeded permutation of it, and
within each chunk of ``LENGTH_GROUP_CHUNK`` global batches of an epoch the conversations are sorted by length, cut
into global batches (``train_batch_size``, one optimizer step) and those shuffled (seeded), so a step holds
conversations of similar length (little padding) while its lengths still vary from step to step. An epoch is a
whole number of steps: when the pool is not a multiple of the global batch, its last, partial batch is filled with
other conversations of the epoch of about its length (:func:`_filled`) and comes last, so every step of every epoch
is one length group (a partial batch shuffled in among the others shifted every later step across two groups,
several times the padding) and nothing of the next epoch is read in this one; ``ceil(conversations /
train_batch_size)`` steps read each conversation once, a few twice. Sample ``i``
depends only on the files, the seed and the global batch, so a resumed run reads exactly what an uninterrupted one
reads, and any world size and micro-batch size with the same global batch read the same conversations in each step
(the sampler gives step ``s`` samples ``s B .. s B + B - 1``), in the same micro-batches when the micro-batch size
is the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .indexed import IndexedDataset, IndexedDatasetError

if TYPE_CHECKING:
    import torch

IGNORE = -100
LENGTH_GROUP_CHUNK = 64  # global batches sorted by length together
ORDER = "length-grouped per global batch, whole-step epochs"
"""The order rule above, recorded in each checkpoint (``state.json``'s ``conversation_order``): a resume from a
checkpoint of another rule says so (earlier versions grouped per global micro-batch, micro-batch x ranks, and shuffled
an epoch's partial batch in among the others)."""


def label_prefix(prefix: str) -> str:
    """The label dataset ``data_prep.chat`` writes beside ``prefix``."""
    return f"{prefix}_label"


def open_pair(tokens_prefix: str, labels_prefix: str) -> tuple[IndexedDataset, IndexedDataset]:
    """The token and label datasets, checked to describe the same conversations (count and every length)."""
    tokens, labels = IndexedDataset(tokens_prefix), IndexedDataset(labels_prefix)
    if len(tokens) != len(labels) or not np.array_equal(tokens.sizes, labels.sizes):
        raise IndexedDatasetError(f"{labels_prefix} does not match {tokens_prefix}: {len(labels)} vs {len(tokens)} "
                                  "conversations, or different lengths (written by different data_prep.chat runs?)")
    if labels.dtype.kind != "i":
        raise IndexedDatasetError(f"{labels_prefix}: labels must be a signed dtype (they hold -100), not "
                                  f"{labels.dtype}")
    return tokens, labels


class ConversationDataset:
    """``num_samples`` conversations of the datasets ``pairs`` (token, label), in the length-grouped seeded
    order described in the module docstring; ``ds[i]`` = ``(tokens int64[n], labels int64[n])``."""

    def __init__(self, pairs: list[tuple[IndexedDataset, IndexedDataset]], num_samples: int, seq_length: int,
                 seed: int, global_batch: int, shuffle: bool = True):
        self.pairs = pairs
        self.seq_length = seq_length
        offsets = np.cumsum([0] + [len(t) for t, _ in pairs])
        self._offsets = offsets
        total = int(offsets[-1])
        if total == 0:
            raise IndexedDatasetError("the conversation datasets hold no conversation")
        lengths = np.minimum(np.concatenate([t.sizes for t, _ in pairs]).astype(np.int64), seq_length + 1)
        rng = np.random.RandomState(seed)
        steps_per_epoch = -(-total // global_batch)
        epochs = -(-num_samples // (steps_per_epoch * global_batch))
        chunk = LENGTH_GROUP_CHUNK * global_batch
        order = []
        for _ in range(epochs):  # grouped within each epoch: every conversation once (a few twice in its last step)
            epoch = rng.permutation(total) if shuffle else np.arange(total)
            partial = None
            for start in range(0, total, chunk):
                part = epoch[start:start + chunk]
                part = part[np.argsort(-lengths[part], kind="stable")]
                groups = [part[i:i + global_batch] for i in range(0, len(part), global_batch)]
                if len(groups[-1]) < global_batch:  # only the epoch's last chunk ends in a partial batch
                    partial = groups.pop()
                if shuffle:
                    groups = [groups[i] for i in rng.permutation(len(groups))]
                order.extend(groups)
            if partial is not None:
                order.append(_filled(partial, epoch, global_batch, lengths, rng if shuffle else None))
        order = np.concatenate(order)
        self.order = order[:num_samples]
        self.epochs = epochs

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        doc = int(self.order[i])
        which = int(np.searchsorted(self._offsets, doc, side="right")) - 1
        tokens, labels = self.pairs[which]
        local = doc - int(self._offsets[which])
        n = min(int(tokens.sizes[local]), self.seq_length + 1)
        return tokens.get(local, 0, n).astype(np.int64), labels.get(local, 0, n).astype(np.int64)


def _filled(partial: np.ndarray, epoch: np.ndarray, size: int, lengths: np.ndarray,
            rng: np.random.RandomState | None) -> np.ndarray:
    """An epoch's last, partial batch filled to ``size`` with other conversations of the epoch, none of them twice
    in the batch unless the epoch holds fewer than ``size``: drawn by ``rng`` from the ``4 x`` as many others nearest
    in length to the partial batch's shortest (the first ones without ``rng``), so the batch stays one length group;
    sorted by length like every batch."""
    others = epoch[~np.isin(epoch, partial)]
    need = size - len(partial)
    if len(others) < need:
        pool = epoch
    else:
        pool = others[np.argsort(np.abs(lengths[others] - lengths[partial].min()), kind="stable")][:4 * need]
    fill = (rng.choice(pool, need, replace=len(pool) < need) if rng is not None
            else np.resize(pool, need))
    batch = np.concatenate([partial, fill])
    return batch[np.argsort(-lengths[batch], kind="stable")]


def pad_collate(samples: list[tuple[np.ndarray, np.ndarray]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad a micro-batch of conversations to its longest: tokens (B, L) with 0, labels (B, L) with -100, and
    ``real`` (B, L) bool, False on the padding."""
    width = max(len(t) for t, _ in samples)
    tokens = np.zeros((len(samples), width), dtype=np.int64)
    labels = np.full((len(samples), width), IGNORE, dtype=np.int64)
    real = np.zeros((len(samples), width), dtype=bool)
    for row, (t, lab) in enumerate(samples):
        tokens[row, :len(t)] = t
        labels[row, :len(lab)] = lab
        real[row, :len(t)] = True
    import torch  # here only: data_prep imports this package, and torch would add ~180 MB to each of its processes

    return torch.from_numpy(tokens), torch.from_numpy(labels), torch.from_numpy(real)
