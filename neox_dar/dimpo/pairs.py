"""Which keys the trained methods see per training instance (paper Sec. 3.3 and Appendix C, Fig. 4).

A selection names positions among an instance's causal keys, ranked by their original attention weight (rank 0:
the highest):

* ``top-bottom`` (the paper's main setup, Mongoose's): one pair, the highest- and the lowest-weighted key;
  DimPO sees every causal key.
* ``all:K`` (Fig. 4a): ``K`` keys drawn at random from the instance's causal keys (all of them when it has fewer),
  and every pair of them, the higher-weighted key chosen (``K (K - 1) / 2`` pairs); DimPO's list is the same ``K``
  keys, their weights renormalised over them.
* ``distinct:K`` (Fig. 4b): ``K`` pairs that share no key, each chosen key drawn from the top half of the ranking
  and each rejected key from the bottom half (``min(K, m // 2)`` pairs for ``m`` causal keys).
* ``distance:K`` (Fig. 4c): one pair, the highest-weighted key and the key ``K`` ranks below it (the lowest when
  fewer keys: ``distance:127`` on 128-token documents is ``top-bottom``).

Only ``all:K`` changes what DimPO sees. Random draws are seeded per layer and instance, so every method and ``d'``
of a layer trains on the same keys. Indices are held, never key vectors: ``(n, P)`` positions into the instance's
document and key/value head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .instances import DimPOError, LayerSplit

KINDS = ("top-bottom", "all", "distinct", "distance")


@dataclass(frozen=True)
class PairSelection:
    kind: str = "top-bottom"
    k: int = 1

    @classmethod
    def parse(cls, text: str) -> PairSelection:
        """``top-bottom``, ``all:K``, ``distinct:K`` or ``distance:K``."""
        kind, _, k = text.partition(":")
        if kind == "top-bottom" and not k:
            return cls()
        if kind not in KINDS[1:] or not k.isdigit() or int(k) < (2 if kind == "all" else 1):
            raise DimPOError(f"--pairs takes top-bottom, all:K (K >= 2), distinct:K or distance:K (K >= 1), "
                             f"got '{text}'")
        return cls(kind, int(k))

    @property
    def label(self) -> str:
        return self.kind if self.kind == "top-bottom" else f"{self.kind}:{self.k}"


@dataclass
class KeyPairs:
    """Per instance (n rows): ``chosen``, ``rejected`` (n, P) key positions and ``valid`` (n, P) bool; for ``all:K``
    also DimPO's list, ``subset`` (n, K) positions and ``subset_valid`` (n, K)."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    valid: torch.Tensor
    subset: torch.Tensor | None = None
    subset_valid: torch.Tensor | None = None


def _noise(split: LayerSplit, rows: slice, width: int, seed: int) -> torch.Tensor:
    """(b, width) uniform numbers, row ``r``'s first ``pos[r] + 1`` from a generator seeded by ``(seed, r)`` (so a
    draw never depends on how the instances are blocked), 2.0 beyond."""
    out = torch.full((rows.stop - rows.start, width), 2.0)
    gen = torch.Generator()
    for j, r in enumerate(range(rows.start, rows.stop)):
        n = int(split.pos[r]) + 1
        out[j, :n] = torch.rand(n, generator=gen.manual_seed(seed * 1_000_003 + r))
    return out.to(split.q.device)


def _draw(allowed: torch.Tensor, count: int, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` distinct random columns of each row among its ``allowed`` ones (b, M) bool, by the smallest
    ``noise``: (b, count) column indices and (b, count) bool, False past the row's number of allowed columns."""
    cols = noise.masked_fill(~allowed, 3.0).argsort(dim=-1, stable=True)[:, :count]
    return cols, torch.arange(count, device=allowed.device)[None, :] < allowed.sum(-1, keepdim=True)


def key_pairs(split: LayerSplit, selection: PairSelection, block: int, seed: int) -> KeyPairs:
    """The :class:`KeyPairs` of every instance of ``split``, ``block`` queries at a time."""
    sel, n, dev = selection, len(split), split.q.device
    P = {"all": sel.k * (sel.k - 1) // 2, "distinct": sel.k}.get(sel.kind, 1)
    chosen = torch.zeros(n, P, dtype=torch.long, device=dev)
    rejected, valid = torch.zeros_like(chosen), torch.zeros(n, P, dtype=torch.bool, device=dev)
    subset = torch.zeros(n, sel.k, dtype=torch.long, device=dev) if sel.kind == "all" else None
    subset_valid = torch.zeros(n, sel.k, dtype=torch.bool, device=dev) if sel.kind == "all" else None
    for rows, d, g in split.blocks(block):
        keys = split.k[d, g, :int(split.pos[rows].max()) + 1]
        logits, causal = split.original_logits(rows, keys)
        order = logits.masked_fill(~causal, float("-inf")).argsort(dim=-1, descending=True, stable=True)
        m = causal.sum(-1, keepdim=True)  # (b, 1) causal keys per instance
        rank = torch.arange(keys.shape[0], device=dev)[None, :]
        if sel.kind in ("top-bottom", "distance"):
            last = m - 1 if sel.kind == "top-bottom" else (m - 1).clamp(max=sel.k)
            chosen[rows], rejected[rows], valid[rows] = order[:, :1], order.gather(1, last), True
        elif sel.kind == "distinct":
            half = m // 2
            noise = _noise(split, rows, keys.shape[0], seed)  # indexed by rank: top and bottom draw apart
            top, top_ok = _draw(rank < half, sel.k, noise)
            bottom, _ = _draw((rank >= m - half) & (rank < m), sel.k, noise)
            chosen[rows], rejected[rows] = order.gather(1, top), order.gather(1, bottom)
            valid[rows] = top_ok
        else:  # all:K
            cols, ok = _draw(causal, sel.k, _noise(split, rows, keys.shape[0], seed))
            subset[rows], subset_valid[rows] = cols, ok
            a, b = torch.triu_indices(sel.k, sel.k, offset=1, device=dev)
            first_higher = logits.gather(1, cols[:, a]) >= logits.gather(1, cols[:, b])
            chosen[rows] = torch.where(first_higher, cols[:, a], cols[:, b])
            rejected[rows] = torch.where(first_higher, cols[:, b], cols[:, a])
            valid[rows] = ok[:, a] & ok[:, b]
    return KeyPairs(chosen, rejected, valid, subset, subset_valid)


def gather_keys(split: LayerSplit, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Keys (b, P, d_h) at ``positions`` (b, P) of instances ``rows`` (b,): of each one's document and kv head."""
    return split.k[split.doc[rows, None], split.kv_head(rows)[:, None], positions]
