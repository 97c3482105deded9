"""Linear attention (Taylor feature map of Based; docs/attention.md): the chunked PyTorch path against an explicit
float64 O(T^2) formula written here from the SPEC, the whole module against a float64 loop, the decoding step
against the full forward, flash-linear-attention's kernel against the PyTorch path (CUDA only), and its costs."""

from __future__ import annotations

import math

import pytest
import torch
from builders import attention_config, model_config

from neox_dar.attention import build_attention
from neox_dar.attention.base import RotaryEmbedding
from neox_dar.attention.linear import LinearAttention, taylor_linear_attention, taylor_weights
from neox_dar.model import build_model, flops_per_token
from neox_dar.standalone.linear import feature_rotary, taylor_features

pytestmark = pytest.mark.usefixtures("one_thread")


def explicit(q, k, v):
    """SPEC, Eq. 6-7 with phi(q).phi(k) = 1 + s + s^2/2, s = q.k / sqrt(d_f): every (i, j <= i) weight formed."""
    T = q.shape[-2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    weights = (1 + s + s * s / 2) * torch.ones(T, T, dtype=torch.bool).tril()
    return (weights @ v) / weights.sum(-1, keepdim=True)


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("B,H,T,d_f,d_v", [(2, 3, 37, 4, 5), (1, 2, 1, 16, 8), (1, 1, 130, 16, 16), (2, 2, 64, 1, 3)])
@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_chunked_path_equals_the_explicit_formula(B, H, T, d_f, d_v, chunk):
    """Outputs and the gradients of q, k and v, against float64 (chunks that divide T, that do not, one chunk)."""
    q, k, v = randn(B, H, T, d_f, seed=1), randn(B, H, T, d_f, seed=2), randn(B, H, T, d_v, seed=3)
    upstream = randn(B, H, T, d_v, seed=4).double()
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = taylor_linear_attention(*leaves, chunk=chunk)
    (out.double() * upstream).sum().backward()
    ref_leaves = [x.double().requires_grad_(True) for x in (q, k, v)]
    ref = explicit(*ref_leaves)
    (ref * upstream).sum().backward()
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    for name, x, r in zip("qkv", leaves, ref_leaves):
        torch.testing.assert_close(x.grad.double(), r.grad, atol=1e-4, rtol=1e-4, msg=lambda m: f"grad {name}: {m}")


def test_feature_map_gives_the_taylor_weights():
    q, k = randn(3, 7, 16, seed=1), randn(3, 9, 16, seed=2)
    fq, fk = taylor_features(q.double()), taylor_features(k.double())
    assert fq.shape[-1] == 1 + 16 + 16 * 16
    s = q.double() @ k.double().transpose(-1, -2) / 4.0
    torch.testing.assert_close(fq @ fk.transpose(-1, -2), 1 + s + s * s / 2)
    torch.testing.assert_close(taylor_weights(q, k).double(), 1 + s + s * s / 2, atol=1e-5, rtol=1e-6)
    assert (1 + s + s * s / 2).min() >= 0.5  # the denominator bound the module relies on (no epsilon)


def test_bf16_inputs_are_computed_in_float32():
    q, k, v = (randn(1, 2, 33, 8, seed=i).bfloat16() for i in range(3))
    out = taylor_linear_attention(q, k, v, chunk=8)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), explicit(q.double(), k.double(), v.double()), atol=2e-2, rtol=2e-2)


# ---------------------------------------------------------------------------------------------------------
# the module


def brute_module(cfg, params, a):
    """The whole linear-attention layer in float64 from its parameters, one (i, j) pair at a time: fused
    query_key_value (HF layout), no rotary on q, k; features q W_q^T, k W_k^T; rotary (GPT-NeoX rotate-half, its
    own frequencies) on the first rotary_ndims feature dims; weights 1 + s + s^2/2; dense."""
    B, T, _ = a.shape
    H, D, r, base = cfg.num_attention_heads, cfg.head_dim, cfg.rotary_ndims, cfg.rotary_emb_base
    qkv = (a @ params["query_key_value.weight"].T + params["query_key_value.bias"]).view(B, T, H, 3, D)
    fq, fk = qkv[..., 0, :] @ params["feature_q.weight"].T, qkv[..., 1, :] @ params["feature_k.weight"].T
    v = qkv[..., 2, :]

    def rotate(x, t):  # x (..., d_f) at position t
        half = r // 2
        ang = torch.tensor([t * base ** (-2.0 * m / r) for m in range(half)], dtype=x.dtype)
        x1, x2 = x[..., :half], x[..., half:r]
        return torch.cat((x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin(), x[..., r:]), -1)

    d_f = fq.shape[-1]
    out = torch.zeros(B, T, H, D, dtype=a.dtype)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                qi = rotate(fq[b, i, h], i)
                num, den = torch.zeros(D, dtype=a.dtype), torch.zeros((), dtype=a.dtype)
                for j in range(i + 1):
                    s = torch.dot(qi, rotate(fk[b, j, h], j)) / math.sqrt(d_f)
                    weight = 1 + s + s * s / 2
                    num, den = num + weight * v[b, j, h], den + weight
                out[b, i, h] = num / den
    return out.reshape(B, T, H * D) @ params["dense.weight"].T + params["dense.bias"]


def randomized(mod, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in mod.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (p.shape[-1] ** -0.5 if name.endswith("weight") else 0.5))
    return mod


def rotary(cfg, T):
    return RotaryEmbedding(cfg.rotary_ndims, cfg.rotary_emb_base)(T, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("impl", ["reference", "sdpa"])
@pytest.mark.parametrize("H,d_h,d_f,T", [(4, 16, 16, 11), (2, 32, 9, 9), (1, 64, 16, 7)])
def test_module_matches_brute_force(impl, H, d_h, d_f, T):
    cfg = attention_config("linear", impl, H=H, d_h=d_h, linear_feature_dim=d_f)
    assert cfg.rotary_ndims <= d_f  # the brute force rotates the first rotary_ndims feature dims
    mod = randomized(build_attention(cfg, 0))
    a = randn(2, T, cfg.hidden_size, seed=5)
    cos, sin = rotary(cfg, T)
    a1 = a.clone().requires_grad_(True)
    out = mod(a1, cos, sin)
    upstream = randn(*out.shape, seed=6).double()
    (out.double() * upstream).sum().backward()
    params = {n: p.detach().double().requires_grad_(True) for n, p in mod.named_parameters()}
    a2 = a.double().requires_grad_(True)
    ref = brute_module(cfg, params, a2)
    (ref * upstream).sum().backward()
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(a1.grad.double(), a2.grad, atol=2e-5, rtol=1e-4)
    for name, p in mod.named_parameters():
        torch.testing.assert_close(p.grad.double(), params[name].grad, atol=5e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_feature_rotary_keeps_the_highest_frequencies_when_features_are_fewer():
    """rotary_ndims 16 on 6 features: the 3 highest of the model's frequencies, each pairing dims m and m + 3."""
    cos, sin = RotaryEmbedding(16, 10000)(9, torch.float32, torch.device("cpu"))
    cf, sf = feature_rotary(cos, sin, 6)
    inv_freq = 10000 ** (-torch.arange(0, 16, 2).float() / 16)
    angles = torch.arange(9).float()[:, None] * inv_freq[None, :3]
    torch.testing.assert_close(cf, torch.cat([angles.cos()] * 2, -1))
    torch.testing.assert_close(sf, torch.cat([angles.sin()] * 2, -1))
    assert feature_rotary(cos, sin, 16)[0] is cos and feature_rotary(cos, sin, 17)[0] is cos


def test_the_weights_depend_on_relative_position_only():
    """RoPE is applied to the features: the same query and key content at (i, j) and (i + t, j + t) get the same
    weight, so the layer's output at a position does not depend on where the sequence starts."""
    cfg = attention_config("linear", "reference", H=2, d_h=32, linear_feature_dim=8)
    mod = randomized(build_attention(cfg, 0))
    a = randn(1, 5, cfg.hidden_size, seed=7)
    cos, sin = rotary(cfg, 12)
    # the same 5 tokens at positions 0..4 and at positions 7..11 (the rotary rows of those positions)
    out0 = mod(a, cos[:5], sin[:5])
    out7 = mod(a, cos[7:], sin[7:])
    torch.testing.assert_close(out0, out7, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("keys", [{}, {"fused_qkv": False, "num_kv_heads": 2}])
def test_decoding_steps_equal_the_full_forward(keys):
    """The running sums (S, z), one token at a time, give the full forward's outputs; the state does not grow."""
    cfg = model_config(num_layers=2, hidden_size=64, num_attention_heads=4, attention_type="linear",
                       linear_feature_dim=8, **keys)
    mod = randomized(build_attention(cfg, 1)).eval()
    T = 13
    a = randn(2, T, cfg.hidden_size, seed=8)
    cos, sin = rotary(cfg, T)
    with torch.no_grad():
        full = mod(a, cos, sin)
        state, outs = None, []
        for t in range(T):
            out, state = mod.step(a[:, t:t + 1], cos[t:t + 1], sin[t:t + 1], state)
            outs.append(out)
            assert sum(x.numel() for x in state) == 2 * mod.state_numbers()  # batch of 2
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# paths and costs


def test_triton_path_without_cuda_is_a_clear_error():
    from neox_dar.attention.triton_bridge import AttentionImplError

    cfg = attention_config("linear", "triton")
    mod = build_attention(cfg, 0)
    a = randn(1, 5, cfg.hidden_size)
    with pytest.raises(AttentionImplError, match="needs a CUDA device"):
        mod(a, *rotary(cfg, 5))


def test_auto_takes_flas_kernel_only_where_it_takes_the_features_and_triton_refuses_wider_ones():
    """fla's kernel holds d_f <= 16: ``auto`` on CUDA runs it up to 16 and the PyTorch path above (it ran fla and
    failed at the first step); an explicit ``triton`` with d_f 32 is a config error naming linear_feature_dim."""
    from neox_dar.config import ConfigError

    for d_f, path in ((16, "triton"), (32, "sdpa")):
        mod = build_attention(attention_config("linear", "auto", linear_feature_dim=d_f), 0)
        assert mod.resolved_impl(torch.device("cuda")) == path and mod.resolved_impl(torch.device("cpu")) == "sdpa"
    with pytest.raises(ConfigError, match="'linear_feature_dim'.*32 \\(must be <= 16 with attention_impl: triton"):
        attention_config("linear", "triton", linear_feature_dim=32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash-linear-attention's kernels run on CUDA only (its "
                    "Triton code does not run under the CPU interpreter)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,H,T,d_f,d_v", [(2, 4, 300, 16, 64), (1, 8, 2048, 16, 64), (2, 2, 77, 8, 32)])
def test_fla_kernel_equals_the_pytorch_path(B, H, T, d_f, d_v, dtype):
    pytest.importorskip("fla", reason="flash-linear-attention (fla-core) is not installed")
    from neox_dar.attention.linear import fla_linear_attention

    q, k, v = (randn(B, H, T, n, seed=i, scale=0.5).cuda().to(dtype) for i, n in enumerate((d_f, d_f, d_v)))
    upstream = randn(B, H, T, d_v, seed=9).cuda()
    grads = []
    for fn in (fla_linear_attention, taylor_linear_attention):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out = fn(*leaves)
        (out.float() * upstream).sum().backward()
        grads.append((out.float(), *(x.grad.float() for x in leaves)))
    tol = dict(atol=2e-3, rtol=2e-3) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    for name, got, want in zip(("out", "dq", "dk", "dv"), *grads):
        scale = want.abs().max().item()
        torch.testing.assert_close(got / scale, want / scale, **tol, msg=lambda m: f"{name}: {m}")


def test_costs_state_and_flops():
    cfg = model_config(num_layers=2, hidden_size=512, num_attention_heads=8, attention_type="linear",
                       linear_feature_dim=16, vocab_size=256)
    with torch.device("meta"):
        model = build_model(cfg)
    layer = model.attention_modules()[0]
    assert isinstance(layer, LinearAttention)
    D = 1 + 16 + 256
    assert layer.state_numbers() == 8 * D * (64 + 1)
    for C in (1, 100, 2048):  # per token of a C-token context: the fixed state divided by C
        assert layer.kv_cache_per_token(C) * C == pytest.approx(8 * D * 65)
    assert layer.attended_keys(2048) == 0
    per_layer = 3 * 8 * (2 * D * 64 + D + 2 * D * 64 + 2 * D) + 12 * 64 * 16 * 7
    assert flops_per_token(model, 2048)["attention"] == pytest.approx(2 * per_layer)
    assert sum(p.numel() for n, p in layer.named_parameters() if "feature_" in n) == 2 * 64 * 16


def test_describe_counts_the_float32_state_in_a_bf16_model():
    """The state is float32 whatever the model's dtype, so a bf16 model's cache holds 4 bytes per state number, as
    ``describe`` now says (it counted 2: half the cache of a linear layer), next to bf16 MSWA layers (2 bytes)."""
    from types import SimpleNamespace

    from neox_dar.describe import kv_cache_bytes_per_token

    cfg = model_config(num_layers=12, hidden_size=64, num_attention_heads=4, attention_type="mswa", window_size=4,
                       hybrid="mswa_linear", linear_feature_dim=4, vocab_size=256)
    model = build_model(cfg).to(torch.bfloat16)
    for context in (3, 20):
        cache = model.new_cache([context - 1], 1)
        per_layer = kv_cache_bytes_per_token(SimpleNamespace(model=cfg), context, "bf16")
        assert cache.nbytes() == pytest.approx(sum(per_layer) * context, rel=1e-12)
        linear = [b for b, m in zip(per_layer, model.attention_modules()) if isinstance(m, LinearAttention)]
        assert len(linear) == 4 and linear[0] * context == 4 * model.attention_modules()[0].state_numbers()
