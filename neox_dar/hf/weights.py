"""Reading a Hugging Face folder's weights: its files (a shard index read only inside the folder), tensors one file at
a time (safetensors memory-mapped; a ``.bin`` only with ``weights_only``), each checked finite and floating point,
our names for them, and the parameters a variant adds on top of an import."""

from __future__ import annotations

import json
import pickle
from pathlib import Path, PurePosixPath

import torch
from safetensors import safe_open

from ..attention import Attention
from ..config import ConfigError, ModelConfig
from ..families import FAMILIES
from ..model import CausalLM, init_weights, vanilla_weight_names
from ..rundir import CheckpointError

# Buffers that some published GPT-NeoX checkpoints carry and that hold no learned state.


_IGNORED_SUFFIXES = (".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq", "rotary_emb.inv_freq")


WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)



def weight_files(hf_dir: Path) -> list[Path]:
    """The folder's weight files: ``model.safetensors``, or every shard its index lists (a missing one is an
    error), or ``pytorch_model.bin``."""
    single, index = hf_dir / "model.safetensors", hf_dir / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        data = read_folder_json(index)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(s, str) for s in weight_map.values()):
            raise CheckpointError(f"{index} is not a safetensors index (it needs a 'weight_map' of tensor names to "
                                  "file names)")
        shards = sorted(set(weight_map.values()))
        if outside := [s for s in shards if PurePosixPath(s).is_absolute() or ".." in PurePosixPath(s).parts]:
            raise CheckpointError(f"{index} names a file outside {hf_dir}: {outside[0]!r} (weights are read only from "
                                  "the folder itself)")
        missing = [s for s in shards if not (hf_dir / s).is_file()]
        if missing:
            raise CheckpointError(f"{index} lists {len(missing)} shard(s) that are not in {hf_dir}: "
                                  f"{', '.join(missing[:3])}")
        return [hf_dir / s for s in shards]
    if (hf_dir / "pytorch_model.bin").is_file():
        return [hf_dir / "pytorch_model.bin"]
    if (hf_dir / "pytorch_model.bin.index.json").is_file():
        raise CheckpointError(f"{hf_dir} holds .bin shards (pytorch_model.bin.index.json), which are not read: save "
                              "the model as safetensors first (transformers: from_pretrained, then save_pretrained)")
    raise CheckpointError(f"no model.safetensors, model.safetensors.index.json or pytorch_model.bin in {hf_dir}")



def our_name(name: str, model: CausalLM) -> str | None:
    """Our parameter name for a Hugging Face one (None: a buffer to ignore, or the tied head)."""
    if name.endswith(_IGNORED_SUFFIXES):
        return None
    if name == "lm_head.weight":  # transformers 5 names every head lm_head (GPT-NeoX's: embed_out)
        name = f"{FAMILIES[model.cfg.model_family].names.head}.weight"
    return None if name in model.tied_keys else name



def read_folder_json(path: Path) -> object:
    """The JSON value in ``path``; a CheckpointError when it is not valid JSON (nesting too deep included)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise CheckpointError(f"{path} is not valid JSON (nested too deeply)") from None
    except ValueError as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from None



def tensors_of(path: Path):
    """``(name, shape, loader)`` of every tensor in one weight file; safetensors are memory-mapped. A ``.bin`` is
    read with ``weights_only=True``: one that needs more (code to run) or is not a state dict of tensors is
    refused."""
    if path.suffix == ".bin":
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
            raise CheckpointError(f"{path}: refused: torch.load(weights_only=True) cannot read it "
                                  f"({type(e).__name__}); convert it to safetensors with a tool you trust") from None
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise CheckpointError(f"{path}: refused: not a state dict of tensors")
        for name, t in state.items():
            yield name, tuple(t.shape), (lambda t=t: t)
        return
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            yield name, tuple(f.get_slice(name).get_shape()), (lambda name=name: f.get_tensor(name))



def checked_tensor(tensor: torch.Tensor, name: str, path: Path) -> torch.Tensor:
    """``tensor`` when it is of a :data:`WEIGHT_DTYPES` and finite; a CheckpointError naming it otherwise."""
    if tensor.dtype not in WEIGHT_DTYPES:
        raise CheckpointError(f"{path}: {name} is {str(tensor.dtype).removeprefix('torch.')}, not floating point "
                              "(float32, float16, bfloat16 or float64)")
    # min and max propagate NaN and hold any Inf, with no copy of the (memory-mapped) tensor
    if tensor.numel() and not all(torch.isfinite(x) for x in torch.aminmax(tensor)):
        raise CheckpointError(f"{path}: {name} holds NaN or Inf")
    return tensor



def initialise_new(model: CausalLM, cfg: ModelConfig, missing: set[str], hf_dir: Path) -> None:
    """Parameters the folder does not hold: a variant's new ones are initialised as when finetuning adds the variant
    (the model's ``init_method``, then the variant's own start: ``aha_router_init``'s zero router); a base-model
    parameter missing from the folder, or a start that needs training data (``dar_init: pca``), is an error."""
    base = vanilla_weight_names(cfg)
    absent = sorted(k for k in missing if k in base)
    if absent:
        raise CheckpointError(f"{hf_dir}: weights lack {len(absent)} parameter(s) of the model, e.g. {absent[0]}")
    owners = [m for prefix, m in model.named_modules()
              if isinstance(m, Attention) and any(n.startswith(prefix + ".") for n in missing)]
    if any(m.wants_calibration() for m in owners):  # DAR's pca start: the only one
        raise ConfigError(f"dar_init=pca computes DAR's start on training data, which an import has none of: import "
                          f"{hf_dir} without the variant and add it when finetuning (load=IMPORT finetune=true "
                          "attention_type=dar dar_init=pca), or set dar_init=random")
    modules = {name.rsplit(".", 1)[0] for name in missing}
    for name, module in model.named_modules():
        if name in modules:
            module.to_empty(device="cpu", recurse=False)
    init_weights(model, cfg, only=modules)
    for m in owners:
        m.init_new_parameters(None)
