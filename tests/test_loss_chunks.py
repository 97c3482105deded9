"""The loss computed chunk by chunk from the final hidden states (neox_dar.loss) equals the loss of the full float32
logits, value and gradients, on every path that computes one: training (micro_batch_loss, every parameter's
gradient, tied and untied heads, SFT label masks, AHA's auxiliary loss alongside), validation (evaluate, no grad),
rolling evaluation (score_documents), a DimPO-projected model, and an output layer wrapped by a LoRA adapter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neox_dar.config import load_config
from neox_dar.evaluation.scoring import score_documents
from neox_dar.loss import IGNORE, chunk_rows, linear_cross_entropy_sum, linear_token_nll
from neox_dar.model import OutputLayer, build_model
from neox_dar.training.batches import lm_loss, micro_batch_loss
from neox_dar.training.distributed import DistInfo
from neox_dar.training.validation import evaluate

from builders import ROOT, TINY, attention_config

T = 24


def reference_loss(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss as it was computed before the chunks: every position's logits, a float32 copy, cross-entropy."""
    return lm_loss(model(x), y)


def batch(vocab: int, B: int = 3, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (B, T + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:].clone()


def sft_mask(y: torch.Tensor) -> torch.Tensor:
    """Labels as a conversation batch has them: a prompt and right padding not counted (-100)."""
    y = y.clone()
    y[:, :7] = IGNORE
    y[0, 15:] = IGNORE
    y[-1, :] = IGNORE  # a row with no answer at all
    return y


def tiny(**keys):
    cfg = load_config(TINY, overrides=[f"{k}={v}" for k, v in {"seq_length": T, **keys}.items()]).model
    torch.manual_seed(0)
    return build_model(cfg).train(), cfg


def grads(model, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_training_loss(model, x, y, aux: bool = False):
    """micro_batch_loss (chunked) and the full-logits loss: equal values, and equal gradients for every parameter."""
    torch.manual_seed(5)
    ref = reference_loss(model, x, y)
    ref_aux = model.aux_loss() if aux else 0.0
    ref_grads = grads(model, ref + ref_aux)
    torch.manual_seed(5)
    ours = micro_batch_loss(model, x, y)
    ours_aux = model.aux_loss() if aux else 0.0
    ours_grads = grads(model, ours + ours_aux)
    assert ours.dtype == torch.float32 and ours.shape == ()
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    if aux:
        assert ref_aux.item() > 0
        torch.testing.assert_close(ours_aux, ref_aux, rtol=1e-6, atol=0)
    assert ours_grads.keys() == ref_grads.keys() and len(ours_grads) == len(list(model.parameters()))
    for name, g in ref_grads.items():
        torch.testing.assert_close(ours_grads[name], g, rtol=1e-4, atol=1e-7, msg=name)


# ---- the function itself ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 5, 16, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_linear_cross_entropy_sum_equals_full_logits(rows, dtype):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(4, 9, 12, dtype=dtype, generator=g, requires_grad=True)
    weight = torch.randn(77, 12, dtype=dtype, generator=g, requires_grad=True)
    targets = torch.randint(0, 77, (4, 9), generator=g)
    targets[1, 3:] = IGNORE
    ref = F.cross_entropy(F.linear(hidden, weight).float().reshape(-1, 77), targets.reshape(-1), ignore_index=IGNORE,
                          reduction="sum")
    ours = linear_cross_entropy_sum(hidden, weight, targets, rows=rows)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-5)
    scale = torch.tensor(0.37)  # a mean's 1/count, a loss scale: the backward scales the precomputed gradients
    ref_grads = torch.autograd.grad(ref * scale, (hidden, weight))
    our_grads = torch.autograd.grad(ours * scale, (hidden, weight))
    for ours_g, ref_g in zip(our_grads, ref_grads):
        assert ours_g.dtype == dtype
        torch.testing.assert_close(ours_g, ref_g, rtol=1e-5, atol=1e-6)
    assert (our_grads[0][1, 3:] == 0).all()  # an ignored position gets no gradient
    nll = linear_token_nll(hidden, weight, targets, rows=rows)
    ref_nll = F.cross_entropy(F.linear(hidden, weight).float().transpose(1, 2), targets, ignore_index=IGNORE,
                              reduction="none")
    assert nll.shape == targets.shape and not nll.requires_grad and (nll[1, 3:] == 0).all()
    torch.testing.assert_close(nll, ref_nll, rtol=1e-6, atol=1e-5)


def test_bfloat16_gradients_within_its_rounding():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(40, 16, generator=g).bfloat16().requires_grad_()
    weight = torch.randn(300, 16, generator=g).bfloat16().requires_grad_()
    targets = torch.randint(0, 300, (40,), generator=g)
    ref = F.cross_entropy(F.linear(hidden, weight).float(), targets, reduction="sum")
    ours = linear_cross_entropy_sum(hidden, weight, targets, rows=7)
    torch.testing.assert_close(ours, ref, rtol=1e-3, atol=1e-3)
    for ours_g, ref_g in zip(torch.autograd.grad(ours, (hidden, weight)), torch.autograd.grad(ref, (hidden, weight))):
        assert ours_g.dtype == torch.bfloat16
        torch.testing.assert_close(ours_g.float(), ref_g.float(), rtol=2e-2, atol=2e-2)


def test_only_what_needs_a_gradient_gets_one():
    hidden, weight = torch.randn(6, 4, requires_grad=True), torch.randn(10, 4)
    targets = torch.arange(6)
    (g,) = torch.autograd.grad(linear_cross_entropy_sum(hidden, weight, targets, rows=4), (hidden,))
    ref = F.cross_entropy(F.linear(hidden, weight), targets, reduction="sum")
    torch.testing.assert_close(g, torch.autograd.grad(ref, (hidden,))[0])
    with torch.no_grad():
        assert not linear_cross_entropy_sum(hidden, weight, targets).requires_grad
    nothing = torch.full((6,), IGNORE)
    loss = linear_cross_entropy_sum(hidden, weight, nothing)
    assert loss.item() == 0 and (torch.autograd.grad(loss, (hidden,))[0] == 0).all()


def test_chunks_hold_about_32_mib_of_logits():
    assert chunk_rows(50304) == 166 and chunk_rows(257) == 32640 and chunk_rows(10 ** 9) == 1


# ---- training and validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("keys", [{}, {"no_weight_tying": "false"}], ids=["untied", "tied"])
def test_training_loss_and_gradients_equal_full_logits(keys, one_thread):
    model, cfg = tiny(**keys)
    assert isinstance(model.head, OutputLayer)
    assert (model.head.weight is model.decoder.embed.weight) == (not cfg.no_weight_tying)
    x, y = batch(cfg.vocab_size)
    assert_same_training_loss(model, x, y)


def test_sft_label_masks(one_thread):
    model, cfg = tiny()
    x, y = batch(cfg.vocab_size)
    assert_same_training_loss(model, x, sft_mask(y))
    nothing = torch.full_like(y, IGNORE)
    assert micro_batch_loss(model, x, nothing).item() == 0.0 == reference_loss(model, x, nothing).item()


def test_aha_aux_loss_unaffected(one_thread):
    cfg = attention_config("aha", num_layers=2, aha_l1_coef=3e-2)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    x, y = batch(cfg.vocab_size, B=3)
    assert_same_training_loss(model, x, sft_mask(y), aux=True)


def test_validation_equals_full_logits(one_thread, tmp_path):
    """evaluate() (no grad) on a 1-rank group against the full-logits loss of the same micro-batches."""
    import torch.distributed as dist

    cfg = load_config(TINY, overrides=[f"seq_length={T}", "train_micro_batch_size_per_gpu=2", "train_batch_size=2",
                                       "eval_iters=2", f"save={tmp_path}"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    rng = np.random.default_rng(0)
    valid_ds = [rng.integers(0, cfg.model.vocab_size, T + 1) for _ in range(4)]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        result = evaluate(model, valid_ds, cfg, DistInfo(0, 1, 0, torch.device("cpu")), 0)
    finally:
        dist.destroy_process_group()
    assert model.training  # evaluate leaves the model training again
    model.eval()
    with torch.no_grad():
        ref = [reference_loss(model, torch.from_numpy(np.stack(valid_ds[i:i + 2]))[:, :-1],
                              torch.from_numpy(np.stack(valid_ds[i:i + 2]))[:, 1:]) for i in (0, 2)]
    assert result["valid_loss"] == pytest.approx(torch.stack(ref).mean().item(), rel=1e-6)


# ---- evaluation --------------------------------------------------------------------------------------------


def assert_same_scores(model, documents, **kw):
    chunked = score_documents(model, documents, 16, 0, progress=False, **kw)
    full = score_documents(lambda ids: model(ids), documents, 16, 0, progress=False, **kw)  # the logits path
    assert chunked.tokens == full.tokens and chunked.windows == full.windows
    assert chunked.nll == pytest.approx(full.nll, rel=1e-6)
    return chunked


@pytest.mark.parametrize("stride", [None, 4])
def test_rolling_evaluation_equals_full_logits(stride, one_thread):
    model, cfg = tiny()
    model.eval()
    rng = np.random.default_rng(0)
    documents = [rng.integers(0, cfg.vocab_size, n) for n in (40, 3, 17, 0, 33)]  # windows of unequal length: padding
    scores = assert_same_scores(model, documents, stride=stride, batch_size=3)
    assert scores.nll[3] == 0 and all(v > 0 for i, v in enumerate(scores.nll) if i != 3)


def test_dimpo_projected_model_scores_equal_full_logits(one_thread):
    from neox_dar.dimpo.apply import projected_config

    base = load_config(TINY, overrides=[f"seq_length={T}"]).model
    torch.manual_seed(0)
    model = build_model(projected_config(base, [1], 4)).eval()
    assert model.attention_modules()[1].name == "dimpo"
    rng = np.random.default_rng(1)
    assert_same_scores(model, [rng.integers(0, base.vocab_size, n) for n in (30, 9)], batch_size=2)
    x, y = batch(base.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(micro_batch_loss(model, x, y), reference_loss(model, x, y), rtol=1e-5, atol=1e-6)


def test_lora_wrapped_output_layer(one_thread):
    """With a LoRA adapter around the output layer the chunks run through the adapter module (checkpointed)."""
    from peft import LoraConfig, inject_adapter_in_model

    model, cfg = tiny()
    inject_adapter_in_model(LoraConfig(r=2, lora_alpha=4, target_modules=["embed_out"], init_lora_weights=False),
                            model)
    assert not isinstance(model.head, OutputLayer)
    model.requires_grad_(True)  # the base weights too, so that every gradient is compared
    x, y = batch(cfg.vocab_size)
    assert_same_training_loss(model, x, sft_mask(y))
    model.eval()
    with torch.no_grad():
        nll = model(x, y, reduction="none")
        ref = F.cross_entropy(model(x).float().transpose(1, 2), y, reduction="none")
    torch.testing.assert_close(nll, ref, rtol=1e-5, atol=1e-5)
