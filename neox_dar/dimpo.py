"""DimPO: post-hoc low-dimensional query/key projections trained with a listwise preference loss.

Paper: "DimPO: Dimensionality Reduction for Attention using Preference Optimization", Sec. 3; we follow it as
docs/dimpo.md states:

- per layer one bias-free ``W`` (d' x d_h) shared by all heads, applied to rotary-embedded queries and keys;
  projected scores ``F(q) F(k)^T / sqrt(d')``;
- for one query with causal keys ``1..m``: original weights ``psi = softmax(q K^T / sqrt(d_h))``, model scores
  ``s = beta * log_softmax(F(q) F(K)^T / sqrt(d'))``, and
  ``L = sum_{psi_i > psi_j} Delta_ij * log(1 + exp(-(s_i - s_j - gamma)))`` with LiPO's lambda weight
  ``Delta_ij = |G_i - G_j| * |1/log(1 + rank_i) - 1/log(1 + rank_j)|``, ``G_i = 2^psi_i - 1``, ranks by ``s``
  (descending, starting at 1), natural log. The paper prints Delta without G and a leading minus sign; we follow
  LiPO and minimise the positive sum. The loss of a batch is the mean over its queries.
- quality: mean KL(original || projected attention) and mean squared error of the attention outputs.

Command line (a vanilla checkpoint and a tokenized dataset)::

    python -m neox_dar.dimpo CHECKPOINT --data PREFIX --d-proj 16 --steps 200 --out runs/dimpo
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from .model import CausalLM
from .progress import progress_bar


def lambda_weights(psi: torch.Tensor, s: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """LiPO lambda weights ``Delta_ij`` (N, m, m) for target weights ``psi`` and scores ``s`` (N, m).

    Ranks are positions in the order of ``s`` (descending, 1-based) among the ``valid`` keys; invalid keys
    get weight 0. No gradient flows through the weights."""
    with torch.no_grad():
        s_masked = s.masked_fill(~valid, float("-inf"))
        order = s_masked.argsort(dim=-1, descending=True)
        ranks = torch.empty_like(order)
        ranks.scatter_(-1, order, torch.arange(1, s.shape[-1] + 1, device=s.device).expand_as(order))
        discount = 1.0 / torch.log1p(ranks.to(psi.dtype))
        gain = torch.exp2(psi) - 1.0
        delta = (gain[:, :, None] - gain[:, None, :]).abs() * (discount[:, :, None] - discount[:, None, :]).abs()
        return delta * (valid[:, :, None] & valid[:, None, :])


def dimpo_loss(psi: torch.Tensor, proj_logits: torch.Tensor, valid: torch.Tensor, beta: float = 1.0,
               gamma: float = 1e-4) -> torch.Tensor:
    """DimPO loss, mean over queries.

    psi: (N, m) original attention weights (rows sum to 1 over valid keys).
    proj_logits: (N, m) projected scores ``F(q) F(K)^T / sqrt(d')``.
    valid: (N, m) bool, the keys each query may see (causal).
    """
    s = beta * torch.log_softmax(proj_logits.masked_fill(~valid, float("-inf")), dim=-1)
    s = s.masked_fill(~valid, 0.0)
    delta = lambda_weights(psi, s, valid)
    preferred = (psi[:, :, None] > psi[:, None, :]) & (delta > 0)
    margin = s[:, :, None] - s[:, None, :] - gamma
    per_pair = F.softplus(-margin) * delta
    return torch.where(preferred, per_pair, torch.zeros_like(per_pair)).sum(dim=(1, 2)).mean()


def attention_kl(psi: torch.Tensor, proj_logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over queries of KL(psi || softmax(proj_logits)) over the valid keys; inputs (N, m)."""
    log_q = torch.log_softmax(proj_logits.masked_fill(~valid, float("-inf")), dim=-1)
    terms = torch.where(valid & (psi > 0), psi * (torch.log(psi.clamp_min(1e-30)) - log_q), torch.zeros_like(psi))
    return terms.sum(-1).mean()


def attention_output_mse(psi: torch.Tensor, proj_logits: torch.Tensor, valid: torch.Tensor,
                         v: torch.Tensor) -> torch.Tensor:
    """Mean over queries of ``||psi V - softmax(proj_logits) V||^2``; psi/logits (N, m), v (N, m, d_h)."""
    q = torch.softmax(proj_logits.masked_fill(~valid, float("-inf")), dim=-1)
    diff = torch.einsum("nm,nmd->nd", psi - q, v)
    return diff.pow(2).sum(-1).mean()


class DimPOProjection(nn.Module):
    """One bias-free ``W`` (d' x d_h) per layer; ``project(x[..., d_h]) -> x W^T [..., d']``."""

    def __init__(self, num_layers: int, head_dim: int, d_proj: int):
        super().__init__()
        if not 1 <= d_proj <= head_dim:
            raise ValueError(f"d_proj must be in 1..head_dim={head_dim}, got {d_proj}")
        self.d_proj = d_proj
        self.proj = nn.ModuleList(nn.Linear(head_dim, d_proj, bias=False) for _ in range(num_layers))

    def list_scores(self, layer: int, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Projected scores ``F(q) F(K)^T / sqrt(d')`` (N, T) of N queries q (N, d_h) against their keys
        k (N, T, d_h)."""
        w = self.proj[layer]
        return torch.einsum("nd,ntd->nt", w(q), w(k)) / math.sqrt(self.d_proj)


@torch.no_grad()
def capture_qkv(model: CausalLM, input_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Run the model and return per layer the rotary-embedded ``(q, k, v)``, each (B, H, T, d_h): a forward hook
    on each attention module recomputes them from the module's inputs ``(a, cos, sin)``."""
    attention_type = model.cfg.attention.attention_type
    if attention_type != "vanilla":
        raise ValueError(f"DimPO projects vanilla attention; this model uses '{attention_type}'")
    captured = []

    def capture(module, args, output):
        captured.append(tuple(t.detach() for t in module.split_heads(*args)))

    hooks = [attn.register_forward_hook(capture) for attn in model.attention_modules()]
    try:
        model(input_ids)
    finally:
        for hook in hooks:
            hook.remove()
    return captured


def query_lists(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, every: int):
    """Training instances of one layer: every ``every``-th query of each head (offset by the head index, so the
    heads together cover all positions), with its causal keys.

    q, k, v: (B, H, T, d_h). Returns ``(psi, valid, q_sel, k_sel, v_sel)``: psi/valid (N, T),
    q_sel (N, d_h), k_sel/v_sel (N, T, d_h)."""
    B, H, T, D = q.shape
    rows = [(b, h, i) for b in range(B) for h in range(H) for i in range(h % every, T, every)]
    b_idx, h_idx, i_idx = (torch.tensor(x) for x in zip(*rows))
    q_sel, k_sel, v_sel = q[b_idx, h_idx, i_idx], k[b_idx, h_idx], v[b_idx, h_idx]
    valid = torch.arange(T)[None, :] <= i_idx[:, None]
    scores = torch.einsum("nd,ntd->nt", q_sel.float(), k_sel.float()) / math.sqrt(D)
    psi = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=-1)
    return psi, valid, q_sel.float(), k_sel.float(), v_sel.float()


def evaluate(projection: DimPOProjection, layers_qkv, every: int = 1) -> dict[str, list[float]]:
    """Per-layer KL and output MSE of the projected attention on captured ``(q, k, v)``."""
    out = {"kl": [], "mse": []}
    with torch.no_grad():
        for layer, (q, k, v) in enumerate(layers_qkv):
            psi, valid, qs, ks, vs = query_lists(q, k, v, every)
            logits = projection.list_scores(layer, qs, ks)
            out["kl"].append(attention_kl(psi, logits, valid).item())
            out["mse"].append(attention_output_mse(psi, logits, valid, vs).item())
    return out


def train_projection(projection: DimPOProjection, layers_qkv, steps: int, lr: float = 1e-4, beta: float = 1.0,
                     gamma: float = 1e-4, queries_per_step: int = 1, seed: int = 0) -> list[float]:
    """Train each layer's ``W`` independently with Adam on its query lists; returns the per-step mean loss."""
    gen = torch.Generator().manual_seed(seed)
    history = np.zeros(steps)
    for layer, (q, k, v) in enumerate(layers_qkv):
        psi, valid, qs, ks, _ = query_lists(q, k, v, every=q.shape[1])
        opt = torch.optim.Adam(projection.proj[layer].parameters(), lr=lr)
        for step in progress_bar(iterable=range(steps), desc=f"DimPO layer {layer}", leave=False):
            pick = torch.randint(0, psi.shape[0], (queries_per_step,), generator=gen)
            logits = projection.list_scores(layer, qs[pick], ks[pick])
            loss = dimpo_loss(psi[pick], logits, valid[pick], beta, gamma)
            opt.zero_grad()
            loss.backward()
            opt.step()
            history[step] += loss.item() / len(layers_qkv)
    return history.tolist()


def main(argv: list[str] | None = None) -> int:
    from .checkpoint import load_model
    from .data import IndexedDataset

    parser = argparse.ArgumentParser(prog="python -m neox_dar.dimpo", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--data", required=True, help="prefix of a tokenized .bin/.idx dataset")
    parser.add_argument("--d-proj", type=int, default=16)
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--train-seqs", type=int, default=8)
    parser.add_argument("--eval-seqs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model, cfg = load_model(args.checkpoint)
    model.eval()
    data = IndexedDataset(args.data)
    tokens = np.concatenate([np.asarray(data[i], dtype=np.int64) for i in range(len(data))])
    need = (args.train_seqs + args.eval_seqs) * args.seq_length
    if tokens.size < need:
        print(f"dimpo error: {args.data} holds {tokens.size} tokens, need {need}", file=sys.stderr)
        return 2
    seqs = torch.from_numpy(tokens[:need].reshape(-1, args.seq_length))
    train_qkv = capture_qkv(model, seqs[: args.train_seqs])
    eval_qkv = capture_qkv(model, seqs[args.train_seqs:])
    projection = DimPOProjection(cfg.num_layers, cfg.head_dim, args.d_proj)
    before = evaluate(projection, eval_qkv)
    history = train_projection(projection, train_qkv, args.steps, args.lr, args.beta, args.gamma, seed=args.seed)
    after = evaluate(projection, eval_qkv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({f"gpt_neox.layers.{l}.attention.dimpo_proj.weight": p.weight.detach().contiguous()
               for l, p in enumerate(projection.proj)}, str(out / "dimpo.safetensors"))
    report = {"checkpoint": str(args.checkpoint), "d_proj": args.d_proj, "steps": args.steps, "lr": args.lr,
              "beta": args.beta, "gamma": args.gamma, "before": before, "after": after, "loss": history}
    (out / "dimpo.json").write_text(json.dumps(report, indent=2))
    for l in range(cfg.num_layers):
        print(f"layer {l}: KL {before['kl'][l]:.4f} -> {after['kl'][l]:.4f}   MSE {before['mse'][l]:.5f} -> "
              f"{after['mse'][l]:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
