"""Edge cases and choices of the attention variants, pinned (see docs/attention.md)."""

from __future__ import annotations

import warnings

import pytest
import torch
from builders import attention_config, model_config

from neox_dar.attention import build_attention
from neox_dar.attention.base import RotaryEmbedding
from neox_dar.attention.dar import dar_reference, dar_sdpa
from neox_dar.attention.masks import masked_attention, window_mask
from neox_dar.attention.windowed import mean_attended_keys
from neox_dar.config import Config
from neox_dar.families import FAMILIES
from neox_dar.model import build_model, flops_per_token, init_std
from neox_dar.variants import mswa_window_table
from neox_dar.variants.mswa import window_budget

IMPLS = ["reference", "sdpa"]

pytestmark = pytest.mark.usefixtures("one_thread")


def randomized(mod, seed=0):
    """Random weights (unit-scale outputs) and biases, so equalities are not trivial."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in mod.named_parameters():
            scale = p.shape[-1] ** -0.5 if name.endswith("weight") else 0.5
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return mod


def inputs(cfg, B=2, T=13, seed=1):
    a = torch.randn(B, T, cfg.hidden_size, generator=torch.Generator().manual_seed(seed))
    cos, sin = RotaryEmbedding(cfg.rotary_ndims, cfg.rotary_emb_base)(T, torch.float32, a.device)
    return a, cos, sin


def twin(src, attention_type, impl, **keys):
    """A module of another variant holding ``src``'s shared parameters (query_key_value, dense)."""
    cfg = attention_config(attention_type, impl, H=src.num_heads, d_h=src.head_dim, **keys)
    mod = build_attention(cfg, src.layer_idx)
    mod.load_state_dict(src.state_dict(), strict=False)
    return mod


# ---------------------------------------------------------------------------------------------------------
# DAR and uniform


@pytest.mark.parametrize("impl", IMPLS)
def test_dar_with_window_0_is_uniform(impl):
    dar = randomized(build_attention(attention_config("dar", impl, window_size=0, dar_d_down=7), 0))
    uni = build_attention(attention_config("uniform", impl, dar_d_down=7), 0)
    uni.load_state_dict(dar.state_dict())
    assert dar.window == 0 and uni.window == 0
    a, cos, sin = inputs(attention_config("dar", impl))
    torch.testing.assert_close(dar(a, cos, sin), uni(a, cos, sin), atol=0, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("window", [13, 20])
def test_dar_with_window_at_least_T_is_vanilla(impl, window):
    cfg = attention_config("dar", impl, window_size=window)
    dar = randomized(build_attention(cfg, 0))
    van = twin(dar, "vanilla", impl)
    a, cos, sin = inputs(cfg, T=13)
    out = dar(a, cos, sin)
    torch.testing.assert_close(out, van(a, cos, sin), atol=1e-5, rtol=1e-5)
    out.square().sum().backward()
    assert dar.dar_down.weight.grad.abs().max() == 0 and dar.dar_up.weight.grad.abs().max() == 0


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("attention_type,window", [("dar", 3), ("dar", 1), ("uniform", 0)])
def test_dar_identity_bottleneck_is_vanilla(impl, attention_type, window):
    cfg = attention_config(attention_type, impl, window_size=window, dar_d_down=64)
    dar = randomized(build_attention(cfg, 0))
    with torch.no_grad():
        dar.dar_down.weight.copy_(torch.eye(64))
        dar.dar_up.weight.copy_(torch.eye(64))
    a, cos, sin = inputs(cfg)
    torch.testing.assert_close(dar(a, cos, sin), twin(dar, "vanilla", impl)(a, cos, sin), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", [dar_reference, dar_sdpa])
def test_dar_window_1_uses_only_itself_on_the_local_path(fn):
    g = torch.Generator().manual_seed(2)
    q, kl, vl, kg, vg = (torch.randn(1, 2, 9, 16, generator=g).requires_grad_(True) for _ in range(5))
    i = 6
    fn(q, kl, vl, kg, vg, 1)[:, :, i].sum().backward()
    for t in (kl, vl):  # local path: only j = i
        assert t.grad[:, :, i].abs().min() > 0
        assert t.grad[:, :, [j for j in range(9) if j != i]].abs().max() == 0
    for t in (kg, vg):  # global path: every j < i, never itself or the future
        assert t.grad[:, :, :i].abs().amin(dim=-1).min() > 0
        assert t.grad[:, :, i:].abs().max() == 0


def family_attention_config(family: str, **keys):
    """A small DAR config of ``family``'s attention: its fixed settings, biases on, and (besides GPT-NeoX's fused
    layout) two key/value heads for four query heads."""
    fixed = {k: v for k, v in FAMILIES[family].fixed.items() if k in ("fused_qkv", "qk_norm", "rotary_pct")}
    kv = {} if family == "gpt_neox" else {"num_kv_heads": 2}
    return attention_config("dar", window_size=2, model_family=family, qkv_bias=True, **fixed, **kv, **keys)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_dar_global_kv_uses_the_same_key_value_weights_bias_and_norm(family):
    """``global_kv`` folds ``dar_up`` into the key/value weights, ``(W_kv W_up) dar_down(a)``: the keys and values
    of ``h' = dar_up(dar_down(a))`` through the layer's own projections (fused GPT-NeoX rows, or k_proj/v_proj with
    grouped-query heads), bias and key norm, up to float32 rounding."""
    cfg = family_attention_config(family)
    dar = randomized(build_attention(cfg, 0))
    a, cos, sin = inputs(cfg)
    k_glob, v_glob = dar.global_kv(a, cos, sin)
    h2 = dar.dar_up(dar.dar_down(a))
    _, k_expect, v_expect = dar.split_heads(h2, cos, sin)  # the full pass (q discarded)
    torch.testing.assert_close(k_glob, k_expect)
    torch.testing.assert_close(v_glob, v_expect)


def test_dar_global_kv_calls_a_wrapped_projection_on_the_bottleneck():
    """A projection that is not a plain Linear (peft's LoRA layer adds an adapter's product) is called on
    ``dar_up(dar_down(a))``, so its extra path reaches the global keys and values too."""

    class Shifted(torch.nn.Module):  # stands in for a LoRA layer: the base Linear plus a path of its own
        def __init__(self, base):
            super().__init__()
            self.base = base

        def forward(self, x):
            return self.base(x) + 1.0

    cfg = family_attention_config("llama")
    dar = randomized(build_attention(cfg, 0))
    a, cos, sin = inputs(cfg)
    k_plain, v_plain = dar.global_kv(a, cos, sin)
    dar.v_proj = Shifted(dar.v_proj)
    k_glob, v_glob = dar.global_kv(a, cos, sin)
    torch.testing.assert_close(k_glob, k_plain)
    torch.testing.assert_close(v_glob, v_plain + 1.0)


# ---------------------------------------------------------------------------------------------------------
# SWA


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("window", [13, 100])
def test_swa_with_window_at_least_T_is_vanilla(impl, window):
    cfg = attention_config("swa", impl, window_size=window)
    swa = randomized(build_attention(cfg, 0))
    a, cos, sin = inputs(cfg, T=13)
    torch.testing.assert_close(swa(a, cos, sin), twin(swa, "vanilla", impl)(a, cos, sin), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_swa_window_1_attends_only_to_itself(impl):
    cfg = attention_config("swa", impl, window_size=1)
    swa = randomized(build_attention(cfg, 0))
    a, cos, sin = inputs(cfg)
    q, k, v = swa.split_heads(a, cos, sin)
    torch.testing.assert_close(swa.attend(q, k, v, a, cos, sin), v, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# MSWA

TABLE_1 = [  # MSWA paper Table 1: multiples of w by layer quarter (rows) and head quarter (columns)
    [1 / 16, 1 / 8, 1 / 4, 1 / 2],
    [1 / 8, 1 / 4, 1 / 2, 1],
    [1 / 4, 1 / 2, 1, 2],
    [1 / 2, 1, 2, 4],
]


def paper_quarter(index_1_based, n):
    """Table 1's row/column: the quarter (0, n/4], (n/4, n/2], (n/2, 3n/4], (3n/4, n] holding the index."""
    return next(q for q in range(4) if index_1_based <= (q + 1) * n / 4)


@pytest.mark.parametrize("L", [4, 6, 8, 12, 24])
@pytest.mark.parametrize("H", [4, 8, 12, 16])
def test_mswa_table_follows_the_interval_rule_and_table_1(L, H):
    """Every window is Table 1's entry for the quarters (0, n/4], (n/4, n/2], ... holding the 1-based layer and head
    indices (SPEC: g = ceil(4 i / L) - 1, c = ceil(4 j / H) - 1), also where L or H does not divide by 4."""
    w = 128
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = mswa_window_table(attention_config("mswa", H=H, num_layers=L, window_size=w))
    assert len(table) == L and all(len(row) == H for row in table)
    for layer in range(L):
        for head in range(H):
            assert table[layer][head] == w * TABLE_1[paper_quarter(layer + 1, L)][paper_quarter(head + 1, H)]
    assert {table[0][0], table[-1][-1]} == {w // 16, 4 * w}


def test_mswa_six_layers_use_the_paper_intervals():
    """Pythia-70M's 6 layers: Table 1's 1-based intervals (0, 1.5], (1.5, 3], (3, 4.5], (4.5, 6] give layer groups
    0,1,1,2,3,3 (the former floor(4 l / L) rule gave 0,0,1,2,2,3, 0.78x SWA's window budget; now 0.98x)."""
    cfg = attention_config("mswa", H=8, num_layers=6, window_size=128)
    table = mswa_window_table(cfg)
    assert [row[4] for row in table] == [32, 64, 64, 128, 256, 256]  # head group 2: w_l itself
    assert window_budget(cfg) == pytest.approx(15 / 16 * (1 / 4 + 1 / 2 + 1 / 2 + 1 + 2 + 2) / 6)


@pytest.mark.parametrize("L,H,budget", [(4, 4, 225 / 256), (12, 8, 225 / 256), (6, 6, None)])
def test_mswa_window_budget_relative_to_swa(L, H, budget):
    cfg = attention_config("mswa", H=H, num_layers=L, window_size=128)
    table = mswa_window_table(cfg)
    assert window_budget(cfg) == pytest.approx(sum(map(sum, table)) / (L * H * 128))
    if budget is not None:  # the paper's Eq. 11 when both divide by 4: (15/16)^2
        assert window_budget(cfg) == pytest.approx(budget)


@pytest.mark.parametrize("order,progression,first,last", [
    ("decreasing", "geometric", [64, 128, 256, 512], [8, 16, 32, 64]),  # Table 6: layer allocation reversed
    ("increasing", "arithmetic", [32, 48, 64, 80], [80, 120, 160, 200]),  # Table 6: factors 1/2, 3/4, 1, 5/4
])
def test_mswa_table_6_ablations(order, progression, first, last):
    cfg = attention_config("mswa", H=4, num_layers=4, window_size=128, mswa_layer_order=order,
                           mswa_progression=progression)
    table = mswa_window_table(cfg)
    assert table[0] == first and table[-1] == last
    if progression == "arithmetic":  # the paper's example: groups {64, 96, 128, 160} at w = 128
        middle = attention_config("mswa", H=4, num_layers=4, window_size=128, mswa_variant="heads",
                                  mswa_progression="arithmetic")
        assert mswa_window_table(middle)[0] == [64, 96, 128, 160]


@pytest.mark.parametrize("variant,first,last", [("heads", [32, 32, 64, 64, 128, 128, 256, 256], None),
                                                ("layers", [32] * 8, [256] * 8)])
def test_mswa_variants(variant, first, last):
    table = mswa_window_table(attention_config("mswa", H=8, num_layers=4, window_size=128, mswa_variant=variant))
    assert table[0] == first
    assert table[-1] == (last or first)


def test_mswa_windows_floor_at_1_and_explicit_table_overrides():
    table = mswa_window_table(attention_config("mswa", H=4, num_layers=4, window_size=8))
    assert table[0] == [1, 1, 2, 4] and table[3] == [4, 8, 16, 32]
    explicit = [[5, 1, 2, 9], [3, 3, 3, 3]]
    cfg = attention_config("mswa", H=4, num_layers=2, window_size=8, mswa_windows=explicit)
    assert mswa_window_table(cfg) == explicit
    assert build_attention(cfg, 1).windows == [3, 3, 3, 3]


def test_mswa_heads_not_divisible_by_4_warn_once_per_model():
    cfg = model_config(num_layers=4, hidden_size=6 * 16, num_attention_heads=6, attention_type="mswa", window_size=32,
                 vocab_size=256)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_model(cfg)
    msgs = [str(w.message) for w in caught if "MSWA" in str(w.message)]
    assert len(msgs) == 1 and "num_attention_heads=6" in msgs[0] and "groups 0,1,1,2,3,3" in msgs[0]


@pytest.mark.parametrize("impl", IMPLS)
def test_mswa_heads_use_their_own_window(impl):
    """Each head of an MSWA layer equals SWA with that head's window."""
    cfg = attention_config("mswa", impl, H=4, num_layers=4, window_size=8)
    mswa = randomized(build_attention(cfg, 3))  # windows 4, 8, 16, 32
    a, cos, sin = inputs(cfg, T=21)
    q, k, v = mswa.split_heads(a, cos, sin)
    out = mswa.attend(q, k, v, a, cos, sin)
    for h, w in enumerate(mswa.windows):
        expect = masked_attention(q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1], window_mask(21, w))
        torch.testing.assert_close(out[:, h:h + 1], expect, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# AHA


def zero_router_aha(impl, threshold):
    cfg = attention_config("aha", impl, window_size=3, aha_threshold=threshold)
    aha = randomized(build_attention(cfg, 0))
    with torch.no_grad():
        aha.router.weight.zero_()  # s = 0.5 everywhere
    return aha


@pytest.mark.parametrize("impl", IMPLS)
def test_aha_router_forced_high_is_vanilla_and_low_is_swa(impl):
    a, cos, sin = inputs(attention_config("aha"), T=15)
    high = zero_router_aha(impl, 0.4)
    torch.testing.assert_close(high(a, cos, sin), twin(high, "vanilla", impl)(a, cos, sin), atol=1e-5, rtol=1e-5)
    assert torch.all(high.stats["mu_f"] == 1)
    low = zero_router_aha(impl, 0.6)
    swa = twin(low, "swa", impl, window_size=3)
    torch.testing.assert_close(low(a, cos, sin), swa(a, cos, sin), atol=1e-5, rtol=1e-5)
    assert torch.all(low.stats["mu_f"] == 0)


@pytest.mark.parametrize("ste", ["selected", "difference"])
@pytest.mark.parametrize("impl", [*IMPLS, "triton"])
def test_aha_router_gradient_is_the_ste_formula(impl, ste):
    """``selected`` (SPEC): dL/ds = <dL/do, Full> where g = 1 and -<dL/do, Local> where g = 0; ``difference``:
    dL/ds = <dL/do, Full - Local> (plus lambda / (L B T H) from the L1 term in both), computed here in float64 by
    hand and chained through sigmoid and the router's matrix product. q, k, v get the same gradients under both
    rules (the non-selected path never receives one). ``triton`` runs the kernels (Triton's CPU interpreter here)."""
    cfg = attention_config("aha", impl, H=4, window_size=3, aha_l1_coef=0.05, aha_ste=ste)
    aha = randomized(build_attention(cfg, 0), seed=4)
    a, cos, sin = inputs(cfg, B=2, T=11)
    R = torch.randn(2, 11, cfg.hidden_size, generator=torch.Generator().manual_seed(9))
    ((aha(a, cos, sin) * R).sum() + aha.aux_loss).backward()
    assert 0 < aha.stats["mu_f"].mean() < 1

    with torch.no_grad():
        B, T, d = a.shape
        H, D = cfg.num_attention_heads, cfg.head_dim
        a64, w64 = a.double(), aha.router.weight.double()
        s = torch.sigmoid(a64 @ w64.T)  # (B, T, H)
        g = (s > cfg.attention.aha_threshold).transpose(1, 2)  # (B, H, T)
        q, k, v = (x.double() for x in aha.split_heads(a, cos, sin))
        full = masked_attention(q, k, v, window_mask(T, None))
        local = masked_attention(q, k, v, window_mask(T, 3))
        d_o = (R.double() @ aha.dense.weight.double()).view(B, T, H, D).transpose(1, 2)  # dL/d(head outputs)
        if ste == "selected":
            d_g = torch.where(g, (d_o * full).sum(-1), -(d_o * local).sum(-1))
        else:
            d_g = (d_o * (full - local)).sum(-1)
        d_s = d_g.transpose(1, 2) + cfg.attention.aha_l1_coef / (cfg.num_layers * B * T * H)
        d_w = torch.einsum("bth,btd->hd", d_s * s * (1 - s), a64)
    torch.testing.assert_close(aha.router.weight.grad.double(), d_w, atol=1e-5, rtol=1e-4)

    other = build_attention(attention_config("aha", impl, H=4, window_size=3, aha_l1_coef=0.05,
                                    aha_ste="difference" if ste == "selected" else "selected"), 0)
    other.load_state_dict(aha.state_dict())
    ((other(a, cos, sin) * R).sum() + other.aux_loss).backward()
    torch.testing.assert_close(other.query_key_value.weight.grad, aha.query_key_value.weight.grad)
    assert not torch.allclose(other.router.weight.grad, aha.router.weight.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_aha_selected_path_is_the_straight_through_product_bit_for_bit(dtype):
    """SelectedPath gives the value and the gradients of ``o * (1 + (2g - 1) (s - stop_grad(s)))`` exactly, and
    passes ``o``'s gradient through untouched (no gradient to ``s`` when the router is frozen)."""
    from neox_dar.attention.aha import SelectedPath

    gen = torch.Generator().manual_seed(3)
    B, H, T, D = 2, 4, 7, 8
    o = torch.randn(B, H, T, D, generator=gen).to(dtype).requires_grad_()
    s = torch.rand(B, T, H, generator=gen, requires_grad=True)
    g = s > 0.5
    dout = torch.randn(B, H, T, D, generator=gen).to(dtype)
    product = o * (1.0 + ((2.0 * g.float() - 1.0) * (s - s.detach())).transpose(1, 2)[..., None]).to(dtype)
    mine = SelectedPath.apply(o, s, g)
    assert torch.equal(mine, product)
    assert all(torch.equal(x, y) for x, y in zip(torch.autograd.grad(mine, (o, s), dout),
                                                  torch.autograd.grad(product, (o, s), dout)))
    frozen = SelectedPath.apply(o, s.detach(), g)
    (d_o,) = torch.autograd.grad(frozen, o, dout)
    assert torch.equal(d_o, dout)


@pytest.mark.parametrize("layers", [None, [[["aha", "vanilla", "aha"], 1]], [[["vanilla", "vanilla", "aha"], 1]]],
                         ids=["all-aha", "aha-vanilla-aha", "one-aha"])
def test_aha_aux_loss_is_lambda_times_mean_score_over_layers_tokens_heads(layers):
    """The mean is over the AHA layers only: mixed with other layer types (attention_config), the term is
    lambda times the mean of s over the layers that have one. (Before: divided by every layer, so two AHA layers
    of three gave 2/3 of lambda.)"""
    cfg = model_config(num_layers=3, hidden_size=32, num_attention_heads=4, attention_type="aha", window_size=4,
                       vocab_size=256, aha_l1_coef=3e-4, attention_config=layers)
    torch.manual_seed(0)
    model = build_model(cfg)
    seen, aha = [], []
    for l, layer in enumerate(model.gpt_neox.layers):
        if layer.attention.name == "aha":
            aha.append(l)
            layer.attention.register_forward_pre_hook(lambda m, args: seen.append(torch.sigmoid(m.router(args[0]))))
    model(torch.randint(0, 256, (2, 19)))
    expect = 3e-4 * torch.stack(seen).mean()  # (AHA layers, B, T, H) -> one mean
    torch.testing.assert_close(model.aux_loss(), expect, atol=1e-10, rtol=1e-6)
    stats = model.attention_stats()
    assert sorted(stats) == [f"layer{l}/mu_f" for l in aha]
    for l, s in zip(aha, seen):
        torch.testing.assert_close(stats[f"layer{l}/mu_f"], (s > 0.5).float().mean(dim=(0, 1)))


# ---------------------------------------------------------------------------------------------------------
# init, FLOPs, errors


def test_variant_parameters_get_the_input_side_init():
    cfg = model_config(num_layers=2, hidden_size=256, num_attention_heads=4, vocab_size=256, attention_type="dar")
    torch.manual_seed(0)
    att = build_model(cfg).gpt_neox.layers[0].attention
    small = init_std("small_init", cfg)
    assert att.dar_down.weight.std().item() == pytest.approx(small, rel=0.05)
    assert att.dar_up.weight.std().item() == pytest.approx(small, rel=0.05)
    aha = build_model(model_config(num_layers=2, hidden_size=256, num_attention_heads=8, vocab_size=256,
                             attention_type="aha")).gpt_neox.layers[1].attention
    assert aha.router.weight.std().item() == pytest.approx(small, rel=0.1)


@pytest.mark.parametrize("T,w", [(2048, 128), (13, 5), (13, 13), (13, 40), (7, 1)])
def test_mean_attended_keys_counts_the_mask(T, w):
    assert mean_attended_keys(T, w) == pytest.approx(window_mask(T, w).sum().item() / T)
    assert mean_attended_keys(T, None) == pytest.approx(window_mask(T, None).sum().item() / T)


def test_flops_per_token_of_the_variants():
    base = dict(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=256, window_size=32)
    with torch.device("meta"):
        models = {t: build_model(model_config(attention_type=t, **base)) for t in ("vanilla", "dar", "swa", "mswa", "aha")}
    f = {t: flops_per_token(m) for t, m in models.items()}
    assert f["dar"]["attention"] == f["vanilla"]["attention"] + 4 * 12 * 64 ** 2
    assert f["dar"]["params"] == f["vanilla"]["params"] + 6 * 4 * 2 * 64 * 16
    assert f["swa"]["attention"] == pytest.approx(4 * 6 * 2 * 64 * mean_attended_keys(256, 32))
    table = mswa_window_table(models["mswa"].cfg)
    keys = sum(mean_attended_keys(256, w) for row in table for w in row) / 4
    assert f["mswa"]["attention"] == pytest.approx(6 * 2 * 64 * keys)
    assert f["aha"]["attention"] == f["vanilla"]["attention"]  # upper bound: every gate open


def test_triton_on_cpu_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for t in ("dar", "swa", "mswa", "aha"):
        cfg = attention_config(t, "triton", window_size=4, num_layers=4)
        mod = build_attention(cfg, 0)
        a, cos, sin = inputs(cfg)
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            mod(a, cos, sin)
    auto = build_attention(attention_config("dar", "auto", window_size=4), 0)
    assert auto.resolved_impl(torch.device("cpu")) == "sdpa"
    assert auto.resolved_impl(torch.device("cuda")) == "triton"


@pytest.mark.parametrize("key,value,attention_type", [("aha_l1_coef", 1e-3, "dar"), ("aha_threshold", 0.3, "mswa"),
                                                      ("mswa_variant", "heads", "swa"), ("dar_d_down", 8, "aha"),
                                                      ("mswa_windows", [[1, 2, 3, 4]] * 2, "vanilla")])
def test_keys_of_another_variant_warn(key, value, attention_type):
    with pytest.warns(UserWarning, match=f"'{key}' is set but attention_type is '{attention_type}'"):
        Config.from_flat({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "window_size": 4,
                          "attention_type": attention_type, key: value})


@pytest.mark.parametrize("attention_type", ["dar", "uniform", "swa", "mswa", "aha"])
def test_heads_wider_than_the_kernels_take_sdpa_on_auto_and_refuse_triton(attention_type):
    """head_dim 288 (> 256, what the Triton kernels take): auto resolves to sdpa on CUDA too (it resolved to triton,
    and the first forward raised a ValueError traceback), and an explicit triton is a config error naming the key."""
    from neox_dar.config import ConfigError, load_config
    from neox_dar.model import build_meta_model

    wide = ["num_layers=4", "hidden_size=576", "num_attention_heads=2", f"attention_type={attention_type}"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = build_meta_model(load_config(overrides=[*wide, "attention_impl=auto"]).model).attention_modules()[0]
        assert layer.head_dim == 288 and layer.resolved_impl(torch.device("cuda")) == "sdpa"
        with pytest.raises(ConfigError, match=r"'attention_impl' in the command line: 'triton' .*head_dim <= 256"):
            load_config(overrides=[*wide, "attention_impl=triton"])
        narrow = build_meta_model(load_config(overrides=["num_layers=4", "hidden_size=128", "num_attention_heads=2",
                                                         f"attention_type={attention_type}"]).model)
        assert narrow.attention_modules()[0].resolved_impl(torch.device("cuda")) == "triton"
