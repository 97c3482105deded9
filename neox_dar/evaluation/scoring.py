"""Score documents with a causal LM over rolling windows, many documents' windows packed per batch.

Every document's stream ``[prefix] + tokens`` is cut into windows by :func:`.rolling.rolling_spans`.
Windows of all documents are sorted by length (longest first, so a batch holds windows of nearly equal
length), right-padded, and run through the model; only each window's target positions are scored, so padding
never changes a score (attention is causal in every variant: a position never sees the padding after it).
Attention statistics (AHA's ``mu_f``) are averaged over the windows' real positions, never over padding.

Across data-parallel ranks (``torchrun -m eval.perplexity``, the in-training evaluation), the batches are the
one-process run's, and rank ``r`` of ``n`` runs batches ``r, r + n, r + 2n, ...``: longest first, so no rank scores
more than one batch's tokens beyond another. The ranks' per-window scores (and attention statistics per batch) are
gathered and added in the one-process order, so the sums are those of one process bit for bit wherever a batch's
forward gives the same numbers on every rank (the same kind of device and kernels). Every rank runs the same number
of forwards (a rank short of batches runs its last one again and discards it), which ZeRO-3 needs: each forward
gathers parameters from every rank.
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

    def totals(self, real: torch.Tensor | None = None, stats: dict[str, torch.Tensor] | None = None
               ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """One forward's ``stats`` (default: :meth:`current`) summed over its real positions: ``key -> (sum over
        positions (...), number of positions)``, float64 on the statistics' device; ``real`` (B, T) bool marks the
        real positions (None: all)."""
        out = {}
        for key, value in (self.current() if stats is None else stats).items():
            if real is not None and tuple(value.shape[:2]) != tuple(real.shape):
                raise ValueError(f"{key}: a per-token statistic of shape {tuple(value.shape)} for a forward of "
                                 f"(B, T) = {tuple(real.shape)}: the variant's attend and decode must set token_stats "
                                 "for the tokens of every forward (docs/adding_a_variant.md)")
            mask = torch.ones(value.shape[:2]) if real is None else real
            mask = mask.to(value.device, torch.float64).reshape(mask.shape + (1,) * (value.dim() - 2))
            out[key] = (value.double() * mask).sum((0, 1)), mask.sum()  # (B, T, ...) -> (...); no sync
        return out

    def add_totals(self, totals: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Accumulate one forward's :meth:`totals`."""
        for key, (total, count) in totals.items():
            self.sums[key] = self.sums[key] + total.to(self.sums[key].device) if key in self.sums else total
            self.counts[key] = self.counts[key] + count.to(self.counts[key].device) if key in self.counts else count

    def add(self, real: torch.Tensor | None = None, stats: dict[str, torch.Tensor] | None = None) -> None:
        """Accumulate ``stats`` (default: :meth:`current`) over the real positions ``real`` (:meth:`totals`)."""
        self.add_totals(self.totals(real, stats))

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
    all_gather: Callable[[object], list[object]] | None = None,
) -> ScoreResult:
    """Summed NLL of every token of every document, each token scored once (see :mod:`.rolling`).

    ``model`` is a :class:`~neox_dar.model.CausalLM`, which scores the targets from its final hidden states
    (``model(ids, targets, reduction="none")``: only the scored positions go through the output layer, no (B, T, V)
    logits), or any ``model(input_ids[B, T]) -> logits[B, T, V]`` (e.g. a Hugging Face model), scored row by row;
    log-probabilities are taken in float32 whatever the model's dtype. ``documents`` are token-id lists (without the
    prefix token). Returns per-document sums in float64.
    With ``world_size`` > 1 this rank scores its share of the batches (module docstring) and ``all_gather`` (every
    rank's picklable object, in rank order: :meth:`.parallel.EvalGroup.all_gather`) brings every rank's scores to
    every rank, which adds them in the one-process order and returns the whole corpus's result; ``seconds`` is then
    this rank's time until every rank is done.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if world_size > 1 and all_gather is None:
        raise ValueError("score_documents over several ranks needs all_gather")
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
    mine = list(range(rank, len(batches), world_size))  # the indices of this rank's batches
    steps = -(-len(batches) // world_size)
    scored: list[tuple[int, list[float], dict]] = []  # several ranks: (batch, its rows' NLLs, its statistics' totals)
    remaining = np.bincount([w[0] for b in mine for w in batches[b]], minlength=len(streams))
    docs_done = int((remaining == 0).sum())
    bar = progress_bar(total=int(sum(n for b in mine for *_, n in batches[b])), unit="tok", unit_scale=True,
                       desc=desc if world_size == 1 else f"{desc} (rank {rank}'s share of {world_size})",
                       disable=not progress)
    if world_size == 1:  # several ranks: a rank scores parts of documents, so it counts tokens only
        bar.set_postfix(docs=f"{docs_done}/{len(streams)}")
    start_time = time.perf_counter()
    with torch.no_grad():  # not inference_mode: ZeRO-3 gathers parameters in place during the forward
        for step in range(steps):
            index = mine[min(step, len(mine) - 1)] if mine else 0
            batch = batches[index]
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
            if repeat:
                continue
            totals = stats.totals(real)
            values = row_nll.cpu().tolist()
            if world_size > 1:
                scored.append((index, values, {k: (t.cpu(), c.cpu()) for k, (t, c) in totals.items()}))
            else:
                stats.add_totals(totals)
                _add_rows(nll, batch, values)
            for d, _, _, _ in batch:
                remaining[d] -= 1
                docs_done += int(remaining[d] == 0)
            bar.update(sum(n for _, _, _, n in batch))
            if world_size == 1:
                bar.set_postfix(docs=f"{docs_done}/{len(streams)}")
    bar.close()
    if world_size > 1:  # every rank's batches, added in the one-process order
        for index, values, totals in sorted((item for part in all_gather(scored) for item in part),
                                             key=lambda item: item[0]):
            stats.add_totals(totals)
            _add_rows(nll, batches[index], values)
    return ScoreResult(nll=nll.tolist(), tokens=n_tokens.tolist(), windows=len(windows),
                       seconds=time.perf_counter() - start_time, attention_stats=stats.result())


def _add_rows(nll: np.ndarray, batch: list[tuple[int, int, int, int]], values: list[float]) -> None:
    """Add a batch's per-window NLLs to their documents' sums."""
    for (d, _, _, _), value in zip(batch, values):
        nll[d] += value
