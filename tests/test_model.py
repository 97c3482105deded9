"""The Pythia model: Hugging Face parity, parameter counts, configs, FLOP counter."""

from pathlib import Path

import pytest
import torch
from builders import model_config
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from neox_dar.config import load_config
from neox_dar.hf import from_hf, to_hf
from neox_dar.model import build_model, count_parameters, flops_per_token, init_std
from neox_dar.tokenizer import DEFAULT_TOKENIZER
from neox_dar.training.engine import checkpoint_blocks

ROOT = Path(__file__).resolve().parents[1]
MODEL_CONFIGS = sorted((ROOT / "configs").glob("*.yml"))
ATTENTION_FRAGMENTS = sorted((ROOT / "configs/attention").glob("*.yml"))


def random_hf(vocab, d, layers, heads, rotary_pct, parallel, max_pos=512):
    torch.manual_seed(vocab + d + layers)
    hc = GPTNeoXConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                       intermediate_size=4 * d, rotary_pct=rotary_pct, max_position_embeddings=max_pos,
                       use_parallel_residual=parallel, tie_word_embeddings=False, hidden_act="gelu")
    model = GPTNeoXForCausalLM(hc).eval()
    with torch.no_grad():  # make biases and norms non-trivial too
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


SHAPES = [  # vocab, d, layers, heads, rotary_pct, parallel residual, T
    (512, 64, 2, 4, 0.25, True, 300),
    (384, 96, 3, 6, 1.0, False, 77),
    (640, 128, 2, 2, 0.25, False, 260),
    (256, 32, 1, 1, 1.0, True, 19),
]


@pytest.mark.parametrize("vocab,d,layers,heads,rot,parallel,T", SHAPES)
def test_logits_match_transformers_through_both_conversions(tmp_path, vocab, d, layers, heads, rot, parallel, T):
    hf = random_hf(vocab, d, layers, heads, rot, parallel)
    hf.save_pretrained(tmp_path / "hf")
    model, cfg = from_hf(tmp_path / "hf")  # Hugging Face -> ours
    assert cfg.rotary_pct == rot and cfg.gpt_j_residual == parallel
    x = torch.randint(0, vocab, (2, T))
    with torch.no_grad():
        ref = hf(x).logits
        ours = model.eval()(x)
    assert (ref - ours).abs().max().item() < 1e-4

    to_hf(model, cfg, tmp_path / "back", DEFAULT_TOKENIZER)  # ours -> Hugging Face (the folder has no tokenizer)
    hf2 = GPTNeoXForCausalLM.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert (hf2(x).logits - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("name, expected", [("pythia-70m", 70_426_624), ("pythia-160m", 162_322_944),
                                            ("pythia-410m", 405_334_016)])
def test_parameter_counts_match_published_sizes(name, expected):
    with torch.device("meta"):
        model = build_model(load_config(ROOT / f"configs/{name}.yml").model)
    assert count_parameters(model)["total"] == expected


@pytest.mark.parametrize("path", MODEL_CONFIGS + ATTENTION_FRAGMENTS, ids=lambda p: p.name)
def test_every_config_resolves_and_builds(path):
    """Model configs alone; attention fragments layered on pythia-70m."""
    base = [] if path in MODEL_CONFIGS else [ROOT / "configs/pythia-70m.yml"]
    cfg = load_config(*base, path).model
    with torch.device("meta"):
        model = build_model(cfg)
    assert count_parameters(model)["total"] > 0


def test_forward_shape_and_aux_loss_default():
    cfg = load_config(ROOT / "configs/tiny.yml").model
    model = build_model(cfg)
    x = torch.randint(0, cfg.vocab_size, (3, 17))
    logits = model(x)
    assert logits.shape == (3, 17, cfg.padded_vocab_size)
    assert model.aux_loss().item() == 0.0


def test_pythia_init_stds():
    cfg = model_config(num_layers=4, hidden_size=256, num_attention_heads=4, vocab_size=1000)
    torch.manual_seed(0)
    model = build_model(cfg)
    small, wang = init_std("small_init", cfg), init_std("wang_init", cfg)
    assert small == pytest.approx((2 / (5 * 256)) ** 0.5) and wang == pytest.approx(2 / (4 * 16))
    layer = model.gpt_neox.layers[0]
    assert layer.attention.query_key_value.weight.std().item() == pytest.approx(small, rel=0.05)
    assert layer.attention.dense.weight.std().item() == pytest.approx(wang, rel=0.05)
    assert layer.mlp.dense_4h_to_h.weight.std().item() == pytest.approx(wang, rel=0.05)
    assert model.embed_out.weight.std().item() == pytest.approx(small, rel=0.05)
    assert torch.all(layer.attention.query_key_value.bias == 0)
    assert torch.all(layer.input_layernorm.weight == 1)


def test_flops_per_token_vanilla():
    cfg = load_config(ROOT / "configs/pythia-70m.yml").model
    with torch.device("meta"):
        model = build_model(cfg)
    f = flops_per_token(model)
    n = count_parameters(model)["non_embedding"]
    assert f["params"] == 6 * n
    assert f["attention"] == 6 * 2 * 512 * 6 * (2048 + 1) / 2
    assert f["total"] == f["params"] + f["attention"]


def test_activation_checkpointing_gives_same_gradients():
    """The engine wraps each block (checkpoint_wrapper): same gradients, same state_dict names, and the blocks
    really recompute (the wrapped forward runs twice per step)."""
    cfg = load_config(ROOT / "configs/tiny.yml").model
    torch.manual_seed(0)
    plain = build_model(cfg)
    ckpt = build_model(cfg)
    checkpoint_blocks(ckpt)
    assert list(ckpt.state_dict()) == list(plain.state_dict())
    ckpt.load_state_dict(plain.state_dict())
    calls = []
    ckpt.attention_modules()[0].register_forward_hook(lambda *_: calls.append(1))
    x = torch.randint(0, cfg.vocab_size, (2, 33))
    for m in (plain, ckpt):
        m.train()
        m(x).logsumexp(-1).mean().backward()
    assert len(calls) == 2  # forward, then the recomputation in backward
    grads = ckpt.state_dict(keep_vars=True)
    for n, a in plain.named_parameters():
        torch.testing.assert_close(a.grad, grads[n].grad, msg=n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("per_row", [False, True])
def test_rotary_backward_is_autograd_through_the_formula_bit_for_bit(dtype, per_row):
    """apply_rotary's backward (the inverse turn) gives what autograd through the plain formula gives, exactly;
    positions shared (T, r) or per row (B, 1, T, r); the pass-through dims' gradient untouched; no gradient is
    built without one to compute."""
    from neox_dar.standalone.rotary import Rotary, apply_rotary, rotary_table, rotate

    torch.manual_seed(0)
    B, H, T, D, r = 2, 3, 9, 16, 8
    cos, sin = rotary_table(r, 10000, None, 2 * T, dtype)
    if per_row:  # each row at its own offset, as a left-padded batch decodes
        cos = torch.stack([cos[1:T + 1], cos[4:T + 4]])[:, None]
        sin = torch.stack([sin[1:T + 1], sin[4:T + 4]])[:, None]
    else:
        cos, sin = cos[:T], sin[:T]
    x = torch.randn(B, H, T, D, dtype=dtype, requires_grad=True)
    g = torch.randn(B, H, T, D, dtype=dtype)
    out = apply_rotary(x, cos, sin)
    assert out.grad_fn is not None and "Rotary" in type(out.grad_fn).__name__
    (mine,) = torch.autograd.grad(out, x, g)
    (plain,) = torch.autograd.grad(rotate(x, cos, sin), x, g)
    assert torch.equal(out, rotate(x, cos, sin).detach())
    assert torch.equal(mine, plain)
    assert torch.equal(mine[..., r:], g[..., r:])
    with torch.no_grad():
        assert apply_rotary(x, cos, sin).grad_fn is None
    assert Rotary.apply(x, cos, sin).shape == x.shape
    learned = sin.clone().requires_grad_()  # tables with a gradient of their own: autograd through the formula
    (d_sin,) = torch.autograd.grad(apply_rotary(x, cos, learned), learned, g)
    (want,) = torch.autograd.grad(rotate(x, cos, learned), learned, g)
    assert torch.equal(d_sin, want)
