"""The training losses of DimPO and of its baselines (paper Sec. 3.2-3.4, Appendix A), and the quality metrics.

Scores are the projected attention logits ``z = F(q) F(k)^T / sqrt(d')``.

* Listwise, one query against all its causal keys: :func:`dimpo_loss` (``psi``: original weights, ``z``: (N, m)).
* Pairwise, one (chosen, rejected) key pair per query, with the probabilities taken over the two keys (Sec. 3.1):
  :func:`simpo_loss`, :func:`cpo_loss`, :func:`orpo_loss` on ``z_c, z_r`` (N,).
* Mongoose's triplet loss on the projected vectors: :func:`triplet_loss`.
* Metrics, per query from masked log-probabilities (:func:`masked_log_softmax`), so callers sum over any number of
  blocks: :func:`kl_per_query`, :func:`output_se_per_query`.

Every loss is the mean over its queries.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

PAIR_BLOCK = 1 << 22  # (query, key, key) triples DimPO's loss holds at once


# ----------------------------------------------------------------------------------------------
# DimPO (listwise)


def masked_log_softmax(logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``log_softmax`` over the valid keys (N, m); ``-inf`` on the others."""
    return torch.log_softmax(logits.masked_fill(~valid, float("-inf")), dim=-1)


def rank_discounts(s: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``1 / log(1 + rank)`` per key (N, m), ranks by ``s`` descending among the ``valid`` keys, starting at 1;
    0 for invalid keys."""
    order = s.masked_fill(~valid, float("-inf")).argsort(dim=-1, descending=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(1, s.shape[-1] + 1, device=s.device).expand_as(order))
    return torch.where(valid, 1.0 / torch.log1p(ranks.to(s.dtype)), torch.zeros_like(s))


def _pair_terms(s: torch.Tensor, psi: torch.Tensor, gain: torch.Tensor, disc: torch.Tensor, valid: torch.Tensor,
                gamma: float, start: int, stop: int) -> torch.Tensor:
    """Per query (N,): the sum over preferred keys ``i`` in ``[start, stop)`` and all keys ``j`` with
    ``psi_i > psi_j`` of ``Delta_ij * log(1 + exp(-(s_i - s_j - gamma)))``."""
    rows = slice(start, stop)
    preferred = (psi[:, rows, None] > psi[:, None, :]) & valid[:, rows, None] & valid[:, None, :]
    delta = (gain[:, rows, None] - gain[:, None, :]).abs() * (disc[:, rows, None] - disc[:, None, :]).abs()
    terms = F.softplus(-(s[:, rows, None] - s[:, None, :] - gamma)) * delta
    return torch.where(preferred, terms, torch.zeros_like(terms)).sum(dim=(1, 2))


def dimpo_loss(psi: torch.Tensor, z: torch.Tensor, valid: torch.Tensor, beta: float = 1.0,
               gamma: float = 1e-4) -> torch.Tensor:
    """DimPO (Eq. 1) with LiPO's lambda weights, mean over the N queries.

    psi: (N, m) original attention weights (0 on invalid keys); z: (N, m) projected logits; valid: (N, m) bool.
    ``s = beta * log_softmax(z)`` over the valid keys; ``Delta_ij = |G_i - G_j| |1/log(1+r_i) - 1/log(1+r_j)|``,
    ``G = 2^psi - 1``, ranks ``r`` by ``s`` (no gradient through ``Delta``). The O(m^2) pair terms are summed in
    blocks of preferred keys, each recomputed in the backward pass, so memory stays at :data:`PAIR_BLOCK` triples
    (one block, kept for the backward pass, when all pairs fit in it).
    """
    s = (beta * masked_log_softmax(z, valid)).masked_fill(~valid, 0.0)
    with torch.no_grad():
        disc = rank_discounts(s, valid)
        gain = torch.exp2(psi) - 1.0
    n, m = psi.shape
    rows = max(1, PAIR_BLOCK // max(1, n * m))
    if rows >= m:  # one block: nothing to recompute
        return _pair_terms(s, psi, gain, disc, valid, gamma, 0, m).mean()
    total = torch.zeros(n, dtype=s.dtype, device=s.device)
    for start in range(0, m, rows):
        args = (s, psi, gain, disc, valid, gamma, start, min(m, start + rows))
        total = total + (checkpoint(_pair_terms, *args, use_reentrant=False) if s.requires_grad
                         else _pair_terms(*args))
    return total.mean()


# ----------------------------------------------------------------------------------------------
# pairwise preference losses (probabilities over the chosen and the rejected key)


def pair_log_probs(z_c: torch.Tensor, z_r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log pi_c, log pi_r)`` of a softmax over the two keys' logits ``z_c, z_r`` (N,)."""
    return -F.softplus(z_r - z_c), -F.softplus(z_c - z_r)


def simpo_loss(z_c: torch.Tensor, z_r: torch.Tensor, beta: float = 1.0, gamma: float = 1.0) -> torch.Tensor:
    """SimPO: ``-log sigmoid(beta log pi_c - beta log pi_r - gamma)`` (a key is a one-token response, so the
    length normalisation is 1)."""
    lc, lr = pair_log_probs(z_c, z_r)
    return -F.logsigmoid(beta * (lc - lr) - gamma).mean()


def cpo_loss(z_c: torch.Tensor, z_r: torch.Tensor, beta: float = 1.0, gamma: float = 0.1) -> torch.Tensor:
    """CPO: preference term plus the chosen key's negative log-likelihood,
    ``-log sigmoid(beta log pi_c - beta log pi_r - gamma) - log pi_c``; ``gamma`` is a reward margin as in SimPO
    (CPO's paper has none; the DimPO paper's Table 6 gives CPO ``gamma = 0.1``)."""
    lc, lr = pair_log_probs(z_c, z_r)
    return (-F.logsigmoid(beta * (lc - lr) - gamma) - lc).mean()


def orpo_loss(z_c: torch.Tensor, z_r: torch.Tensor, beta: float = 0.1) -> torch.Tensor:
    """ORPO: ``-log pi_c - beta log sigmoid(log odds(pi_c) - log odds(pi_r))``, ``odds(p) = p / (1 - p)``;
    ``beta`` is ORPO's lambda (Table 6 and TRL call it beta). Over two keys ``1 - pi_c = pi_r``, so
    ``log odds(pi_c) = log pi_c - log pi_r = -log odds(pi_r)``."""
    lc, lr = pair_log_probs(z_c, z_r)
    return (-lc - beta * F.logsigmoid(2.0 * (lc - lr))).mean()


def triplet_loss(fq: torch.Tensor, f_pos: torch.Tensor, f_neg: torch.Tensor, margin: float = 1.0) -> torch.Tensor:
    """Mongoose's triplet loss on projected vectors (N, d'): ``max(0, cos(Fq, Fk-) - cos(Fq, Fk+) + margin)``
    (its distance ``1 - cos``; margin 1.0, Mongoose's default)."""
    pos = F.cosine_similarity(fq, f_pos, dim=-1, eps=1e-6)
    neg = F.cosine_similarity(fq, f_neg, dim=-1, eps=1e-6)
    return F.relu(neg - pos + margin).mean()


# ----------------------------------------------------------------------------------------------
# quality metrics


def kl_per_query(log_p: torch.Tensor, log_q: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` per query from masked log-probabilities (N, m) -> (N,)."""
    terms = log_p.exp() * (log_p - log_q)
    return torch.where(valid, terms, torch.zeros_like(terms)).sum(-1)


def output_se_per_query(log_p: torch.Tensor, log_q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``||p V - q V||^2`` per query: masked log-probabilities (N, m), values v (m, d_h) -> (N,)."""
    return ((log_p.exp() - log_q.exp()) @ v).pow(2).sum(-1)
