"""DimPO item 4: applying fitted projections to the last l layers (``dimpo`` attention, ``neox_dar.dimpo apply``,
lm-eval's ``dimpo=FILE,dimpo_layers=l``): W = I at d' = d_h changes nothing, l = 0 changes nothing, the two paths
agree, the applied checkpoint loads everywhere, and its cache shrinks by the paper's accounting."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from builders import FAMILY_PRESETS, TINY_FAMILY_KEYS, config, saved_model

from neox_dar.variants import layer_types
from neox_dar.dimpo.__main__ import main as dimpo_main
from neox_dar.dimpo.apply import apply_projections
from neox_dar.dimpo.instances import DimPOError
from neox_dar.dimpo.projections import Projections, kv_cache_saving, load_projections, model_shape
from neox_dar.evaluation.loading import load_for_eval
from neox_dar.model import build_model

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(family: str = "llama", layers: int = 3, **keys):
    cfg = config(FAMILY_PRESETS[family], **{**TINY_FAMILY_KEYS, "num_layers": layers, **keys}).model
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model, cfg


def projection_file(path, cfg, d_proj: int, weights=None, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    if weights is None:
        weights = {l: torch.randn(d_proj, cfg.head_dim, generator=g) / cfg.head_dim ** 0.5
                   for l in range(cfg.num_layers)}
    return Projections("dimpo", d_proj, model_shape(cfg), weights).save(path)


def logits(model, seed: int = 2):
    ids = torch.randint(0, 1000, (2, 23), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        return model(ids)


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "qwen3"])
def test_identity_at_full_width_and_zero_layers_change_nothing(tmp_path, family):
    keys = {"num_kv_heads": 4} if family == "gpt_neox" else {}
    model, cfg = tiny(family, **keys)
    eye = projection_file(tmp_path / "eye.safetensors", cfg, cfg.head_dim,
                          {l: torch.eye(cfg.head_dim) for l in range(cfg.num_layers)})
    projected, pcfg, info = apply_projections(model, cfg, eye, cfg.num_layers)
    assert layer_types(pcfg) == ["dimpo"] * cfg.num_layers and info["kv_cache_saving"] == 0.0
    torch.testing.assert_close(logits(projected), logits(model), rtol=1e-5, atol=1e-5)
    same, same_cfg, info = apply_projections(model, cfg, projection_file(tmp_path / "r.safetensors", cfg, 4), 0)
    assert same is model and same_cfg is cfg and info["layers"] == []


def test_projected_layers_attend_with_the_projections_on_both_paths(tmp_path):
    """d' = 4 on the last 2 of 3 layers: the first layer is untouched, the scores use W (another W, other logits),
    and the reference path (explicit mask, float32, 1/sqrt(d')) equals the SDPA path."""
    model, cfg = tiny()
    path = projection_file(tmp_path / "p.safetensors", cfg, 4)
    projected, pcfg, info = apply_projections(model, cfg, path, 2)
    assert layer_types(pcfg) == ["vanilla", "dimpo", "dimpo"] and pcfg.attention.dimpo_d_proj == 4
    assert info["layers"] == [1, 2]
    assert info["kv_cache_saving"] == pytest.approx(2 / 3 * (1 - 4 / 16) * 0.5)
    stored = load_projections(path)
    assert all(torch.equal(m.dimpo_proj.detach(), stored.weights[m.layer_idx]) for m in projected.attention_modules()[1:])
    out = logits(projected)
    assert not torch.allclose(out, logits(model), atol=1e-3)
    ref_cfg = dataclasses.replace(pcfg, attention=dataclasses.replace(pcfg.attention, attention_impl="reference"))
    reference = build_model(ref_cfg).eval()
    reference.load_weights(projected.weights())
    torch.testing.assert_close(logits(reference), out, rtol=1e-5, atol=1e-5)
    other, _, _ = apply_projections(model, cfg, projection_file(tmp_path / "q.safetensors", cfg, 4, seed=9), 2)
    assert not torch.allclose(logits(other), out, atol=1e-3)


def test_apply_command_writes_a_checkpoint_every_tool_loads(tmp_path, capsys):
    _, cfg = saved_model(tmp_path / "ckpt", "num_layers=4", perturb=0.05)
    path = projection_file(tmp_path / "p.safetensors", cfg, 2)
    assert dimpo_main(["apply", str(tmp_path / "ckpt"), "--projections", str(path), "--layers", "2",
                       "--out", str(tmp_path / "applied")]) == 0
    saving = kv_cache_saving(2, 4, 2, cfg.head_dim)
    assert f"KV-cache saving {100 * saving:.2f}%" in capsys.readouterr().out
    loaded = load_for_eval(tmp_path / "applied")
    assert layer_types(loaded.cfg) == ["vanilla", "vanilla", "dimpo", "dimpo"]
    assert (tmp_path / "applied" / "tokenizer.json").is_file()
    in_memory, _, _ = apply_projections(load_for_eval(tmp_path / "ckpt").model, cfg, path, 2)
    torch.testing.assert_close(logits(loaded.model), logits(in_memory), rtol=0, atol=0)
    # the decode cache keeps the projected layers' keys at d': the paper's saving, in bytes
    plain = load_for_eval(tmp_path / "ckpt").model.new_cache([99], 1).nbytes()
    assert loaded.model.new_cache([99], 1).nbytes() == pytest.approx(plain * (1 - saving), rel=1e-12)
    # one-line errors: a file for another model, a used --out
    _, small = tiny(layers=2)
    wrong = projection_file(tmp_path / "wrong.safetensors", small, 2)
    assert dimpo_main(["apply", str(tmp_path / "ckpt"), "--projections", str(wrong), "--layers", "1",
                       "--out", str(tmp_path / "x")]) == 2
    assert "projections for a model of 2 layers" in capsys.readouterr().err
    assert dimpo_main(["apply", str(tmp_path / "ckpt"), "--projections", str(path), "--layers", "1",
                       "--out", str(tmp_path / "applied")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert dimpo_main(["apply", str(tmp_path / "ckpt"), "--projections", str(path), "--layers", "0",
                       "--out", str(tmp_path / "y")]) == 2  # wrote a copy with nothing projected, exit 0
    assert capsys.readouterr().err == "error: --layers must be >= 1, got 0\n"
    # projections fitted on another checkpoint (here: on a run that has since trained on) are applied with a
    # warning naming both (silently before: the file records the checkpoint it was fitted on)
    fitted = Projections("dimpo", 2, model_shape(cfg), load_projections(path).weights,
                         source={"checkpoint": str(tmp_path / "run" / "checkpoints" / "step_00000100")})
    assert dimpo_main(["apply", str(tmp_path / "ckpt"), "--projections", str(fitted.save(tmp_path / "f.safetensors")),
                       "--layers", "1", "--out", str(tmp_path / "z")]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"warning: {tmp_path / 'f.safetensors'} was fitted on {tmp_path}/run/checkpoints/step_0000"
                          f"0100, not on {tmp_path / 'ckpt'}") and err.count("\n") == 1, err


def test_only_vanilla_layers_are_projected(tmp_path):
    model, cfg = tiny(attention_type="swa", window_size=4)
    with pytest.raises(DimPOError, match=r"layer\(s\) 2 \(swa\) are not"):
        apply_projections(model, cfg, projection_file(tmp_path / "p.safetensors", cfg, 4), 1)


def test_lm_eval_model_applies_a_projection_file(tmp_path):
    from eval.lm_eval_model import NeoxDarLM

    _, cfg = saved_model(tmp_path / "ckpt", "num_layers=2", perturb=0.05)
    path = projection_file(tmp_path / "p.safetensors", cfg, 3)
    lm = NeoxDarLM(str(tmp_path / "ckpt"), device="cpu", dimpo=str(path), dimpo_layers="1", batch_size=1)
    assert [m.name for m in lm._lm.attention_modules()] == ["vanilla", "dimpo"]
    assert lm.describe()["dimpo"]["layers"] == [1]
    expected, _, _ = apply_projections(load_for_eval(tmp_path / "ckpt").model, cfg, path, 1)
    torch.testing.assert_close(logits(lm._lm), logits(expected), rtol=0, atol=0)
    with pytest.raises(ValueError, match="dimpo_layers needs dimpo=FILE"):
        NeoxDarLM(str(tmp_path / "ckpt"), device="cpu", dimpo_layers="1")
