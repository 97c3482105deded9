"""On-disk layout of a run, and loading a trained model from it.

    {save}/checkpoints/step_00001000/   one complete checkpoint (written under a temporary name, then renamed)
        model.safetensors               consolidated weights (Hugging Face names), float32
        config.yml                      the resolved config
        state.json                      step, consumed samples, ... (the trainer's state)
    {save}/checkpoints/latest           name of the newest complete checkpoint, updated last

``load_model`` accepts a run directory, its ``checkpoints`` directory, or one step directory.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .config import Config, load_config
from .model import CausalLM, build_model

WEIGHTS = "model.safetensors"
CONFIG = "config.yml"


def save_weights(model: CausalLM, cfg: Config, out_dir: str | Path) -> Path:
    """Write ``model.safetensors`` (float32, contiguous) and ``config.yml`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / CONFIG).write_text(cfg.to_yaml())
    return out


def resolve_checkpoint(path: str | Path) -> Path:
    """The step directory ``path`` names: itself, or the ``latest`` one under a run or checkpoints directory."""
    p = Path(path)
    if (p / WEIGHTS).is_file():
        return p
    for base in (p / "checkpoints", p):
        latest = base / "latest"
        if latest.is_file():
            step_dir = base / latest.read_text().strip()
            if (step_dir / WEIGHTS).is_file():
                return step_dir
            raise FileNotFoundError(f"{latest} points to {step_dir}, which holds no {WEIGHTS}")
    raise FileNotFoundError(f"no checkpoint at {p}: expected {WEIGHTS} there or a 'latest' file under it")


def load_model(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[CausalLM, Config]:
    """Load ``(model, cfg)`` from a checkpoint written by training or by :func:`save_weights`."""
    step_dir = resolve_checkpoint(path)
    cfg = load_config(step_dir / CONFIG)
    with torch.device("meta"):
        model = build_model(cfg)
    state = load_file(str(step_dir / WEIGHTS), device=str(map_location))
    model.load_state_dict(state, strict=True, assign=True)
    return model, cfg
