"""A tiny model of every variant trains on real tokens on CPU: 100 AdamW steps, the loss must fall.

Tokens: the first documents of the embedded C4 sample (data/sample/c4_sample.jsonl) through the Pythia tokenizer
(data/20B_tokenizer.json), with the 255 most frequent ids kept and every other id mapped to one shared id, so the
output layer is small (vocabulary 256) and a step takes milliseconds.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from builders import model_config
from tokenizers import Tokenizer

from neox_dar.model import build_model

ROOT = Path(__file__).resolve().parents[1]
VOCAB, SEQ, BATCH, STEPS = 256, 64, 8, 100

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    tok = Tokenizer.from_file(str(ROOT / "data/20B_tokenizer.json"))
    ids: list[int] = []
    with open(ROOT / "data/sample/c4_sample.jsonl") as f:
        for line, _ in zip(f, range(60)):
            ids += tok.encode(json.loads(line)["text"]).ids + [0]
    keep = {t: n for n, (t, _) in enumerate(Counter(ids).most_common(VOCAB - 1))}
    return torch.tensor([keep.get(t, VOCAB - 1) for t in ids])


def unigram_entropy(tokens: torch.Tensor) -> float:
    """The loss of the best context-free predictor (nats)."""
    p = torch.bincount(tokens, minlength=VOCAB).double() / len(tokens)
    p = p[p > 0]
    return -(p * p.log()).sum().item()


def train(attention_type: str, tokens: torch.Tensor, **keys) -> dict:
    cfg = model_config(**{"num_layers": 2, **keys}, hidden_size=64, num_attention_heads=4, seq_length=SEQ,
                       vocab_size=VOCAB, make_vocab_size_divisible_by=1, attention_type=attention_type, window_size=16,
                       attention_impl="sdpa", **({"aha_l1_coef": 3e-2} if attention_type == "aha" else {}))
    torch.manual_seed(0)
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(0)
    losses, aux, mu_f = [], [], []
    for _ in range(STEPS):
        start = torch.randint(0, len(tokens) - SEQ - 1, (BATCH,), generator=g)
        batch = torch.stack([tokens[s:s + SEQ + 1] for s in start.tolist()])
        logits = model(batch[:, :-1])
        lm = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss = lm + model.aux_loss()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(lm.item())
        aux.append(model.aux_loss().item())
        stats = model.attention_stats()
        if stats:
            mu_f.append(torch.stack([v for k, v in stats.items() if k.endswith("mu_f")]).mean().item())
    return {"first": losses[0], "last": sum(losses[-10:]) / 10, "aux": aux, "mu_f": mu_f,
            "model": model}


HYBRID = {"num_layers": 12, "hybrid": "mswa_linear"}  # the MSWA paper's Sec. 4.4 stack: [linear, mswa, mswa] x 4


@pytest.mark.filterwarnings("ignore:MSWA")  # 2 layers do not split into 4 layer groups (expected here)
@pytest.mark.parametrize("attention_type,keys", [(t, {}) for t in ("vanilla", "dar", "uniform", "swa", "mswa", "aha",
                                                                   "linear")] + [("mswa", HYBRID)],
                         ids=lambda x: "hybrid" if x == HYBRID else (x or None))
def test_tiny_model_learns(attention_type, keys, tokens):
    r = train(attention_type, tokens, **keys)
    attention_type = r["model"].cfg.attention.attention_type
    print(f"{attention_type}: loss {r['first']:.3f} -> {r['last']:.3f} (unigram {unigram_entropy(tokens):.3f})")
    assert r["first"] == pytest.approx(math.log(VOCAB), abs=0.6)  # starts near uniform (init seeds vary it by 0.4)
    assert r["last"] < r["first"] - 2.0, f"{attention_type}: loss fell only {r['first']:.3f} -> {r['last']:.3f}"
    # below the best context-free loss: the model uses the preceding tokens, i.e. its attention
    assert r["last"] < unigram_entropy(tokens) - 0.3
    params = dict(r["model"].named_parameters())
    for name in ("dar_down", "dar_up", "router", "feature_q", "feature_k"):  # the variant's own parameters learn too
        for n, p in params.items():
            if name in n:
                assert p.grad is not None and p.grad.abs().max() > 0, n
    if attention_type == "aha":
        print(f"aha: aux loss {r['aux'][0]:.2e} -> {r['aux'][-1]:.2e}, mu_f {r['mu_f'][0]:.3f} -> {r['mu_f'][-1]:.3f}")
        assert all(math.isfinite(x) for x in r["aux"] + r["mu_f"])
        assert all(0.0 <= m <= 1.0 for m in r["mu_f"])
        assert r["aux"][-1] < r["aux"][0]  # the L1 term pushes the router scores down
