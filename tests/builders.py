"""Configs and models the tests build again and again (tiny shapes, validated like a user's config)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from neox_dar.config import Config, ModelConfig, load_config
from neox_dar.families import FAMILIES
from neox_dar.model import CausalLM, build_model
from neox_dar.tiny_hf_model import tiny_hf_model as hf_tiny

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yml"


def config(*files: str | Path, quiet: bool = True, **keys) -> Config:
    """A validated config: ``files`` (paths relative to the repository) layered, then ``keys`` as flat keys;
    with ``quiet``, config warnings (keys a variant does not read, uneven MSWA groups) are not shown."""
    overrides = [f"{k}={json.dumps(v)}" for k, v in keys.items()]
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        return load_config(*(ROOT / f for f in files), overrides=overrides)


def model_config(quiet: bool = True, **keys) -> ModelConfig:
    """The model section of a config made of flat ``keys`` only (no files)."""
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        return Config.from_flat(keys).model


def tiny_model(seed: int = 0, **keys) -> tuple[CausalLM, ModelConfig]:
    """A randomly initialised model of ``configs/tiny.yml`` with ``keys`` changed, in eval mode."""
    cfg = config("configs/tiny.yml", **keys).model
    torch.manual_seed(seed)
    return build_model(cfg).eval(), cfg


def attention_config(attention_type: str, impl: str = "sdpa", H: int = 4, d_h: int = 16, num_layers: int = 2,
                     **keys) -> ModelConfig:
    """A small model config for one attention variant: H heads of d_h dims, on the ``impl`` path."""
    return model_config(num_layers=num_layers, hidden_size=H * d_h, num_attention_heads=H,
                        attention_type=attention_type, attention_impl=impl, **keys)


def saved_model(out_dir: Path, *overrides: str, seed: int = 0, perturb: float = 0.0) -> tuple[CausalLM, ModelConfig]:
    """A tiny random model (``configs/tiny.yml`` and ``key=value`` overrides; every parameter moved by ``perturb``
    standard deviations, so norms and biases matter), saved with ``save_weights`` into ``out_dir``."""
    from neox_dar.saved_model import save_weights

    cfg = load_config(TINY, overrides=list(overrides)).model
    torch.manual_seed(seed)
    model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * perturb)
    save_weights(model, cfg, out_dir)
    return model.eval(), cfg


def saved_run(run_dir: Path, *overrides: str, seed: int = 0) -> tuple[CausalLM, ModelConfig]:
    """A run directory whose one checkpoint (step 7, in its name and its state, as training writes it) is
    :func:`saved_model` at seq_length 32, perturbed by 0.05."""
    from neox_dar.rundir import write_manifest

    step_dir = run_dir / "checkpoints" / "step_00000007"
    out = saved_model(step_dir, "seq_length=32", *overrides, seed=seed, perturb=0.05)
    write_manifest(step_dir, {"step": 7})
    return out


def published_checkpoint(root: Path, step: int, weights: bytes = b"w" * 64) -> Path:
    """A step directory under ``root`` as training publishes one (files, manifest last, renamed into place), with
    small stand-in files instead of real weights."""
    from neox_dar.rundir import TMP_PREFIX, WEIGHTS, publish, step_dir_name, write_manifest

    tmp = root / (TMP_PREFIX + step_dir_name(step))
    tmp.mkdir(parents=True)
    (tmp / WEIGHTS).write_bytes(weights)
    (tmp / "rng_rank00000.pt").write_bytes(b"r" * 16)
    write_manifest(tmp, {"step": step, "consumed_samples": 8 * step})
    publish(tmp, root / step_dir_name(step))
    return root / step_dir_name(step)


# ----------------------------------------------------------------------------------------------
# tiny Hugging Face models of each family (transformers' own classes, random weights: neox_dar.tiny_hf_model)

FAMILY_PRESETS = {name: family.preset for name, family in FAMILIES.items()}  # every registered family
# a preset shrunk to a tiny model of its family (GQA on where the family has it), for Pythia-tokenized data
TINY_FAMILY_KEYS = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2, "head_dim": 16,
                    "intermediate_size": 96, "vocab_size": 50277, "seq_length": 32, "max_position_embeddings": 2048}
TINY_FAMILY = [f"{k}={v}" for k, v in TINY_FAMILY_KEYS.items()]


def hf_folder(out: Path, family: str, shard: str = "60KB", **kwargs):
    """:func:`hf_tiny` saved with ``save_pretrained`` into ``out``, sharded (``shard`` per file); returns the
    model."""
    model = hf_tiny(family, **kwargs)
    model.save_pretrained(out, max_shard_size=shard)
    return model
