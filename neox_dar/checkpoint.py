"""On-disk layout of a run, and loading a trained model from it.

    {save}/checkpoints/step_00001000/   one complete checkpoint (written under a temporary name, then renamed)
        model.safetensors               consolidated weights (Hugging Face names), float32
        config.yml                      the resolved config
        state.json                      step, consumed samples, ... (the trainer's state) and the manifest:
                                        every file of the checkpoint with its size, written last
        rng_rank00000.pt ...            RNG states of every rank; DeepSpeed's model/optimizer files
    {save}/checkpoints/latest           name of the newest complete checkpoint, updated last

``load_model`` accepts a run directory, its ``checkpoints`` directory, or one step directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .config import Config, load_config
from .model import CausalLM, build_model

WEIGHTS = "model.safetensors"
CONFIG = "config.yml"
STATE = "state.json"
LATEST = "latest"
STEP_PREFIX = "step_"


def step_dir_name(step: int) -> str:
    """``step_00001000`` for step 1000."""
    return f"{STEP_PREFIX}{step:08d}"


def step_dirs(checkpoints_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step_*`` directory under ``checkpoints_dir``, newest first."""
    root = Path(checkpoints_dir)
    found = []
    for p in root.glob(STEP_PREFIX + "*") if root.is_dir() else ():
        suffix = p.name[len(STEP_PREFIX):]
        if p.is_dir() and suffix.isdigit():
            found.append((int(suffix), p))
    return sorted(found, reverse=True)


def incomplete_reason(step_dir: str | Path) -> str | None:
    """None when ``step_dir`` is a complete checkpoint, else why not (unreadable state, missing or
    truncated file against the manifest in ``state.json``)."""
    d = Path(step_dir)
    try:
        state = json.loads((d / STATE).read_text())
        files = state["files"]
    except FileNotFoundError:
        return f"no {STATE}"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable {STATE} ({type(e).__name__}: {e})"
    if WEIGHTS not in files:
        return f"{STATE} lists no {WEIGHTS}"
    for rel, size in files.items():
        f = d / rel
        if not f.is_file():
            return f"missing file {rel}"
        if f.stat().st_size != size:
            return f"{rel} has {f.stat().st_size} bytes, the manifest says {size}"
    return None


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
