"""Load a model and its tokenizer for evaluation: a training checkpoint or a Hugging Face GPT-NeoX folder.

    loaded = load_for_eval("runs/pythia-70m-dar", device="cuda", dtype="bfloat16")
    loaded.model(input_ids)        # (B, T) -> (B, T, V) logits, eval mode, on ``device``
    loaded.info                    # {"checkpoint", "step", "config_hash", "attention_type"}
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from ..provenance import shown_path
from ..saved_model import load_model
from ..config import ModelConfig, model_flat
from ..model import CausalLM
from ..rundir import checkpoint_step, is_hf_folder, resolve_checkpoint

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: CausalLM
    cfg: ModelConfig
    info: dict
    model_dir: Path  # the folder holding the weights: a step directory or a Hugging Face folder


def config_hash(cfg: ModelConfig) -> str:
    """sha256 of the model config's YAML (the same model always gives the same hash)."""
    return hashlib.sha256(yaml.safe_dump(model_flat(cfg), sort_keys=False).encode("utf-8")).hexdigest()


def load_for_eval(path: str | Path, device: str | torch.device = "cpu", dtype: str = "float32",
                  attention_impl: str | None = None) -> LoadedModel:
    """The model at ``path`` in eval mode on ``device`` in ``dtype`` (``float32``, ``bfloat16``, ``float16``).

    ``attention_impl`` replaces the checkpoint's ``attention_impl`` (``reference``, ``sdpa``, ``triton``).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got '{dtype}'")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"checkpoint not found: {p}")
    if is_hf_folder(p):
        from ..hf import from_hf

        model, cfg = from_hf(p, attention_impl=attention_impl)
        where, step = p, None
    else:
        where = resolve_checkpoint(p)
        model, cfg = load_model(where, attention_impl=attention_impl)
        step = checkpoint_step(where)
    model = model.to(device=device, dtype=DTYPES[dtype]).eval()
    info = {"checkpoint": shown_path(where), "step": step, "config_hash": config_hash(cfg),
            "attention_type": cfg.attention.attention_type}
    return LoadedModel(model, cfg, info, where)
