"""Every attention path against an independent brute-force loop (per query, per key, float64).

The loops below share no code with ``neox_dar.attention``: they build keys, rotary, windows, the DAR pair rule,
the MSWA window rule and the AHA gate from the SPEC text, score one (query, key) pair at a time, and are
differentiated by autograd in float64. Outputs and gradients (of every input and parameter) must agree.
"""

from __future__ import annotations

import math

import pytest
import torch
from builders import attention_config

from neox_dar.attention import build_attention
from neox_dar.attention.aha import aha_reference, aha_sdpa
from neox_dar.attention.base import RotaryEmbedding
from neox_dar.attention.dar import dar_reference, dar_sdpa
from neox_dar.attention.masks import masked_attention, window_mask
from neox_dar.attention.windowed import windowed_sdpa
from neox_dar.config import ModelConfig

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------------
# brute force, float64


def brute_attention(q, pair):
    """q (B, H, T, D). ``pair(b, h, i, j)`` -> (key, value) vectors for the pair, or None when j is not seen."""
    B, H, T, D = q.shape
    rows = []
    for b in range(B):
        for h in range(H):
            for i in range(T):
                scores, values = [], []
                for j in range(i + 1):
                    kv = pair(b, h, i, j)
                    if kv is None:
                        continue
                    scores.append(torch.dot(q[b, h, i], kv[0]) / math.sqrt(D))
                    values.append(kv[1])
                s = torch.stack(scores)
                e = torch.exp(s - s.max())
                p = e / e.sum()
                rows.append(sum(p[n] * values[n] for n in range(len(values))))
    return torch.stack(rows).view(B, H, T, D)


def inside(i, j, w):
    """The SPEC window convention: key j is inside a window of w for query i when i - j < w."""
    return i - j < w


def brute_window_pairs(k, v, window_of):
    """Pair rule for windowed attention; ``window_of(b, h, i)`` -> window (None = full causal)."""
    def pair(b, h, i, j):
        w = window_of(b, h, i)
        return (k[b, h, j], v[b, h, j]) if w is None or inside(i, j, w) else None
    return pair


def brute_dar_pairs(k_loc, v_loc, k_glob, v_glob, w):
    def pair(b, h, i, j):
        if inside(i, j, w):
            return k_loc[b, h, j], v_loc[b, h, j]
        return k_glob[b, h, j], v_glob[b, h, j]
    return pair


def spec_mswa_window(w, layer, L, head, H):
    """SPEC: 1-based layer i = layer + 1 in group ceil(4i/L) - 1, head j = head + 1 in ceil(4j/H) - 1; window
    w * 2^(g - 2) * 2^(c - 2), floored, at least 1 (float math on purpose)."""
    g, c = math.ceil(4 * (layer + 1) / L) - 1, math.ceil(4 * (head + 1) / H) - 1
    return max(1, math.floor(w * 2.0 ** (g - 2) * 2.0 ** (c - 2)))


def brute_rotary(x, r, base):
    """GPT-NeoX rotate-half rotary on the first r dims of x (B, H, T, D), one position at a time."""
    if r == 0:
        return x
    B, H, T, D = x.shape
    out = []
    for t in range(T):
        xt = x[:, :, t]
        half = r // 2
        ang = torch.tensor([t * base ** (-2.0 * m / r) for m in range(half)], dtype=x.dtype)
        x1, x2 = xt[..., :half], xt[..., half:r]
        out.append(torch.cat((x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin(), xt[..., r:]), -1))
    return torch.stack(out, dim=2)


def brute_heads(a, weight, bias, H):
    """(B, T, d) -> q, k, v (B, H, T, D) through one fused linear in HF's per-head [q, k, v] layout."""
    B, T, _ = a.shape
    y = (a @ weight.T + bias).view(B, T, H, 3, -1)
    return tuple(y[:, :, :, n].transpose(1, 2) for n in range(3))


def brute_module(cfg: ModelConfig, layer: int, params: dict, a):
    """The whole attention module of ``cfg`` in float64 from its parameters; returns (out (B,T,d), aux)."""
    H, r = cfg.num_attention_heads, cfg.rotary_ndims
    rot = lambda x: brute_rotary(x, r, cfg.rotary_emb_base)  # noqa: E731
    q, k, v = brute_heads(a, params["query_key_value.weight"], params["query_key_value.bias"], H)
    q, k = rot(q), rot(k)
    w, t = cfg.attention.window_size, cfg.attention.attention_type
    aux = None
    if t in ("dar", "uniform"):
        h2 = a @ params["dar_down.weight"].T @ params["dar_up.weight"].T
        _, kg, vg = brute_heads(h2, params["query_key_value.weight"], params["query_key_value.bias"], H)
        o = brute_attention(q, brute_dar_pairs(k, v, rot(kg), vg, 0 if t == "uniform" else w))
    elif t == "vanilla":
        o = brute_attention(q, brute_window_pairs(k, v, lambda b, h, i: None))
    elif t == "swa":
        o = brute_attention(q, brute_window_pairs(k, v, lambda b, h, i: w))
    elif t == "mswa":
        L = cfg.num_layers
        o = brute_attention(q, brute_window_pairs(k, v, lambda b, h, i: spec_mswa_window(w, layer, L, h, H)))
    else:  # aha
        s = torch.sigmoid(a @ params["router.weight"].T)  # (B, T, H)
        g = s > cfg.attention.aha_threshold
        o = brute_attention(q, brute_window_pairs(k, v, lambda b, h, i: None if g[b, i, h] else w))
        o = o * (1 + torch.where(g, 1.0, -1.0) * (s - s.detach())).transpose(1, 2)[..., None]
        aux = cfg.attention.aha_l1_coef * s.mean() / cfg.num_layers
    B, _, T, D = o.shape
    out = o.transpose(1, 2).reshape(B, T, H * D) @ params["dense.weight"].T + params["dense.bias"]
    return out, aux


# ---------------------------------------------------------------------------------------------------------
# helpers


def run(fn, inputs, upstream):
    """Forward ``fn(*inputs)``, backprop ``upstream``; returns (output, grads of inputs)."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    out.backward(upstream.to(out.dtype))
    return out.detach(), [x.grad for x in leaves]


def assert_matches(path_inputs, path_fn, brute_fn, atol=2e-5):
    """Compare a float32 path with the float64 brute force: output and the gradient of every input."""
    torch.manual_seed(7)
    probe = path_fn(*path_inputs)
    upstream = torch.randn(probe.shape, dtype=torch.float64)
    out, grads = run(path_fn, path_inputs, upstream)
    ref, ref_grads = run(brute_fn, [x.double() for x in path_inputs], upstream)
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=1e-4)
    for n, (x, g, rg) in enumerate(zip(path_inputs, grads, ref_grads)):
        g, rg = (torch.zeros_like(x) if t is None else t for t in (g, rg))  # None: the input took no part
        torch.testing.assert_close(g.double(), rg.double(), atol=atol, rtol=1e-4,
                                   msg=lambda m: f"grad of input {n}: {m}")


SHAPES = [  # B, H, T, d_h   (odd T, T not a multiple of anything useful, H in {1, 4, 8}, d_h in {16, 32, 64})
    (2, 1, 13, 16),
    (1, 4, 11, 32),
    (2, 8, 7, 16),
    (1, 4, 9, 64),
]


def qkv(shape, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(n)]


# ---------------------------------------------------------------------------------------------------------
# functional paths


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("window", [1, 3, 6, 40])
def test_swa_paths(shape, window):
    brute = lambda q, k, v: brute_attention(q, brute_window_pairs(k, v, lambda b, h, i: window))  # noqa: E731
    ref = lambda q, k, v: masked_attention(q, k, v, window_mask(q.shape[-2], window))  # noqa: E731
    assert_matches(qkv(shape), ref, brute)
    for min_block in (1, 4, 64):  # many blocks, a few blocks, one block
        assert_matches(qkv(shape), lambda q, k, v: windowed_sdpa(q, k, v, window, min_block=min_block), brute)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("window", [0, 1, 4, 9, 50])
def test_dar_paths(shape, window):
    brute = lambda q, kl, vl, kg, vg: brute_attention(q, brute_dar_pairs(kl, vl, kg, vg, window))  # noqa: E731
    for fn in (dar_reference, dar_sdpa):
        assert_matches(qkv(shape, 5), lambda *x: fn(*x, window), brute)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("window", [1, 5])
def test_aha_paths(shape, window):
    B, H, T, _ = shape
    gate = torch.rand(B, H, T, generator=torch.Generator().manual_seed(3)) > 0.5
    gate[0, 0] = True  # one slice all full, one all local, the rest mixed
    gate[-1, -1] = False

    def brute(q, k, v):
        return brute_attention(q, brute_window_pairs(k, v, lambda b, h, i: None if gate[b, h, i] else window))

    for fn in (aha_reference, aha_sdpa):
        assert_matches(qkv(shape), lambda q, k, v: fn(q, k, v, gate, window), brute)


# ---------------------------------------------------------------------------------------------------------
# whole modules: outputs and gradients of the input and of every parameter


MODULE_CASES = [  # attention_type, B, T, H, d_h, window, extra keys, layer
    ("vanilla", 2, 9, 4, 16, 4, {}, 0),
    ("dar", 2, 11, 4, 16, 4, {}, 0),
    ("dar", 1, 9, 8, 16, 1, {"dar_d_down": 5}, 0),
    ("dar", 1, 7, 1, 64, 3, {"dar_d_down": 64}, 0),
    ("uniform", 2, 9, 4, 32, 0, {}, 0),
    ("swa", 2, 11, 4, 16, 3, {}, 0),
    ("swa", 1, 7, 1, 64, 2, {}, 0),
    ("mswa", 1, 13, 8, 16, 8, {"num_layers": 4}, 3),
    ("mswa", 2, 9, 4, 32, 8, {"num_layers": 4}, 1),
    ("mswa", 1, 11, 6, 16, 16, {"num_layers": 6}, 4),  # 6 layers and 6 heads: unequal groups
    ("aha", 2, 11, 4, 16, 3, {"aha_l1_coef": 0.3}, 0),
    ("aha", 1, 9, 8, 16, 2, {"aha_l1_coef": 0.3, "aha_threshold": 0.45}, 1),
]


@pytest.mark.parametrize("impl", ["reference", "sdpa"])
@pytest.mark.parametrize("case", MODULE_CASES, ids=lambda c: f"{c[0]}-T{c[2]}-H{c[3]}-d{c[4]}-w{c[5]}")
def test_module_matches_brute_force(case, impl):
    attention_type, B, T, H, d_h, window, extra, layer = case
    cfg = attention_config(attention_type, impl, H, d_h, window_size=window, **extra)
    torch.manual_seed(11)
    mod = build_attention(cfg, layer)
    with torch.no_grad():  # unit-scale outputs, non-trivial biases; AHA scores spread so both paths occur
        for name, p in mod.named_parameters():
            p.copy_(torch.randn_like(p) * (p.shape[-1] ** -0.5 if name.endswith("weight") else 0.5))
    a = torch.randn(B, T, cfg.hidden_size)
    cos, sin = RotaryEmbedding(cfg.rotary_ndims, cfg.rotary_emb_base)(T, torch.float32, a.device)

    a1 = a.clone().requires_grad_(True)
    out = mod(a1, cos, sin)
    upstream = torch.randn(out.shape, dtype=torch.float64)
    loss = (out.double() * upstream).sum() + (mod.aux_loss.double() if mod.aux_loss is not None else 0.0)
    loss.backward()

    params = {n: p.detach().double().requires_grad_(True) for n, p in mod.named_parameters()}
    a2 = a.double().requires_grad_(True)
    ref, aux = brute_module(cfg, layer, params, a2)
    ((ref * upstream).sum() + (aux if aux is not None else 0.0)).backward()

    def close(actual, expected, what):  # float32 path vs float64 loop, tolerance relative to the tensor's scale
        atol = 3e-6 * max(1.0, expected.abs().max().item())
        torch.testing.assert_close(actual.detach().double(), expected.detach(), atol=atol, rtol=1e-4,
                                   msg=lambda m: f"{what}: {m}")

    close(out, ref, "output")
    if aux is not None:
        close(mod.aux_loss, aux, "aux_loss")
        assert 0 < mod.stats["mu_f"].mean() < 1, "the test should exercise both AHA paths"
    close(a1.grad, a2.grad, "grad of the input")
    for name, p in mod.named_parameters():
        close(p.grad, params[name].grad, f"grad of {name}")
