"""The model's tokenizer: which file, its special tokens, and encoding text without added special tokens.

A ``tokenizer.json`` with a ``tokenizer_config.json`` beside it (a Hugging Face folder, or a model imported with
``convert from-hf``) has that file's ``bos_token``/``eos_token``/``unk_token`` (Llama-3: ``<|begin_of_text|>`` and
``<|end_of_text|>``; OLMo-2: ``<|endoftext|>``; Qwen: no bos). A bare ``tokenizer.json`` (Pythia's, shipped in
``data/``) has Pythia's convention: ``<|endoftext|>`` is bos, eos and unk. The rolling-window prefix is the token
lm-evaluation-harness would use: bos when the tokenizer has one, else eos.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from .config import ModelConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TOKENIZER = REPO_ROOT / "data" / "20B_tokenizer.json"
PREFIX_TOKEN = "<|endoftext|>"
# the special tokens of the Pythia tokenizer as the models use them (Hugging Face names)
SPECIAL_TOKENS = {"bos_token": PREFIX_TOKEN, "eos_token": PREFIX_TOKEN, "unk_token": PREFIX_TOKEN}


def tokenizer_file(cfg: ModelConfig | None = None, path: str | Path | None = None,
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


def load_tokenizer(cfg: ModelConfig | None = None, path: str | Path | None = None,
                   model_dir: Path | None = None) -> Tokenizer:
    """The ``tokenizers`` tokenizer of :func:`tokenizer_file`."""
    return Tokenizer.from_file(str(tokenizer_file(cfg, path, model_dir)))


def special_tokens(path: str | Path) -> dict[str, str | None]:
    """``{"bos_token", "eos_token", "unk_token"}`` of the tokenizer file ``path``: from the ``tokenizer_config.json``
    beside it when there is one (a token may be None), else Pythia's :data:`SPECIAL_TOKENS`."""
    config = Path(path).parent / "tokenizer_config.json"
    if not config.is_file():
        return dict(SPECIAL_TOKENS)
    try:
        data = json.loads(config.read_text())
    except ValueError as e:
        raise ValueError(f"{config} is not valid JSON ({e})") from None
    out = {}
    for name in SPECIAL_TOKENS:
        token = data.get(name)
        out[name] = token.get("content") if isinstance(token, dict) else token
    return out


def special_token_ids(path: str | Path) -> dict[str, int | None]:
    """``{"bos", "eos"}`` ids of :func:`special_tokens` in the tokenizer file ``path`` (None: the tokenizer has
    no such token); a named token that is not in the vocabulary is an error."""
    tokenizer = Tokenizer.from_file(str(path))
    names = special_tokens(path)
    if names["bos_token"] is None and names["eos_token"] is None:
        raise ValueError(f"tokenizer {path} has neither a bos nor an eos token")
    ids = {}
    for key in ("bos", "eos"):
        name = names[f"{key}_token"]
        ids[key] = None if name is None else tokenizer.token_to_id(name)
        if name is not None and ids[key] is None:
            raise ValueError(f"tokenizer {path}: its {key}_token {name!r} is not in the vocabulary")
    return ids


def hf_tokenizer(path: str | Path):
    """``path`` (a ``tokenizer.json``) as a ``transformers`` fast tokenizer with its :func:`special_tokens`."""
    from transformers import PreTrainedTokenizerFast

    special_token_ids(path)
    tokens = {k: v for k, v in special_tokens(path).items() if v is not None}
    return PreTrainedTokenizerFast(tokenizer_file=str(path), clean_up_tokenization_spaces=False, **tokens)


def prefix_token_id(path: str | Path, token: str | None = None) -> int:
    """Id of the rolling-window prefix for the tokenizer file ``path``: ``token`` when given, else the one
    lm-evaluation-harness uses (``HFLM.prefix_token_id``: bos when the tokenizer has one, else eos)."""
    if token is not None:
        token_id = Tokenizer.from_file(str(path)).token_to_id(token)
        if token_id is None:
            raise ValueError(f"tokenizer {path} has no {token!r} token")
        return token_id
    ids = special_token_ids(path)
    return ids["bos"] if ids["bos"] is not None else ids["eos"]


def encode_texts(tokenizer: Tokenizer, texts: list[str], chunk: int = 1024) -> list[np.ndarray]:
    """Token ids of each text (no special tokens added), int64 arrays; encoded ``chunk`` texts at a time so a
    large corpus never holds all its ``Encoding`` objects at once."""
    out: list[np.ndarray] = []
    for i in range(0, len(texts), chunk):
        encodings = tokenizer.encode_batch(texts[i:i + chunk], add_special_tokens=False)
        out += [np.asarray(e.ids, dtype=np.int64) for e in encodings]
    return out
