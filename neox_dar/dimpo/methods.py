"""The projection methods of the paper's Table 1, one interface: ``fit_projection(method, ...) -> (W, log)``.

``W`` is (d', d_h), bias-free, shared by every head of one layer; projected logits ``F(q) F(k)^T / sqrt(d')`` with
``F(x) = W x``.

* ``random``: a fixed Gaussian ``W`` with entries ``N(0, 1/d')``;
* ``pca``: the top-``d'`` principal directions (centred) of the layer's training queries and keys pooled
  (:meth:`LayerSplit.pooled_vectors`), in closed form;
* ``dimpo``: the listwise DimPO loss on every training instance's query with all its causal keys;
* ``simpo``, ``orpo``, ``cpo``, ``triplet``: pairwise, on one (chosen, rejected) pair per instance, its highest-
  and lowest-weighted key (Sec. 3.3, Mongoose's setup), or on the pairs of another :class:`.pairs.PairSelection`
  (Appendix C), each pair one example of the loss's mean.

The trained methods start from ``nn.Linear``'s default init and use Adam with the hyperparameters of Appendix A,
Table 6 (:data:`PAPER`), one epoch over the shuffled instances by default; after each epoch ``W`` is evaluated on
the validation split, and the epoch with the lowest validation KL is kept.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch

from ..progress import progress_bar
from .evaluate import evaluate
from .instances import DimPOError, LayerSplit
from .pairs import KeyPairs, PairSelection, gather_keys, key_pairs
from .losses import cpo_loss, dimpo_loss, orpo_loss, simpo_loss, triplet_loss

METHODS = ("random", "pca", "triplet", "cpo", "simpo", "orpo", "dimpo")  # Table 1's row order
PAIRWISE = ("simpo", "orpo", "cpo", "triplet")


@dataclass(frozen=True)
class Hyper:
    """A trained method's optimisation settings and its loss's own parameters (``beta``, ``gamma``, ``margin``)."""

    lr: float
    batch_size: int
    loss: dict

    def with_overrides(self, lr: float | None = None, batch_size: int | None = None, **loss) -> Hyper:
        """A copy with the given settings replaced; loss parameters apply only where the loss has them."""
        return dataclasses.replace(self, lr=self.lr if lr is None else lr,
                                   batch_size=self.batch_size if batch_size is None else batch_size,
                                   loss={k: (loss[k] if loss.get(k) is not None else v) for k, v in self.loss.items()})


PAPER = {  # Appendix A, Table 6 (Adam); triplet's margin is Mongoose's default, which Table 6 does not list
    "dimpo": Hyper(1e-4, 1, {"beta": 1.0, "gamma": 1e-4}),
    "simpo": Hyper(1e-3, 32, {"beta": 1.0, "gamma": 1.0}),
    "triplet": Hyper(1e-4, 32, {"margin": 1.0}),
    "orpo": Hyper(1e-3, 32, {"beta": 0.1}),
    "cpo": Hyper(1e-4, 32, {"beta": 1.0, "gamma": 0.1}),
}
PAIR_LOSSES = {"simpo": simpo_loss, "orpo": orpo_loss, "cpo": cpo_loss}


def random_projection(head_dim: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """Gaussian ``W`` (d, head_dim), entries ``N(0, 1/d)``."""
    return torch.randn(d, head_dim, generator=gen) / math.sqrt(d)


def pca_projection(parts: list[torch.Tensor], d: int) -> torch.Tensor:
    """The top-``d`` principal directions of the rows of ``parts`` pooled (each (n_i, head_dim)), centred, as rows
    of ``W`` (d, head_dim), by decreasing variance; the covariance is accumulated in float64 in chunks."""
    dim = parts[0].shape[-1]
    n = sum(len(x) for x in parts)
    total = torch.zeros(dim, dtype=torch.float64, device=parts[0].device)
    outer = torch.zeros(dim, dim, dtype=torch.float64, device=parts[0].device)
    for x in parts:
        for chunk in x.split(1 << 16):
            c = chunk.double()
            total += c.sum(0)
            outer += c.T @ c
    mean = total / n
    _, vectors = torch.linalg.eigh(outer / n - torch.outer(mean, mean))  # ascending eigenvalues
    return vectors[:, -d:].flip(-1).T.float()


def _dimpo_step(w: torch.Tensor, split: LayerSplit, rows: torch.Tensor, hyper: Hyper,
                pairs: KeyPairs | None) -> torch.Tensor:
    """DimPO loss of the instances ``rows`` (b,), each against all its causal keys (b, m, d_h), m the longest, or
    against its key list ``pairs.subset`` (``all:K``), the original weights renormalised over that list."""
    q = split.q[rows]
    if pairs is not None and pairs.subset is not None:
        keys, valid = gather_keys(split, rows, pairs.subset[rows]), pairs.subset_valid[rows]
    else:
        m = int(split.pos[rows].max()) + 1
        keys = split.k[split.doc[rows], split.kv_head(rows), :m]
        valid = torch.arange(m, device=keys.device)[None, :] <= split.pos[rows, None]
    with torch.no_grad():
        psi = torch.softmax((torch.einsum("bd,bmd->bm", q, keys) / math.sqrt(split.head_dim))
                            .masked_fill(~valid, float("-inf")), dim=-1)
    # F(q) F(k)^T / sqrt(d') = (W^T W q) . k / sqrt(d'): no projected copy of the keys
    u = (q @ w.T) @ w / math.sqrt(w.shape[0])
    z = torch.einsum("bd,bmd->bm", u, keys)
    return dimpo_loss(psi, z, valid, **hyper.loss)


def _pair_step(method: str, w: torch.Tensor, split: LayerSplit, rows: torch.Tensor, pairs: KeyPairs,
               hyper: Hyper) -> torch.Tensor | None:
    """The pairwise loss over the valid pairs of instances ``rows`` (None: they have none)."""
    valid = pairs.valid[rows]
    if not valid.any():
        return None
    fq = (split.q[rows] @ w.T)[:, None].expand(-1, valid.shape[1], -1)[valid]  # (N', d')
    fc = gather_keys(split, rows, pairs.chosen[rows])[valid] @ w.T
    fr = gather_keys(split, rows, pairs.rejected[rows])[valid] @ w.T
    if method == "triplet":
        return triplet_loss(fq, fc, fr, **hyper.loss)
    scale = math.sqrt(w.shape[0])
    return PAIR_LOSSES[method]((fq * fc).sum(-1) / scale, (fq * fr).sum(-1) / scale, **hyper.loss)


def train_projection(method: str, hyper: Hyper, train: LayerSplit, valid: LayerSplit, d: int, epochs: int,
                     max_steps: int | None, gen: torch.Generator, block: int, desc: str,
                     pairs: KeyPairs) -> tuple[torch.Tensor, dict]:
    """Train ``W`` (d, d_h) with ``method``'s loss on the keys ``pairs`` selects; returns the best epoch's ``W``
    (lowest validation KL) and a log ``{"steps", "epochs": [{"loss", "valid_kl", "valid_mse"}], "best_epoch"}``."""
    device = train.q.device
    w = torch.empty(d, train.head_dim)
    torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=gen)  # nn.Linear's default init
    w = w.to(device).requires_grad_()
    opt = torch.optim.Adam([w], lr=hyper.lr)
    n = len(train)
    steps_per_epoch = math.ceil(n / hyper.batch_size)
    total = epochs * steps_per_epoch if max_steps is None else min(max_steps, epochs * steps_per_epoch)
    log: dict = {"steps": 0, "epochs": [], "best_epoch": None}
    best, best_kl = w.detach().clone(), math.inf
    with progress_bar(total=total, desc=desc, unit="step", leave=False) as bar:
        for epoch in range(epochs):
            order = torch.randperm(n, generator=gen).to(device)
            loss_sum, seen = 0.0, 0
            for rows in order.split(hyper.batch_size):
                if log["steps"] == total:
                    break
                if method in PAIRWISE:
                    loss = _pair_step(method, w, train, rows, pairs, hyper)
                else:
                    loss = _dimpo_step(w, train, rows, hyper, pairs)
                if loss is None:  # no valid pair among these instances
                    continue
                value = loss.item()
                if not math.isfinite(value):
                    raise DimPOError(f"{desc}: {method}'s loss is {value} at step {log['steps'] + 1}: the fit "
                                     f"diverged (lower --lr, or check --beta/--gamma/--margin)")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                loss_sum, seen = loss_sum + value * len(rows), seen + len(rows)
                log["steps"] += 1
                bar.update()
            if seen == 0:
                break
            metrics = evaluate(valid, {"w": w.detach()}, block)["w"]
            log["epochs"].append({"loss": loss_sum / seen, "valid_kl": metrics["kl"], "valid_mse": metrics["mse"]})
            if not math.isfinite(metrics["kl"]):
                raise DimPOError(f"{desc}: {method}'s validation KL is {metrics['kl']} after epoch {epoch}: the fit "
                                 f"diverged (lower --lr)")
            if metrics["kl"] < best_kl:
                best, best_kl, log["best_epoch"] = w.detach().clone(), metrics["kl"], epoch
    if log["best_epoch"] is None:  # the starting W would be reported as the method's
        raise DimPOError(f"{desc}: no training instance has a pair of keys with different attention weights, so "
                         f"{method} has nothing to train on (give it more documents or a longer --seq-len)")
    return best, log


def fit_projection(method: str, d: int, train: LayerSplit, valid: LayerSplit, hyper: Hyper | None, epochs: int,
                   max_steps: int | None, seed: int, block: int, desc: str,
                   pairs: KeyPairs | None = None) -> tuple[torch.Tensor, dict]:
    """``W`` (d, d_h) of ``method`` for one layer, and what fitting it logged (``seconds``; a trained method's
    steps and per-epoch loss and validation metrics). A trained method uses the keys ``pairs`` selects (default:
    ``top-bottom``)."""
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    if method == "random":
        w, log = random_projection(train.head_dim, d, gen).to(train.q.device), {}
    elif method == "pca":
        w, log = pca_projection(train.pooled_vectors(), d), {}
    else:
        pairs = pairs if pairs is not None else key_pairs(train, PairSelection(), block, seed)
        w, log = train_projection(method, hyper, train, valid, d, epochs, max_steps, gen, block, desc, pairs)
    return w, {**log, "seconds": time.perf_counter() - start}
