"""Load a model and its tokenizer for evaluation: a training checkpoint or a Hugging Face GPT-NeoX folder.

    loaded = load_for_eval("runs/pythia-70m-dar", device="cuda", dtype="bfloat16")
    loaded.model(input_ids)        # (B, T) -> (B, T, V) logits, eval mode, on ``device``
    loaded.info                    # {"checkpoint", "step", "config_hash", "attention_type"}
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from neox_dar.checkpoint import load_model
from neox_dar.config import Config
from neox_dar.model import CausalLM
from neox_dar.rundir import CONFIG, checkpoint_step, resolve_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TOKENIZER = REPO_ROOT / "data" / "20B_tokenizer.json"
PREFIX_TOKEN = "<|endoftext|>"
# the special tokens of the Pythia tokenizer as the models use them (Hugging Face names)
SPECIAL_TOKENS = {"bos_token": PREFIX_TOKEN, "eos_token": PREFIX_TOKEN, "unk_token": PREFIX_TOKEN}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: CausalLM
    cfg: Config
    info: dict
    model_dir: Path  # the folder holding the weights: a step directory or a Hugging Face folder


def is_hf_folder(path: str | Path) -> bool:
    """A Hugging Face model folder: ``config.json`` and no neox-dar ``config.yml`` beside it."""
    p = Path(path)
    return (p / "config.json").is_file() and not (p / CONFIG).is_file()


def config_hash(cfg: Config) -> str:
    """sha256 of the resolved config's YAML (the same model config always gives the same hash)."""
    return hashlib.sha256(cfg.to_yaml().encode("utf-8")).hexdigest()


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
        where, step = p, None
    else:
        where = resolve_checkpoint(p)
        model, cfg = load_model(where)
        step = checkpoint_step(where)
    if attention_impl is not None:
        cfg.attention_impl = attention_impl
        for module in model.attention_modules():
            module.impl = attention_impl
    model = model.to(device=device, dtype=DTYPES[dtype]).eval()
    info = {"checkpoint": str(where.resolve()), "step": step, "config_hash": config_hash(cfg),
            "attention_type": cfg.attention_type}
    return LoadedModel(model, cfg, info, where)


def tokenizer_file(cfg: Config | None = None, path: str | Path | None = None,
                   model_dir: Path | None = None) -> Path:
    """The model's ``tokenizer.json``: ``path`` if given; else ``model_dir/tokenizer.json`` (a Hugging Face
    folder, or a checkpoint written by ``convert from-hf``); else the config's ``vocab_file`` (relative to the
    working directory or the repository; an error when it is set but missing); else, for a config without
    ``vocab_file``, the bundled Pythia tokenizer."""
    if path is not None:
        if not Path(path).is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        return Path(path)
    if cfg is not None and cfg.tokenizer_type != "HFTokenizer":
        raise ValueError(f"tokenizer_type {cfg.tokenizer_type!r}: only Hugging Face tokenizer.json files are read; "
                         "pass --tokenizer PATH/tokenizer.json")
    if model_dir is not None and (Path(model_dir) / "tokenizer.json").is_file():
        return Path(model_dir) / "tokenizer.json"
    if cfg is not None and cfg.vocab_file:
        candidates = [Path(cfg.vocab_file), REPO_ROOT / cfg.vocab_file]
        for candidate in candidates:
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(f"the checkpoint's vocab_file was not found (tried {', '.join(map(str, candidates))}); "
                                "pass --tokenizer")
    return DEFAULT_TOKENIZER


def load_tokenizer(cfg: Config | None = None, path: str | Path | None = None,
                   model_dir: Path | None = None) -> Tokenizer:
    """The ``tokenizers`` tokenizer of :func:`tokenizer_file`."""
    return Tokenizer.from_file(str(tokenizer_file(cfg, path, model_dir)))


def special_token_id(path: str | Path) -> int:
    """Id of ``<|endoftext|>`` (bos = eos = unk = the rolling-window prefix) in the tokenizer file ``path``."""
    token_id = Tokenizer.from_file(str(path)).token_to_id(PREFIX_TOKEN)
    if token_id is None:
        raise ValueError(f"tokenizer {path} has no '{PREFIX_TOKEN}' token, which the models use as bos, eos and "
                         "document prefix")
    return token_id


def hf_tokenizer(path: str | Path):
    """``path`` (a ``tokenizer.json``) as a ``transformers`` fast tokenizer with :data:`SPECIAL_TOKENS`
    (an error when the vocabulary lacks ``<|endoftext|>``)."""
    from transformers import PreTrainedTokenizerFast

    special_token_id(path)
    return PreTrainedTokenizerFast(tokenizer_file=str(path), clean_up_tokenization_spaces=False, **SPECIAL_TOKENS)


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
