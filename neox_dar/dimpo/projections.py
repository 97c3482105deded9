"""Projection files, the layers a projection applies to, and the KV-cache saving it buys (paper Sec. 4).

A projection file holds one method's ``W`` (d', d_h) for each fitted layer of one model at one ``d'``: a
safetensors file with tensors ``layers.{l}.weight`` (float32) and metadata naming the format, the method, ``d'``
and the shape of the model (layers, query heads, key/value heads, head dim), so that a file for another model is
refused in one line. The projection applies after rotary (the paper does not say where; projecting the rotated
vectors keeps ``F(q) F(k)^T`` a function of the cached keys alone).

Projecting the last ``l`` of ``L`` layers to ``d'`` stores keys of ``d'`` dims instead of ``d_h`` in those layers;
keys are half of the KV cache and values are unchanged, so the cache shrinks by
``l / L * (1 - d' / d_h) * 50%`` (:func:`kv_cache_saving`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..config import ModelConfig
from ..rundir import TMP_PREFIX, save_safetensors
from .instances import DimPOError

FORMAT = "neox_dar.dimpo.projections"
VERSION = "1"
SHAPE_KEYS = ("num_layers", "num_heads", "num_kv_heads", "head_dim")


def model_shape(cfg: ModelConfig) -> dict[str, int]:
    """What a projection file must match: layers, query heads, key/value heads, head dim."""
    heads = cfg.num_attention_heads
    return {"num_layers": cfg.num_layers, "num_heads": heads,
            "num_kv_heads": getattr(cfg, "num_kv_heads", None) or heads, "head_dim": cfg.head_dim}


def describe_shape(shape: dict[str, int]) -> str:
    return (f"{shape['num_layers']} layers, {shape['num_heads']} heads ({shape['num_kv_heads']} key/value), "
            f"head dim {shape['head_dim']}")


@dataclass
class Projections:
    """One method's projections at one ``d_proj`` for a model of ``shape``: ``weights[l]`` (d_proj, head_dim)."""

    method: str
    d_proj: int
    shape: dict[str, int]
    weights: dict[int, torch.Tensor] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)  # the checkpoint and its config hash

    def save(self, path: str | Path) -> Path:
        """Write the file (to a temporary name, then renamed into place)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"format": FORMAT, "version": VERSION, "method": self.method, "d_proj": str(self.d_proj),
                **{k: str(v) for k, v in self.shape.items()}, **self.source}
        tmp = path.with_name(TMP_PREFIX + path.name)
        save_safetensors({f"layers.{l}.weight": w.detach().to("cpu", torch.float32).contiguous()
                          for l, w in sorted(self.weights.items())}, tmp, metadata=meta)
        tmp.replace(path)
        return path


def load_projections(path: str | Path) -> Projections:
    """Read a projection file; a missing, unreadable or malformed one is a :class:`DimPOError`."""
    path = Path(path)
    if not path.is_file():
        raise DimPOError(f"projection file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise DimPOError(f"{path} is not a DimPO projection file (no '{FORMAT}' format tag)")
            if meta.get("version") != VERSION:
                raise DimPOError(f"{path}: projection file version {meta.get('version')}, this code reads {VERSION}")
            shape = {k: int(meta[k]) for k in SHAPE_KEYS}
            d_proj = int(meta["d_proj"])
            weights = {}
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                parts = name.split(".")
                if len(parts) != 3 or parts[0] != "layers" or parts[2] != "weight" or not parts[1].isdigit():
                    raise DimPOError(f"{path}: unexpected tensor '{name}'")
                weights[int(parts[1])] = f.get_tensor(name)
    except (SafetensorError, OSError, KeyError, ValueError) as e:
        if isinstance(e, DimPOError):
            raise
        raise DimPOError(f"{path} is not a readable projection file ({type(e).__name__}: {e})") from None
    source = {k: meta[k] for k in ("checkpoint", "config_hash") if k in meta}
    proj = Projections(meta["method"], d_proj, shape, weights, source)
    for l, w in weights.items():
        if not 0 <= l < shape["num_layers"] or tuple(w.shape) != (d_proj, shape["head_dim"]):
            raise DimPOError(f"{path}: layer {l} holds a {tuple(w.shape)} tensor, its metadata implies "
                             f"({d_proj}, {shape['head_dim']}) for layers 0..{shape['num_layers'] - 1}")
    if d_proj > shape["head_dim"]:
        raise DimPOError(f"{path}: d' = {d_proj} exceeds the head dim {shape['head_dim']}")
    return proj


def projected_layers(num_layers: int, last: int) -> list[int]:
    """The last ``last`` layers' indices (the paper projects from the top down, Fig. 1)."""
    if not 0 <= last <= num_layers:
        raise DimPOError(f"cannot project the last {last} layers of a model with {num_layers} layers")
    return list(range(num_layers - last, num_layers))


def check_projections(proj: Projections, cfg: ModelConfig, last: int, path: str | Path = "") -> list[int]:
    """The layers to project (the last ``last``) after checking that ``proj`` fits the model ``cfg`` and holds
    every one of them; a mismatch is a one-line :class:`DimPOError`."""
    where = f"{path}: " if path else ""
    shape = model_shape(cfg)
    if proj.shape != shape:
        raise DimPOError(f"{where}projections for a model of {describe_shape(proj.shape)}; this model has "
                         f"{describe_shape(shape)}")
    layers = projected_layers(shape["num_layers"], last)
    missing = [l for l in layers if l not in proj.weights]
    if missing:
        raise DimPOError(f"{where}no projection for layer(s) {', '.join(map(str, missing))} (the file holds "
                         f"{len(proj.weights)} of {shape['num_layers']} layers: an unfinished fit?)")
    return layers


def kv_cache_saving(last: int, num_layers: int, d_proj: int, head_dim: int) -> float:
    """Fraction of the KV cache saved by keys of ``d_proj`` dims in the last ``last`` of ``num_layers`` layers:
    ``last / num_layers * (1 - d_proj / head_dim) * 0.5`` (keys are half the cache, values unchanged)."""
    projected_layers(num_layers, last)
    if not 1 <= d_proj <= head_dim:
        raise DimPOError(f"d' must be in 1..{head_dim} (the head dim), got {d_proj}")
    return last / num_layers * (1.0 - d_proj / head_dim) * 0.5
