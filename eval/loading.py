"""Load a model and its tokenizer for evaluation: a training checkpoint or a Hugging Face GPT-NeoX folder.

    loaded = load_for_eval("runs/pythia-70m-dar", device="cuda", dtype="bfloat16")
    loaded.model(input_ids)        # (B, T) -> (B, T, V) logits, eval mode, on ``device``
    loaded.info                    # {"checkpoint", "step", "config_hash", "attention_type"}
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from neox_dar.checkpoint import CONFIG, load_model, resolve_checkpoint
from neox_dar.config import Config
from neox_dar.model import CausalLM

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TOKENIZER = REPO_ROOT / "data" / "20B_tokenizer.json"
PREFIX_TOKEN = "<|endoftext|>"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: CausalLM
    cfg: Config
    info: dict
    hf_dir: Path | None = None


def is_hf_folder(path: str | Path) -> bool:
    """A Hugging Face model folder: ``config.json`` and no neox-dar ``config.yml`` beside it."""
    p = Path(path)
    return (p / "config.json").is_file() and not (p / CONFIG).is_file()


def config_hash(cfg: Config) -> str:
    """sha256 of the resolved config's YAML (the same model config always gives the same hash)."""
    return hashlib.sha256(cfg.to_yaml().encode("utf-8")).hexdigest()


def _checkpoint_step(step_dir: Path) -> int | None:
    state = step_dir / "state.json"
    if state.is_file():
        step = json.loads(state.read_text()).get("step")
        if step is not None:
            return int(step)
    match = re.fullmatch(r"step_(\d+)", step_dir.name)
    return int(match.group(1)) if match else None


def load_for_eval(path: str | Path, device: str | torch.device = "cpu", dtype: str = "float32",
                  attention_impl: str | None = None) -> LoadedModel:
    """The model at ``path`` in eval mode on ``device`` in ``dtype`` (``float32``, ``bfloat16``, ``float16``).

    ``attention_impl`` overrides the checkpoint's ``attention_impl`` (``reference``, ``sdpa``, ``triton``).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got '{dtype}'")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"checkpoint not found: {p}")
    if is_hf_folder(p):
        from neox_dar.convert import from_hf

        model, cfg = from_hf(p)
        where, step, hf_dir = p, None, p
    else:
        where = resolve_checkpoint(p)
        model, cfg = load_model(where)
        step, hf_dir = _checkpoint_step(where), None
    if attention_impl is not None:
        cfg.attention_impl = attention_impl
        for module in model.attention_modules():
            module.impl = attention_impl
    model = model.to(device=device, dtype=DTYPES[dtype]).eval()
    info = {"checkpoint": str(where.resolve()), "step": step, "config_hash": config_hash(cfg),
            "attention_type": cfg.attention_type}
    return LoadedModel(model, cfg, info, hf_dir)


def load_tokenizer(cfg: Config | None = None, path: str | Path | None = None,
                   hf_dir: Path | None = None) -> Tokenizer:
    """The tokenizer: ``path`` if given; else the HF folder's ``tokenizer.json``; else the config's
    ``vocab_file`` (relative to the working directory or the repository; an error when it is set but missing);
    else, for a config without ``vocab_file``, the bundled Pythia tokenizer."""
    if path is not None:
        if not Path(path).is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        return Tokenizer.from_file(str(path))
    if cfg is not None and cfg.tokenizer_type != "HFTokenizer":
        raise ValueError(f"tokenizer_type {cfg.tokenizer_type!r}: evaluation reads Hugging Face tokenizer.json files "
                         "only; pass --tokenizer PATH/tokenizer.json")
    if hf_dir is not None and (hf_dir / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    if cfg is not None and cfg.vocab_file:
        candidates = [Path(cfg.vocab_file), REPO_ROOT / cfg.vocab_file]
        for candidate in candidates:
            if candidate.is_file():
                return Tokenizer.from_file(str(candidate))
        raise FileNotFoundError(f"the checkpoint's vocab_file was not found (tried {', '.join(map(str, candidates))}); "
                                "pass --tokenizer")
    return Tokenizer.from_file(str(DEFAULT_TOKENIZER))


def prefix_token_id(tokenizer: Tokenizer, token: str = PREFIX_TOKEN) -> int:
    """Id of the rolling-window prefix token (lm-eval uses the tokenizer's end-of-text token)."""
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"the tokenizer has no '{token}' token; pass --prefix-token")
    return token_id


def encode_texts(tokenizer: Tokenizer, texts: list[str], chunk: int = 1024) -> list[np.ndarray]:
    """Token ids of each text (no special tokens added), int64 arrays; encoded ``chunk`` texts at a time so a
    large corpus never holds all its ``Encoding`` objects at once."""
    out: list[np.ndarray] = []
    for i in range(0, len(texts), chunk):
        encodings = tokenizer.encode_batch(texts[i:i + chunk], add_special_tokens=False)
        out += [np.asarray(e.ids, dtype=np.int64) for e in encodings]
    return out
