"""DimPO loss against a brute-force per-pair loop, quality metrics, and projection training."""

import math

import pytest
import torch

from neox_dar.config import load_config
from neox_dar.dimpo import (
    DimPOProjection,
    attention_kl,
    attention_output_mse,
    capture_qkv,
    dimpo_loss,
    evaluate,
    train_projection,
)
from neox_dar.model import build_model


def brute_force_loss(psi, logits, valid, beta, gamma):
    """SPEC's formula, one query and one pair at a time, in float64."""
    total = 0.0
    for n in range(psi.shape[0]):
        keys = [j for j in range(psi.shape[1]) if valid[n, j]]
        z = [float(logits[n, j]) for j in keys]
        lse = math.log(sum(math.exp(x) for x in z))
        s = {j: beta * (x - lse) for j, x in zip(keys, z)}
        order = sorted(keys, key=lambda j: -s[j])
        rank = {j: r + 1 for r, j in enumerate(order)}
        for i in keys:
            for j in keys:
                if psi[n, i] > psi[n, j]:
                    gain = abs((2 ** float(psi[n, i]) - 1) - (2 ** float(psi[n, j]) - 1))
                    disc = abs(1 / math.log(1 + rank[i]) - 1 / math.log(1 + rank[j]))
                    total += gain * disc * math.log(1 + math.exp(-(s[i] - s[j] - gamma)))
    return total / psi.shape[0]


@pytest.mark.parametrize("n,m,beta,gamma", [(3, 7, 1.0, 1e-4), (5, 12, 0.5, 0.1), (2, 1, 1.0, 0.0)])
def test_loss_matches_brute_force(n, m, beta, gamma):
    torch.manual_seed(n * m)
    valid = torch.rand(n, m) > 0.2
    valid[:, 0] = True
    psi = torch.softmax(torch.randn(n, m, dtype=torch.float64).masked_fill(~valid, float("-inf")), -1)
    logits = torch.randn(n, m, dtype=torch.float64)
    ours = dimpo_loss(psi, logits, valid, beta, gamma).item()
    assert ours == pytest.approx(brute_force_loss(psi, logits, valid, beta, gamma), rel=1e-10, abs=1e-12)


def test_loss_gradient_flows_to_scores_only():
    torch.manual_seed(0)
    valid = torch.ones(4, 6, dtype=torch.bool)
    psi = torch.softmax(torch.randn(4, 6), -1)
    logits = torch.randn(4, 6, requires_grad=True)
    dimpo_loss(psi, logits, valid).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_kl_and_mse_are_zero_for_identical_attention_and_positive_otherwise():
    torch.manual_seed(0)
    valid = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    logits = torch.randn(5, 5)
    psi = torch.softmax(logits.masked_fill(~valid, float("-inf")), -1)
    v = torch.randn(5, 5, 8)
    assert attention_kl(psi, logits, valid).item() == pytest.approx(0.0, abs=1e-6)
    assert attention_output_mse(psi, logits, valid, v).item() == pytest.approx(0.0, abs=1e-10)
    other = torch.randn(5, 5)
    assert attention_kl(psi, other, valid).item() > 1e-3
    assert attention_output_mse(psi, other, valid, v).item() > 1e-4


def tiny_model():
    cfg = load_config(overrides=["num_layers=2", "hidden_size=64", "num_attention_heads=2", "vocab_size=300",
                                 "make_vocab_size_divisible_by=1", "seq_length=48"]).model
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():  # sharper attention than the small init gives
        for layer in model.gpt_neox.layers:
            layer.attention.query_key_value.weight.mul_(8)
    return model, cfg


def test_identity_projection_reproduces_attention():
    model, cfg = tiny_model()
    qkv = capture_qkv(model, torch.randint(0, 300, (1, 48)))
    proj = DimPOProjection(cfg.num_layers, cfg.head_dim, cfg.head_dim)
    with torch.no_grad():
        for p in proj.proj:
            p.weight.copy_(torch.eye(cfg.head_dim))
    metrics = evaluate(proj, qkv)
    assert max(metrics["kl"]) < 1e-5 and max(metrics["mse"]) < 1e-8


def test_training_lowers_kl_on_held_out_sequences():
    model, cfg = tiny_model()
    train = capture_qkv(model, torch.randint(0, 300, (2, 48)))
    held_out = capture_qkv(model, torch.randint(0, 300, (1, 48)))
    torch.manual_seed(1)
    proj = DimPOProjection(cfg.num_layers, cfg.head_dim, 4)
    before = evaluate(proj, held_out)
    history = train_projection(proj, train, steps=150, lr=3e-2, queries_per_step=8)
    after = evaluate(proj, held_out)
    assert sum(after["kl"]) < 0.7 * sum(before["kl"])
    assert sum(history[-20:]) < sum(history[:20])


def test_capture_rejects_variant_models():
    model, _ = tiny_model()
    model.cfg = load_config(overrides=["attention_type=swa"]).model
    with pytest.raises(ValueError, match="DimPO projects vanilla attention"):
        capture_qkv(model, torch.randint(0, 300, (1, 8)))


def test_command_line_trains_and_reports(tmp_path):
    import json
    import subprocess
    import sys

    import numpy as np

    from neox_dar.checkpoint import save_weights
    from neox_dar.data import IndexedDatasetWriter

    model, cfg = tiny_model()
    save_weights(model, cfg, tmp_path / "ckpt")
    writer = IndexedDatasetWriter(tmp_path / "tokens", np.uint16)
    rng = np.random.default_rng(0)
    for _ in range(4):
        writer.add_document(rng.integers(0, 300, 100))
    writer.finalize()
    r = subprocess.run([sys.executable, "-m", "neox_dar.dimpo", str(tmp_path / "ckpt"), "--data", str(tmp_path / "tokens"),
                        "--d-proj", "4", "--seq-length", "32", "--train-seqs", "2", "--eval-seqs", "1", "--steps", "5",
                        "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "out/dimpo.json").read_text())
    assert len(report["after"]["kl"]) == cfg.num_layers and len(report["loss"]) == 5
    assert (tmp_path / "out/dimpo.safetensors").is_file()
