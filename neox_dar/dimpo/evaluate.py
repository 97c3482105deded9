"""Quality of projections on one layer's instances (paper Sec. 3.1): mean over the instances of
``KL(original || projected attention)`` and of the attention-output squared error ``||psi V - psi' V||^2``.

Many projections are scored in one pass over the blocks of queries, so the original weights of a block are
computed once for all of them.
"""

from __future__ import annotations

import math

import torch

from .instances import LayerSplit
from .losses import kl_per_query, masked_log_softmax, output_se_per_query


@torch.no_grad()
def evaluate(split: LayerSplit, projections: dict[str, torch.Tensor], block: int) -> dict[str, dict[str, float]]:
    """``{name: {"kl", "mse"}}``: means over every instance of ``split`` (which must hold values) for each
    projection ``W`` (d', d_h) in ``projections``."""
    if split.v is None:
        raise ValueError("evaluate needs a split captured with its values")
    # F(q) F(k)^T / sqrt(d') = q (W^T W / sqrt(d')) k^T
    grams = {name: w.T @ w / math.sqrt(w.shape[0]) for name, w in projections.items()}
    sums = {name: torch.zeros(2, dtype=torch.float64, device=split.q.device) for name in projections}
    for rows, d, g in split.blocks(block):
        m = int(split.pos[rows.stop - 1]) + 1  # positions rise within a block
        keys, values = split.k[d, g, :m], split.v[d, g, :m]
        original, valid = split.original_logits(rows, keys)
        log_p = masked_log_softmax(original, valid)
        for name, gram in grams.items():
            log_q = masked_log_softmax(split.q[rows] @ gram @ keys.T, valid)
            sums[name][0] += kl_per_query(log_p, log_q, valid).sum(dtype=torch.float64)
            sums[name][1] += output_se_per_query(log_p, log_q, values).sum(dtype=torch.float64)
    n = len(split)
    return {name: {"kl": float(s[0]) / n, "mse": float(s[1]) / n} for name, s in sums.items()}
