"""The model's tokenizer: which file, its special tokens, and encoding text without added special tokens.

Every neox-dar model uses ``<|endoftext|>`` as bos, eos and unk, and as the rolling-window prefix (as
lm-evaluation-harness does for GPT-NeoX tokenizers).
"""

from __future__ import annotations

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
