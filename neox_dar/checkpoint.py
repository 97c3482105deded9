"""Loading a trained model from a checkpoint, and writing a weights-only checkpoint.

``load_model`` accepts a run directory (its newest complete checkpoint), its ``checkpoints`` directory, one step
directory, or a folder written by :func:`save_weights`. The checkpoint is verified against its manifest (sizes
and checksums, :mod:`neox_dar.rundir`) and its weights against its config before anything is loaded, so a
truncated, corrupt or mismatched checkpoint is a one-line :class:`~neox_dar.rundir.CheckpointError`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from .config import Config, ConfigError, load_config
from .model import CausalLM, build_model
from .rundir import CONFIG, WEIGHTS, CheckpointError, resolve_checkpoint, write_manifest


def save_weights(model: CausalLM, cfg: Config, out_dir: str | Path) -> Path:
    """Write ``model.safetensors`` (float32, contiguous), ``config.yml`` and the manifest into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / CONFIG).write_text(cfg.to_yaml())
    write_manifest(out, {"step": None})
    return out


def check_weight_shapes(weights: Path, model: torch.nn.Module) -> None:
    """CheckpointError naming the first tensor whose name or shape in ``weights`` differs from ``model``'s
    (read from the safetensors header, before any tensor is loaded)."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
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


def load_model(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[CausalLM, Config]:
    """Load ``(model, cfg)`` from a verified checkpoint written by training or by :func:`save_weights`."""
    step_dir = resolve_checkpoint(path)
    try:
        cfg = load_config(step_dir / CONFIG)
    except ConfigError as e:
        raise CheckpointError(f"{step_dir}: {e}") from None
    with torch.device("meta"):
        model = build_model(cfg)
    check_weight_shapes(step_dir / WEIGHTS, model)
    state = load_file(str(step_dir / WEIGHTS), device=str(map_location))
    model.load_state_dict(state, strict=True, assign=True)
    return model, cfg
