"""Atomic, resumable training checkpoints on top of DeepSpeed's.

One checkpoint is a directory ``{save}/checkpoints/step_XXXXXXXX`` (layout in :mod:`neox_dar.checkpoint`):
DeepSpeed's model/optimizer/scheduler files (every rank's ZeRO partition), the RNG states of every rank,
the consolidated fp32 ``model.safetensors`` and ``config.yml``, and ``state.json`` (step, consumed samples,
code version, and the manifest of every file with its size).

Writing is atomic: everything goes to ``.tmp-step_XXXXXXXX``, files and directory are fsynced, the directory
is renamed to its final name, and ``latest`` is replaced last (temporary file + ``os.replace``). On resume the
newest checkpoint that matches its manifest wins; partial or corrupt ones are skipped with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from ..checkpoint import CONFIG, LATEST, STATE, WEIGHTS, incomplete_reason, step_dir_name, step_dirs
from ..config import Config
from ..provenance import code_version
from .distributed import DistInfo, barrier

log = logging.getLogger("neox_dar.train")

TMP_PREFIX = ".tmp-"


@dataclass
class TrainState:
    """Where training stands: optimizer steps taken and GLOBAL samples consumed (the data position)."""

    step: int = 0
    consumed_samples: int = 0


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used with this run (one line)."""


def rng_file(rank: int) -> str:
    return f"rng_rank{rank:05d}.pt"


# ----------------------------------------------------------------------------------------------
# RNG states


def capture_rng() -> dict:
    """Python, NumPy, torch CPU and CUDA generator states in ``torch.load(weights_only=True)``-safe types."""
    np_state = np.random.get_state()
    out = {
        "python": random.getstate(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def restore_rng(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------------------------
# consolidated weights


def consolidated_fp32_state(engine) -> dict[str, torch.Tensor]:
    """Full fp32 weights on CPU, gathered from every rank's partition (collective: call on all ranks).

    The fp32 master copy where DeepSpeed keeps one (ZeRO 1/2/3, bf16), else the parameter itself (fp32 at
    ZeRO 0); exact for fp32 training."""
    from deepspeed.utils import safe_get_full_fp32_param

    module = engine.module
    out = {}
    for name, p in module.named_parameters():
        full = safe_get_full_fp32_param(p)
        out[name] = (p.detach() if full is None else full).to("cpu", torch.float32).contiguous().clone()
    for name, b in module.named_buffers():
        if name in module.state_dict():
            out[name] = b.detach().to("cpu", torch.float32).contiguous().clone()
    return out


# ----------------------------------------------------------------------------------------------
# saving


def _fsync_tree(d: Path) -> None:
    for f in sorted(d.rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(d)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync, then ``os.replace`` it into place."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(engine, cfg: Config, info: DistInfo, root: Path, state: TrainState, keep_last_n: int) -> Path:
    """Write the checkpoint of ``state`` under ``root`` (collective), return its directory.

    A complete checkpoint of the same step already there (the one this run resumed from) is kept as is."""
    final = root / step_dir_name(state.step)
    if final.is_dir() and incomplete_reason(final) is None:
        return final
    tag = TMP_PREFIX + step_dir_name(state.step)
    tmp = root / tag
    if info.is_main:
        root.mkdir(parents=True, exist_ok=True)
        for stale in (tmp, final):
            if stale.exists():
                shutil.rmtree(stale)
    barrier()
    engine.save_checkpoint(str(root), tag=tag, save_latest=False)
    torch.save(capture_rng(), tmp / rng_file(info.rank))
    weights = consolidated_fp32_state(engine)
    barrier()
    if info.is_main:
        save_file(weights, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(cfg.to_yaml())
        files = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
        meta = {
            "step": state.step,
            "consumed_samples": state.consumed_samples,
            "train_iters": cfg.train_iters,
            "world_size": info.world_size,
            "zero_stage": cfg.zero_optimization.stage,
            "precision": cfg.dtype_name,
            "code_version": code_version(),
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "deepspeed_tag": tag,
            "files": files,
        }
        (tmp / STATE).write_text(json.dumps(meta, indent=1) + "\n")
        _fsync_tree(tmp)
        os.rename(tmp, final)
        _fsync_dir(root)
        write_text_atomic(root / LATEST, final.name + "\n")
        prune(root, keep_last_n)
    barrier()
    return final


def prune(root: Path, keep_last_n: int) -> None:
    """Delete complete checkpoints beyond the newest ``keep_last_n`` (never the one ``latest`` names)."""
    latest = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
    complete = [p for _, p in step_dirs(root) if incomplete_reason(p) is None]
    for p in complete[keep_last_n:]:
        if p.name != latest:
            shutil.rmtree(p, ignore_errors=True)


def remove_stale_temporaries(root: Path) -> None:
    """Delete ``.tmp-*`` leftovers of a save that was killed midway (rank 0, before training)."""
    for p in root.glob(TMP_PREFIX + "*") if root.is_dir() else ():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        log.warning("removed the unfinished checkpoint %s", p)


# ----------------------------------------------------------------------------------------------
# resuming


def checkpoints_root(path: str | Path) -> Path:
    """The directory holding ``step_*`` dirs for a run directory or a checkpoints directory."""
    p = Path(path)
    return p / "checkpoints" if (p / "checkpoints").is_dir() or not step_dirs(p) else p


def find_resume_checkpoint(path: str | Path, warn=log.warning) -> Path | None:
    """The newest complete checkpoint under ``path`` (a run dir, its ``checkpoints`` dir, or one step dir);
    incomplete ones are skipped with a warning. None when there is none."""
    p = Path(path)
    if (p / STATE).is_file() or p.name.startswith("step_"):
        reason = incomplete_reason(p)
        if reason:
            raise CheckpointError(f"checkpoint {p} is incomplete: {reason}")
        return p
    for _, d in step_dirs(checkpoints_root(p)):
        reason = incomplete_reason(d)
        if reason is None:
            return d
        warn(f"skipping incomplete checkpoint {d}: {reason}")
    return None


def load_checkpoint(engine, cfg: Config, info: DistInfo, step_dir: Path) -> TrainState:
    """Restore DeepSpeed state, this rank's RNG and the data position from ``step_dir`` (collective)."""
    meta = json.loads((step_dir / STATE).read_text())
    if meta["world_size"] != info.world_size and meta["zero_stage"] > 0:
        raise CheckpointError(
            f"{step_dir} was written by {meta['world_size']} ranks under ZeRO-{meta['zero_stage']}; resume it with "
            f"{meta['world_size']} ranks (this run has {info.world_size}), or start a new run from its "
            f"{WEIGHTS}")
    loaded, _ = engine.load_checkpoint(str(step_dir.parent), tag=step_dir.name, load_optimizer_states=True,
                                       load_lr_scheduler_states=True)
    if loaded is None:
        raise CheckpointError(f"DeepSpeed could not load {step_dir}")
    rng = step_dir / rng_file(info.rank)
    if rng.is_file():
        restore_rng(torch.load(rng, weights_only=True))
    return TrainState(step=int(meta["step"]), consumed_samples=int(meta["consumed_samples"]))
