"""The tiny model (configs/tiny.yml) with ``attention_impl: triton`` against ``reference``: logits and gradients.

Runs the kernels through the attention variants (neox_dar/attention) exactly as training does: on CUDA when
available (and ``TRITON_INTERPRET`` unset), else in Triton's CPU interpreter. float32 everywhere; tolerances are
relative Frobenius errors: logits 1e-5, every parameter gradient 1e-4 (the reference path is float32 too).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

from neox_dar.config import load_config  # noqa: E402
from neox_dar.model import build_model  # noqa: E402

TINY = Path(__file__).resolve().parent.parent / "configs" / "tiny.yml"
DEVICE = torch.device("cuda" if ON_GPU else "cpu")


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x - ref).double().norm() / ref.double().norm().clamp_min(1e-30)).item()


def run(model, ids):
    """Logits and the gradients of the LM loss plus the variant's aux loss (AHA's router term)."""
    model.zero_grad(set_to_none=True)
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    aux = model.aux_loss()
    (loss + (aux if aux is not None else 0.0)).backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.filterwarnings("ignore:MSWA. num_layers")
@pytest.mark.parametrize("attention_type,window", [("dar", 5), ("mswa", 8), ("aha", 6)])
def test_tiny_model_triton_matches_reference(attention_type, window):
    torch.manual_seed(0)
    overrides = (f"attention_type={attention_type}", f"window_size={window}", "precision=fp32")
    ref_cfg = load_config(TINY, overrides=(*overrides, "attention_impl=reference"))
    tri_cfg = load_config(TINY, overrides=(*overrides, "attention_impl=triton"))
    ref_model = build_model(ref_cfg).to(DEVICE)
    tri_model = build_model(tri_cfg).to(DEVICE)
    tri_model.load_state_dict(ref_model.state_dict())
    ids = torch.randint(0, ref_cfg.vocab_size, (2, 35), device=DEVICE)
    ref_logits, ref_grads = run(ref_model, ids)
    tri_logits, tri_grads = run(tri_model, ids)
    assert rel(tri_logits, ref_logits) < 1e-5
    assert ref_grads.keys() == tri_grads.keys() and len(ref_grads) > 0
    if attention_type == "aha":
        router = [n for n in ref_grads if "router" in n]
        assert router and all(ref_grads[n].abs().sum() > 0 for n in router)
    bad = {n: rel(tri_grads[n], g) for n, g in ref_grads.items() if not rel(tri_grads[n], g) < 1e-4}
    assert not bad, f"{attention_type}: gradients differ: {bad}"
