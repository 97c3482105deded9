"""DimPO's and the baselines' losses and metrics against float64 brute forces written from each paper's formula, one
query (and one pair) at a time; PCA against numpy.linalg.svd."""

import math

import numpy as np
import pytest
import torch

from neox_dar.dimpo import losses
from neox_dar.dimpo.losses import (cpo_loss, dimpo_loss, kl_per_query, masked_log_softmax, orpo_loss,
                                   output_se_per_query, simpo_loss, triplet_loss)
from neox_dar.dimpo.methods import pca_projection, random_projection


def log_softmax_list(z):
    lse = math.log(sum(math.exp(x) for x in z))
    return [x - lse for x in z]


def dimpo_brute_force(psi, z, valid, beta, gamma):
    """SPEC's formula: pairs psi_i > psi_j, LiPO's Delta with gains, ranks by s (1-based, descending)."""
    total = 0.0
    for n in range(psi.shape[0]):
        keys = [j for j in range(psi.shape[1]) if valid[n, j]]
        s = dict(zip(keys, (beta * x for x in log_softmax_list([float(z[n, j]) for j in keys]))))
        rank = {j: r + 1 for r, j in enumerate(sorted(keys, key=lambda j: -s[j]))}
        for i in keys:
            for j in keys:
                if psi[n, i] > psi[n, j]:
                    gain = abs((2 ** float(psi[n, i]) - 1) - (2 ** float(psi[n, j]) - 1))
                    disc = abs(1 / math.log(1 + rank[i]) - 1 / math.log(1 + rank[j]))
                    total += gain * disc * math.log(1 + math.exp(-(s[i] - s[j] - gamma)))
    return total / psi.shape[0]


def random_lists(n, m, seed):
    torch.manual_seed(seed)
    valid = torch.rand(n, m) > 0.2
    valid[:, 0] = True
    psi = torch.softmax(torch.randn(n, m, dtype=torch.float64).masked_fill(~valid, float("-inf")), -1)
    return psi, torch.randn(n, m, dtype=torch.float64) * 2, valid


@pytest.mark.parametrize("n,m,beta,gamma", [(3, 7, 1.0, 1e-4), (5, 12, 0.5, 0.1), (2, 1, 1.0, 0.0)])
def test_dimpo_matches_brute_force(n, m, beta, gamma):
    psi, z, valid = random_lists(n, m, n * m)
    ours = dimpo_loss(psi, z, valid, beta, gamma).item()
    assert ours == pytest.approx(dimpo_brute_force(psi, z, valid, beta, gamma), rel=1e-10, abs=1e-12)


def test_dimpo_in_blocks_equals_one_block_with_the_same_gradient(monkeypatch):
    """Blocks of preferred keys, recomputed in the backward pass, give the whole loss and its gradient."""
    psi, z, valid = random_lists(3, 40, 0)
    grads = []
    for block in (1 << 22, 7):  # one block; one preferred key per block (7 // (3 * 40) rounds up to 1)
        monkeypatch.setattr(losses, "PAIR_BLOCK", block)
        zz = z.clone().requires_grad_()
        loss = dimpo_loss(psi, zz, valid)
        loss.backward()
        grads.append((loss.item(), zz.grad))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-12)
    assert torch.allclose(grads[0][1], grads[1][1], rtol=1e-10, atol=1e-14) and grads[0][1].abs().sum() > 0
    assert grads[0][0] == pytest.approx(dimpo_brute_force(psi, z, valid, 1.0, 1e-4), rel=1e-10)


# ---- pairwise losses: softmax over the two keys, as the paper's Sec. 3.1 says

def pair_probs(zc, zr):
    pc = math.exp(zc) / (math.exp(zc) + math.exp(zr))
    return pc, 1 - pc


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def simpo_brute(zc, zr, beta, gamma):  # Meng et al. 2024, Eq. 6, |y| = 1
    pc, pr = pair_probs(zc, zr)
    return -math.log(sigmoid(beta * math.log(pc) - beta * math.log(pr) - gamma))


def cpo_brute(zc, zr, beta, gamma):  # Xu et al. 2024: L_prefer + L_NLL, with the margin gamma
    pc, pr = pair_probs(zc, zr)
    return -math.log(sigmoid(beta * math.log(pc) - beta * math.log(pr) - gamma)) - math.log(pc)


def orpo_brute(zc, zr, lam):  # Hong et al. 2024, Eq. 6-7: L_SFT + lambda L_OR, odds(p) = p / (1 - p)
    pc, pr = pair_probs(zc, zr)
    odds_c, odds_r = pc / (1 - pc), pr / (1 - pr)
    return -math.log(pc) - lam * math.log(sigmoid(math.log(odds_c / odds_r)))


@pytest.mark.parametrize("name,fn,brute,params", [
    ("simpo", simpo_loss, simpo_brute, {"beta": 1.0, "gamma": 1.0}),
    ("simpo", simpo_loss, simpo_brute, {"beta": 2.5, "gamma": 0.1}),
    ("cpo", cpo_loss, cpo_brute, {"beta": 1.0, "gamma": 0.1}),
    ("cpo", cpo_loss, cpo_brute, {"beta": 0.1, "gamma": 0.0}),
    ("orpo", orpo_loss, lambda zc, zr, beta: orpo_brute(zc, zr, beta), {"beta": 0.1}),
    ("orpo", orpo_loss, lambda zc, zr, beta: orpo_brute(zc, zr, beta), {"beta": 1.0}),
])
def test_pairwise_losses_match_brute_force(name, fn, brute, params):
    torch.manual_seed(len(name))
    zc, zr = torch.randn(9, dtype=torch.float64) * 3, torch.randn(9, dtype=torch.float64) * 3
    expected = sum(brute(float(a), float(b), **params) for a, b in zip(zc, zr)) / 9
    assert fn(zc, zr, **params).item() == pytest.approx(expected, rel=1e-12)


def test_triplet_loss_matches_brute_force():
    """Mongoose: max(0, (1 - cos(q, k+)) - (1 - cos(q, k-)) + margin)."""
    torch.manual_seed(0)
    fq, fp, fn = (torch.randn(7, 5, dtype=torch.float64) for _ in range(3))

    def cos(a, b):
        return float(a @ b) / (math.sqrt(float(a @ a)) * math.sqrt(float(b @ b)))

    for margin in (1.0, 0.2):
        expected = sum(max(0.0, (1 - cos(q, p)) - (1 - cos(q, n)) + margin) for q, p, n in zip(fq, fp, fn)) / 7
        assert triplet_loss(fq, fp, fn, margin).item() == pytest.approx(expected, rel=1e-12)


def test_every_loss_gives_the_projection_a_gradient():
    torch.manual_seed(0)
    w = torch.randn(3, 8, requires_grad=True)
    q, kc, kr = (torch.randn(5, 8) for _ in range(3))
    zc, zr = ((q @ w.T) * (kc @ w.T)).sum(-1), ((q @ w.T) * (kr @ w.T)).sum(-1)
    for loss in (simpo_loss(zc, zr), cpo_loss(zc, zr), orpo_loss(zc, zr), triplet_loss(q @ w.T, kc @ w.T, kr @ w.T,
                                                                                         margin=3.0)):
        w.grad = None
        loss.backward(retain_graph=True)
        assert w.grad.abs().sum() > 0


# ---- metrics


def test_kl_and_output_error_match_brute_force():
    torch.manual_seed(0)
    n, m, d = 4, 9, 3
    valid = torch.tril(torch.ones(n, m, dtype=torch.bool), diagonal=m - n)
    a, b = torch.randn(n, m, dtype=torch.float64), torch.randn(n, m, dtype=torch.float64)
    v = torch.randn(m, d, dtype=torch.float64)
    log_p, log_q = masked_log_softmax(a, valid), masked_log_softmax(b, valid)
    kl, se = kl_per_query(log_p, log_q, valid), output_se_per_query(log_p, log_q, v)
    for i in range(n):
        keys = [j for j in range(m) if valid[i, j]]
        p = [math.exp(x) for x in log_softmax_list([float(a[i, j]) for j in keys])]
        q = [math.exp(x) for x in log_softmax_list([float(b[i, j]) for j in keys])]
        assert float(kl[i]) == pytest.approx(sum(pj * math.log(pj / qj) for pj, qj in zip(p, q)), rel=1e-12)
        diff = [sum((pj - qj) * float(v[j, c]) for pj, qj, j in zip(p, q, keys)) for c in range(d)]
        assert float(se[i]) == pytest.approx(sum(x * x for x in diff), rel=1e-12)
    assert float(kl_per_query(log_p, log_p, valid).abs().max()) < 1e-15


# ---- closed-form baselines


def test_pca_spans_numpy_svd_top_directions():
    """The rows of W span the top right-singular vectors of the centred data (up to sign, in order)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((500, 6)) @ np.diag([5.0, 3.0, 2.0, 1.0, 0.5, 0.1]) @ rng.standard_normal((6, 6)) + 4.0
    _, _, vt = np.linalg.svd(x - x.mean(0), full_matrices=False)
    rows = torch.from_numpy(x).float()
    w = pca_projection([rows[:123], rows[123:]], 3).double().numpy()  # two parts pooled
    assert w.shape == (3, 6)
    for r in range(3):
        assert abs(float(w[r] @ vt[r])) == pytest.approx(1.0, abs=1e-4)


def test_random_projection_is_gaussian_with_variance_one_over_d():
    w = random_projection(64, 16, torch.Generator().manual_seed(0))
    assert w.shape == (16, 64)
    assert float(w.var()) * 16 == pytest.approx(1.0, rel=0.1) and abs(float(w.mean())) < 0.02
