"""Score documents with a causal LM over rolling windows, many documents' windows packed per batch.

Every document's stream ``[prefix] + tokens`` is cut into windows by :func:`.rolling.rolling_spans`.
Windows of all documents are sorted by length (longest first, so a batch holds windows of nearly equal
length), right-padded, and run through the model; only each window's target positions are scored, so padding
never changes a score (attention is causal in every variant: a position never sees the padding after it).
Attention statistics (AHA's ``mu_f``) are averaged over the windows' real positions, never over padding.

Across data-parallel ranks (the in-training evaluation), rank ``r`` of ``n`` runs every ``n``-th batch and the
per-document sums are added over ranks; every rank runs the same number of forwards (a rank short of batches runs
its last one again and discards it), which ZeRO-3 needs: each forward gathers parameters from every rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from neox_dar.loss import IGNORE
from neox_dar.model import CausalLM
from neox_dar.loss import IGNORE
from neox_dar.model import CausalLM
from neox_dar.progress import progress_bar

from .rolling import rolling_spans

LogitsFn = Callable[[torch.Tensor], torch.Tensor]  # input_ids (B, T) -> logits (B, T, V)


@dataclass
class ScoreResult:
    """Per-document summed NLL (nats) and scored-token counts, plus run statistics."""

    nll: list[float]
    tokens: list[int]
    windows: int
    seconds: float
    attention_stats: dict[str, list[float]] = field(default_factory=dict)


class AttentionStatsMean:
    """Means over real (non-padding) positions of the attention modules' per-token statistics
    (``module.token_stats``: name -> (B, T, ...) tensor from the last forward, e.g. AHA's gate ``mu_f`` (B, T, H)),
    accumulated over forwards; reported as ``layer{l}/{name}`` -> one value per trailing entry (per head)."""

    def __init__(self, model: object):
        modules = getattr(model, "attention_modules", None)
        self.modules = modules() if modules is not None else []
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, torch.Tensor] = {}

    def current(self) -> dict[str, torch.Tensor]:
        """The last forward's per-token statistics, ``layer{l}/{name}`` -> (B, T, ...)."""
        return {f"layer{m.layer_idx}/{name}": value
                for m in self.modules for name, value in getattr(m, "token_stats", {}).items()}

    def add(self, real: torch.Tensor | None = None, stats: dict[str, torch.Tensor] | None = None) -> None:
        """Accumulate ``stats`` (default: :meth:`current`); ``real`` (B, T) bool marks the real positions
        (None: all)."""
        for key, value in (self.current() if stats is None else stats).items():
            if real is not None and tuple(value.shape[:2]) != tuple(real.shape):
                raise ValueError(f"{key}: a per-token statistic of shape {tuple(value.shape)} for a forward of "
                                 f"(B, T) = {tuple(real.shape)}: the variant's attend and decode must set token_stats "
                                 "for the tokens of every forward (docs/adding_a_variant.md)")
            mask = torch.ones(value.shape[:2]) if real is None else real
            mask = mask.to(value.device, torch.float64).reshape(mask.shape + (1,) * (value.dim() - 2))
            total, count = (value.double() * mask).sum((0, 1)), mask.sum()  # (B, T, ...) -> (...); no sync
            self.sums[key] = self.sums[key] + total if key in self.sums else total
            self.counts[key] = self.counts[key] + count if key in self.counts else count

    def reduce(self, reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Sum the accumulated statistics over ranks (``reduce_sum``: an all-reduce of one float64 tensor)."""
        keys = sorted(self.sums)
        if keys:
            flat = reduce_sum(torch.cat([torch.cat([self.sums[k].reshape(-1).cpu(), self.counts[k].reshape(1).cpu()])
                                         for k in keys]))
            i = 0
            for k in keys:
                n = self.sums[k].numel()
                self.sums[k], self.counts[k] = flat[i:i + n].reshape(self.sums[k].shape), flat[i + n]
                i += n + 1

    def result(self) -> dict[str, list[float]]:
        return {k: (v / self.counts[k]).reshape(-1).tolist() for k, v in self.sums.items() if self.counts[k] > 0}


def overall_means(stats: dict[str, list[float]]) -> dict[str, float]:
    """For every statistic ``name`` in ``stats`` (keys ``layer{l}/{name}``, per-head lists), its mean over layers
    and heads (for AHA's ``mu_f``, the paper's Eq. 8: every layer and head counts the same positions)."""
    values: dict[str, list[float]] = {}
    for key, vs in stats.items():
        values.setdefault(key.split("/", 1)[1], []).extend(vs)
    return {name: sum(vs) / len(vs) for name, vs in values.items() if vs}


def score_documents(
    model: torch.nn.Module | LogitsFn,
    documents: Sequence[Sequence[int] | np.ndarray],
    max_length: int,
    prefix_token: int,
    stride: int | None = None,
    batch_size: int = 8,
    device: torch.device | str = "cpu",
    pad_token: int = 0,
    progress: bool = True,
    desc: str = "scoring",
    rank: int = 0,
    world_size: int = 1,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> ScoreResult:
    """Summed NLL of every token of every document, each token scored once (see :mod:`.rolling`).

    ``model`` is a :class:`~neox_dar.model.CausalLM`, which scores the targets from its final hidden states
    (``model(ids, targets, reduction="none")``: only the scored positions go through the output layer, no (B, T, V)
    logits), or any ``model(input_ids[B, T]) -> logits[B, T, V]`` (e.g. a Hugging Face model), scored row by row;
    log-probabilities are taken in float32 whatever the model's dtype. ``documents`` are token-id lists (without the
    prefix token). Returns per-document sums in float64.
    With ``world_size`` > 1 this rank scores its share of the batches and ``reduce_sum`` (an all-reduce SUM of
    a float64 CPU tensor, returned) combines the ranks' sums: every rank returns the whole corpus's result.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    prefix = np.array([prefix_token], dtype=np.int64)
    streams = [np.concatenate([prefix, np.asarray(doc, dtype=np.int64)]) for doc in documents]
    # (doc, start, end, n_targets), longest input first; ties keep document order
    windows = [(d, s, e, n) for d, x in enumerate(streams) for s, e, n in rolling_spans(len(x) - 1, max_length, stride)]
    windows.sort(key=lambda w: -(w[2] - w[1]))
    nll = np.zeros(len(streams), dtype=np.float64)
    n_tokens = np.array([len(x) - 1 for x in streams], dtype=np.int64)
    stats = AttentionStatsMean(model)
    own_model = isinstance(model, CausalLM)

    batches = [windows[b:b + batch_size] for b in range(0, len(windows), batch_size)]
    mine = batches[rank::world_size]
    steps = -(-len(batches) // world_size)
    remaining = np.bincount([w[0] for batch in mine for w in batch], minlength=len(streams))
    docs_done = int((remaining == 0).sum())
    bar = progress_bar(total=int(sum(n for batch in mine for *_, n in batch)), unit="tok", unit_scale=True,
                       desc=desc, disable=not progress)
    bar.set_postfix(docs=f"{docs_done}/{len(streams)}")
    start_time = time.perf_counter()
    with torch.no_grad():  # not inference_mode: ZeRO-3 gathers parameters in place during the forward
        for step in range(steps):
            batch = mine[min(step, len(mine) - 1)] if mine else batches[0]
            repeat = step >= len(mine)  # a forward only to keep the ranks' forwards in step
            width = max(e - s for _, s, e, _ in batch)
            ids = torch.full((len(batch), width), pad_token, dtype=torch.long)
            for row, (d, s, e, _) in enumerate(batch):
                ids[row, :e - s] = torch.from_numpy(streams[d][s:e])
            real = torch.arange(width) < torch.tensor([e - s for _, s, e, _ in batch])[:, None]
            if own_model:  # the scored positions' losses straight from the hidden states, no (B, T, V) logits
                targets = torch.full((len(batch), width), IGNORE, dtype=torch.long)
                for row, (d, s, e, n) in enumerate(batch):
                    targets[row, e - s - n:e - s] = torch.from_numpy(streams[d][e - n + 1:e + 1])
                row_nll = model(ids.to(device), targets.to(device), reduction="none").double().sum(1)
            else:  # one row at a time: float32 log-probs of the scored positions only (no (B, T, V) float32 copy)
                logits = model(ids.to(device))
                row_nll = torch.stack([
                    F.cross_entropy(logits[row, e - s - n:e - s].float(),
                                    torch.from_numpy(streams[d][e - n + 1:e + 1]).to(logits.device),
                                    reduction="none").double().sum()
                    for row, (d, s, e, n) in enumerate(batch)])
            stats.add(real & (not repeat))
            if repeat:
                continue
            for (d, _, _, _), value in zip(batch, row_nll.cpu().tolist()):
                nll[d] += value
                remaining[d] -= 1
                docs_done += int(remaining[d] == 0)
            n_scored = sum(n for _, _, _, n in batch)
            bar.update(n_scored)
            bar.set_postfix(docs=f"{docs_done}/{len(streams)}")
    bar.close()
    if world_size > 1:
        nll = reduce_sum(torch.from_numpy(nll)).numpy()
        stats.reduce(reduce_sum)
    return ScoreResult(nll=nll.tolist(), tokens=n_tokens.tolist(), windows=len(windows),
                       seconds=time.perf_counter() - start_time, attention_stats=stats.result())
