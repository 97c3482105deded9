"""Loading a trained model from a checkpoint, and writing a weights-only checkpoint.

``load_model`` accepts a run directory (its newest complete checkpoint), its ``checkpoints`` directory, one step
directory, or a folder written by :func:`save_weights`. The checkpoint is verified against its manifest (sizes
and checksums, :mod:`neox_dar.rundir`) and its weights against its model config before anything is loaded, so a
truncated, corrupt or mismatched checkpoint is a one-line :class:`~neox_dar.rundir.CheckpointError`. A model needs
only the model section of the config: ``model.yml``, or the ``model`` keys of ``config.yml`` in a checkpoint that
has no ``model.yml``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import yaml
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from .config import ConfigError, ModelConfig, load_config, model_config_from_flat, model_flat
from .model import CausalLM, build_meta_model
from .rundir import CONFIG, MODEL_CONFIG, WEIGHTS, CheckpointError, held_checkpoint, save_safetensors, write_manifest
from .tokenizer import recorded_tokenizer, tokenizer_sha256


def model_yaml(cfg: ModelConfig) -> str:
    """The ``model.yml`` text of a model config (flat model and attention keys)."""
    return yaml.safe_dump(model_flat(cfg), sort_keys=False)


def read_model_config(step_dir: str | Path) -> ModelConfig:
    """A checkpoint's model config: ``model.yml``, or the model section of ``config.yml`` (older checkpoints)."""
    d = Path(step_dir)
    try:
        if (d / MODEL_CONFIG).is_file():
            return model_config_from_flat(yaml.safe_load((d / MODEL_CONFIG).read_text()) or {},
                                          source=str(d / MODEL_CONFIG))
        if not (d / CONFIG).is_file():
            raise CheckpointError(f"{d} holds no model config: no {MODEL_CONFIG} or {CONFIG} (a neox-dar checkpoint "
                                  "or import), no config.json (a Hugging Face folder)")
        return load_config(d / CONFIG).model
    except (ConfigError, yaml.YAMLError) as e:
        raise CheckpointError(f"{d}: its model config is not valid ({e})") from None


def save_weights(model: CausalLM, cfg: ModelConfig, out_dir: str | Path, step: int | None = None) -> Path:
    """Write ``model.safetensors`` (the tensors' own dtype, contiguous; a tied head once, as the embedding),
    ``model.yml`` and the manifest into ``out_dir`` (with the sha256 of a ``tokenizer.json`` already there: copy
    the tokenizer files first, so the manifest lists them). ``step``: the training step of the weights, when they
    come from a run's checkpoint (what evaluation records as the result's ``step``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.weights().items()}
    save_safetensors(tensors, out / WEIGHTS, metadata={"format": "pt"})
    (out / MODEL_CONFIG).write_text(model_yaml(cfg))
    tokenizer = recorded_tokenizer(out)
    write_manifest(out, {"step": step, "tokenizer_sha256": tokenizer and tokenizer_sha256(tokenizer)})
    return out


def check_weight_shapes(weights: Path, model: torch.nn.Module) -> None:
    """CheckpointError naming the first tensor whose name or shape in ``weights`` differs from ``model``'s
    (read from the safetensors header, before any tensor is loaded)."""
    expected = {k: tuple(v.shape) for k, v in model.weights().items()}
    try:
        with safe_open(str(weights), framework="pt") as f:
            found = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{weights} is not a readable safetensors file ({e})") from None
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            raise CheckpointError(f"{weights} lacks {name}, which its {CONFIG} implies")
        if name not in expected:
            raise CheckpointError(f"{weights} holds {name}, which its {CONFIG} does not imply")
        if found[name] != expected[name]:
            raise CheckpointError(f"{weights}: {name} has shape {found[name]}, its {CONFIG} implies "
                                  f"{expected[name]} (the config no longer matches the weights)")


def load_model(path: str | Path, map_location: str | torch.device = "cpu",
               attention_impl: str | None = None) -> tuple[CausalLM, ModelConfig]:
    """Load ``(model, model config)`` from a verified checkpoint written by training or by :func:`save_weights`;
    ``attention_impl`` (reference, sdpa, triton) replaces the checkpoint's attention path. The checkpoint is held
    while it is read (:func:`~neox_dar.rundir.held_checkpoint`: the run writing it cannot prune it meanwhile)."""
    with held_checkpoint(path) as step_dir:
        cfg = read_model_config(step_dir)
        if attention_impl is not None:
            cfg.attention = dataclasses.replace(cfg.attention, attention_impl=attention_impl)
        model = build_meta_model(cfg)
        check_weight_shapes(step_dir / WEIGHTS, model)
        state = load_file(str(step_dir / WEIGHTS), device=str(map_location))
    model.load_weights(state, assign=True)
    return model, cfg
