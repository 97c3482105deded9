"""``to_hf`` and ``from_hf``: a model to a complete Hugging Face folder and back, and which output folders a
conversion may write (new, empty, or an earlier output of the same model)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError

from ..saved_model import read_model_config
from ..config import ConfigError, ModelConfig
from ..families import FAMILIES
from ..model import build_meta_model, CausalLM
from ..progress import progress_bar
from ..rundir import (CHECKPOINTS, CONFIG, MODEL_CONFIG, STATE, CheckpointError, check_writable, save_safetensors,
                      staged_dir)
from ..tokenizer import tokenizer_file, write_tokenizer
from .config_map import config_from_hf, export_problems, hf_config_dict
from .remote import LAYER_TYPES_FILE, REMOTE_CODE, REMOTE_FILES, layer_types_source, remote_config_dict
from .weights import checked_tensor, initialise_new, our_name, tensors_of, read_folder_json, weight_files


def to_hf(model: CausalLM, cfg: ModelConfig, out_dir: str | Path, tokenizer_json: str | Path | None = None,
          dtype: torch.dtype = torch.float32) -> Path:
    """Write ``out_dir/config.json``, ``out_dir/model.safetensors`` (in ``dtype``, which ``config.json``'s
    ``torch_dtype`` names; a tied head once, as Hugging Face writes it) and the tokenizer (:func:`write_tokenizer`;
    default: :func:`neox_dar.tokenizer.tokenizer_file`); for a model with non-vanilla layers also the code of
    :mod:`neox_dar.standalone` (``auto_map``), whose ``layer_types.py`` imports every layer type by name
    (:func:`~.remote.layer_types_source`). All of it goes into a folder beside ``out_dir`` that replaces it once
    complete (:func:`~neox_dar.rundir.staged_dir`): a failure or a kill part-way leaves an earlier export whole."""
    modules = model.attention_modules()
    layers = layer_types = None
    if any(m.name != "vanilla" for m in modules):
        layers = [m.export_spec() for m in modules]
        layer_types = layer_types_source(layers)
    elif problems := export_problems(cfg):
        raise ConfigError(f"{FAMILIES[cfg.model_family].hf_class} cannot express this model: {'; '.join(problems)}")
    out = Path(out_dir)
    with staged_dir(out) as stage:
        special_ids = write_tokenizer(tokenizer_json or tokenizer_file(cfg), cfg, stage)
        tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.weights().items()}
        save_safetensors(tensors, stage / "model.safetensors", metadata={"format": "pt"})
        config = hf_config_dict(cfg, special_ids) if layers is None else remote_config_dict(cfg, layers, special_ids)
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
        (stage / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if layers is not None:
            for name in REMOTE_FILES:
                shutil.copyfile(REMOTE_CODE / name, stage / name)
            (stage / LAYER_TYPES_FILE).write_text(layer_types)
    return out



def from_hf(hf_dir: str | Path, attention_impl: str | None = None,
            overrides: dict | None = None) -> tuple[CausalLM, ModelConfig]:
    """Load a Hugging Face folder of a supported class as ``(model, model config)``, one file at a time onto a
    model built on the meta device (tensors keep their stored dtype). ``attention_impl`` replaces the attention
    path; ``overrides`` (flat keys) may add a variant, whose new parameters are initialised as in training."""
    hf_dir = Path(hf_dir)
    config_path = hf_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no config.json in {hf_dir}")
    hf = read_folder_json(config_path)
    files = weight_files(hf_dir)
    sizes = [f.stat().st_size for f in files]
    cfg = config_from_hf(hf, str(config_path), overrides, sum(sizes))
    if attention_impl is not None:
        cfg.attention = dataclasses.replace(cfg.attention, attention_impl=attention_impl)
    model = build_meta_model(cfg)
    expected = {k: tuple(v.shape) for k, v in model.weights().items()}
    implied = config_path if not overrides else (  # a size the command line changed: not the file's mistake
        f"{config_path} with {' '.join(f'{k}={v}' for k, v in overrides.items())}")
    loaded = set()
    bar = progress_bar(total=sum(sizes), desc=f"reading {hf_dir.name}", unit="B", unit_scale=True,
                       delay=2.0)  # shown for a large model only
    try:
        for path, size in zip(files, sizes):
            end, shard = bar.n + size, {}
            for name, shape, load in tensors_of(path):
                ours = our_name(name, model)
                if ours is None:
                    continue
                if ours not in expected:
                    raise CheckpointError(f"{path}: {name} is not a parameter of the model {implied} describes")
                if shape != expected[ours]:
                    raise CheckpointError(f"{path}: {name} has shape {shape}, {implied} implies {expected[ours]}")
                shard[ours] = checked_tensor(load(), name, path)
                bar.update(min(shard[ours].nbytes, end - bar.n))
            model.load_state_dict(shard, strict=False, assign=True)
            loaded |= set(shard)
            bar.update(end - bar.n)  # the file's header and the tensors it holds that the model does not take
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{hf_dir}: unreadable weights ({e})") from None
    finally:
        bar.close()
    initialise_new(model, cfg, set(expected) - loaded, hf_dir)
    model.tie_weights()
    return model, cfg



def folder_model(folder: Path, direction: str) -> ModelConfig | None:
    """The model config of an earlier ``direction`` output in ``folder`` (``to-hf``: its ``config.json``'s
    ``neox_dar_config``; ``from-hf``: the weights folder's ``model.yml``), or None when ``folder`` is no such output
    (a run directory, a training checkpoint, other files)."""
    if (folder / CONFIG).exists() or (folder / CHECKPOINTS).exists():
        return None
    try:
        if direction == "to-hf":
            hf = read_folder_json(folder / "config.json") if (folder / "config.json").is_file() else None
            ours = isinstance(hf, dict) and "neox_dar_config" in hf
            return config_from_hf(hf, str(folder / "config.json")) if ours else None
        ours = (folder / MODEL_CONFIG).is_file() and (folder / STATE).is_file()
        return read_model_config(folder) if ours else None
    except (ConfigError, CheckpointError):
        return None



def check_out_dir(out: Path, cfg: ModelConfig, direction: str) -> None:
    """ConfigError (one line naming ``out``) unless ``direction`` may write the model ``cfg`` into ``out``: missing,
    empty, or an earlier ``direction`` output of a model with the same config (a newer checkpoint of the same run,
    exported again), which is then replaced. A run directory, a folder of other files, another model's export or
    import is never overwritten."""
    check_writable(out, direction, folder=True)  # a file, under one, or without permission: said here, not in a rename
    if not out.is_dir() or not any(out.iterdir()):
        return
    kind = "Hugging Face export (to-hf)" if direction == "to-hf" else "import (from-hf)"
    found = folder_model(out, direction)
    if found is None:
        raise ConfigError(f"{out} is not empty and is not an earlier {kind}: name a new or empty folder (nothing "
                          "was written)")
    if found != cfg:
        raise ConfigError(f"{out} holds the {kind} of another model (its config differs): name a new or empty "
                          "folder (nothing was written)")
