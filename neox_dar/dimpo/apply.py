"""Putting fitted projections into a model (DimPO item 4): the last ``l`` layers attend with
``F(q) F(k)^T / sqrt(d')`` (:class:`neox_dar.attention.dimpo.DimPOAttention`), values unchanged.

    python -m neox_dar.dimpo apply CHECKPOINT --projections FILE --layers l --out NEW

writes ``NEW`` as ``convert from-hf`` writes a checkpoint (``model.safetensors``, ``model.yml``, manifest, the
tokenizer files), so every tool loads it unchanged: ``eval.perplexity``, lm-eval (``--model neox_dar``), the
generation command and the decode benchmark (keys of the projected layers cached at ``d'``), ``convert to-hf``.
lm-eval can also apply a file on the fly: ``--model_args checkpoint=CKPT,dimpo=FILE,dimpo_layers=l``.

Only vanilla layers are projected (the paper projects pretrained full-attention models); the projected layers
become ``dimpo`` through ``attention_config`` (``[[["vanilla"], L - l], [["dimpo"], l]]``), ``dimpo_d_proj`` is
the file's ``d'``, and each layer's ``W`` is copied into its ``dimpo_proj``.
"""

from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig, model_config_from_flat, model_flat
from ..model import CausalLM, build_meta_model
from ..tokenizer import copy_tokenizer, tokenizer_file
from ..variants import layer_types
from .instances import DimPOError
from .projections import check_projections, kv_cache_saving, load_projections


def projected_config(cfg: ModelConfig, layers: list[int], d_proj: int) -> ModelConfig:
    """``cfg`` with ``layers`` turned into ``dimpo`` layers of width ``d_proj`` (DimPOError for a layer that is
    not vanilla)."""
    types = layer_types(cfg)
    other = [f"{i} ({types[i]})" for i in layers if types[i] != "vanilla"]
    if other:
        raise DimPOError(f"DimPO projects vanilla attention layers; layer(s) {', '.join(other)} are not")
    new = ["dimpo" if i in layers else t for i, t in enumerate(types)]
    runs: list[list] = []
    for t in new:
        if runs and runs[-1][0] == [t]:
            runs[-1][1] += 1
        else:
            runs.append([[t], 1])
    flat = {**model_flat(cfg), "attention_config": runs, "dimpo_d_proj": d_proj}
    flat.pop("attention_type")  # the layers say it
    return model_config_from_flat(flat, "the projected model")


def apply_projections(model: CausalLM, cfg: ModelConfig, path: str | Path,
                      last: int) -> tuple[CausalLM, ModelConfig, dict]:
    """``(model, cfg, info)`` with the projections of file ``path`` in the last ``last`` layers: a new model with
    the same weights (``last = 0``: ``model`` and ``cfg`` themselves); ``info`` names the file, ``d'``, the layers
    and the paper's KV-cache saving."""
    proj = load_projections(path)
    layers = check_projections(proj, cfg, last, path)
    info = {"projections": str(path), "method": proj.method, "d_proj": proj.d_proj, "layers": layers,
            "kv_cache_saving": kv_cache_saving(last, cfg.num_layers, proj.d_proj, cfg.head_dim),
            "fitted_on": proj.source.get("checkpoint")}
    if not layers:
        return model, cfg, info
    new_cfg = projected_config(cfg, layers, proj.d_proj)
    param = next(model.parameters())
    projected = build_meta_model(new_cfg)
    state = dict(model.weights())
    for l in layers:
        state[f"{_attention_prefix(projected, l)}dimpo_proj"] = proj.weights[l].to(param.device, param.dtype)
    projected.load_weights(state, assign=True)
    return projected.train(model.training), new_cfg, info


def _attention_prefix(model: CausalLM, layer: int) -> str:
    """The state-dict prefix of layer ``layer``'s attention module (``gpt_neox.layers.3.attention.``, ...)."""
    module = model.attention_modules()[layer]
    return next(name for name, m in model.named_modules() if m is module) + "."


def apply_checkpoint(checkpoint: str, path: str | Path, last: int, out: str | Path) -> dict:
    """Load ``checkpoint`` (a run, a step directory, a from-hf folder or a Hugging Face folder), apply the last
    ``last`` layers' projections and write the result to ``out`` with the tokenizer files; returns the info, with
    ``checkpoint`` (the step directory a run resolved to) beside ``fitted_on`` (the one the fit read)."""
    from ..saved_model import save_weights
    from ..evaluation.loading import load_for_eval

    loaded = load_for_eval(checkpoint)
    model, cfg, info = apply_projections(loaded.model, loaded.model.cfg, path, last)
    info["checkpoint"] = loaded.info["checkpoint"]
    copy_tokenizer(tokenizer_file(cfg, model_dir=loaded.model_dir), out)  # first: the manifest lists them
    save_weights(model, cfg, out)
    return info
