"""The model's tokenizer: which file, its special tokens, and encoding text without added special tokens.

**Where a model's tokenizer comes from.** A training run records the tokenizer it trains with: the config's
``vocab_file`` when it names one, else the tokenizer of the checkpoint it starts from (``load=``: an import by
``convert from-hf`` or another run). The files (``tokenizer.json`` and, when a ``tokenizer_config.json`` is beside
it, the :data:`TOKENIZER_FILES` there: special tokens, chat template) are copied into ``{save}/tokenizer/`` at
start and into every checkpoint, where the manifest checksums them and ``state.json`` records the sha256 of
``tokenizer.json``. Every command that reads a checkpoint (evaluation, downstream tasks, generation, export) then
uses the checkpoint's own tokenizer (:func:`tokenizer_file`); ``--tokenizer`` (or a ``vocab_file`` that differs
from the checkpoint's recorded tokenizer) is an error unless it is the same file, byte for byte; a tokenizer
with more ids than the model's embedding rows is an error. The bundled Pythia tokenizer
(``data/20B_tokenizer.json``) is used only where a config names it.

A ``tokenizer.json`` with a ``tokenizer_config.json`` beside it (a Hugging Face folder, or a model imported with
``convert from-hf``) has that file's ``bos_token``/``eos_token``/``unk_token`` (Llama-3: ``<|begin_of_text|>`` and
``<|end_of_text|>``; OLMo-2: ``<|endoftext|>``; Qwen: no bos). A bare ``tokenizer.json`` (Pythia's, shipped in
``data/``) has Pythia's convention: ``<|endoftext|>`` is bos, eos and unk. The rolling-window prefix is the token
lm-evaluation-harness would use: bos when the tokenizer has one, else eos.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from .config import ModelConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TOKENIZER = REPO_ROOT / "data" / "20B_tokenizer.json"
PREFIX_TOKEN = "<|endoftext|>"
# the special tokens of the Pythia tokenizer as the models use them (Hugging Face names)
SPECIAL_TOKENS = {"bos_token": PREFIX_TOKEN, "eos_token": PREFIX_TOKEN, "unk_token": PREFIX_TOKEN}
GENERATION_CONFIG = "generation_config.json"  # transformers' generation settings: the ids that end a generation
# A Hugging Face folder's tokenizer files (fast and slow formats) and its generation settings (the stop ids of
# :func:`stop_token_ids`): what an import, a run and a checkpoint carry.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", GENERATION_CONFIG)
RUN_TOKENIZER_DIR = "tokenizer"  # {save}/tokenizer/: the files a run trains with


class TokenizerError(ValueError):
    """A tokenizer that cannot be this model's, or none where one is needed; one line."""


def tokenizer_sha256(path: str | Path) -> str:
    """sha256 of a ``tokenizer.json`` file's bytes (what a checkpoint records)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_tokenizer(path: str | Path) -> Tokenizer:
    """``path`` loaded by ``tokenizers``; a file it cannot read is a :class:`TokenizerError` naming it."""
    p = Path(path)
    if not p.is_file():
        raise TokenizerError(f"tokenizer file not found: {p}")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise TokenizerError(f"{p} is not a tokenizer.json the tokenizers library can read "
                             f"({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})") from None


def id_span(tokenizer: Tokenizer) -> int:
    """1 + the largest id of the vocabulary, added tokens included: the embedding rows its ids need."""
    return 1 + max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)


def check_fits(path: str | Path, cfg: ModelConfig) -> None:
    """TokenizerError when the tokenizer file's ids do not fit the model's embedding (``padded_vocab_size``)."""
    span = id_span(read_tokenizer(path))
    if span > cfg.padded_vocab_size:
        raise TokenizerError(f"tokenizer {path} has ids up to {span - 1}, but the model has {cfg.padded_vocab_size} "
                             "embedding rows: it is not this model's tokenizer")


def recorded_tokenizer(model_dir: str | Path | None) -> Path | None:
    """The ``tokenizer.json`` a checkpoint, an import or a Hugging Face folder carries, or None."""
    if model_dir is None:
        return None
    candidate = Path(model_dir) / "tokenizer.json"
    return candidate if candidate.is_file() else None


def config_vocab_file(cfg: ModelConfig) -> Path | None:
    """The config's ``vocab_file`` (relative to the working directory or the repository), None when unset; an
    error when it is set but missing."""
    if cfg.tokenizer_type != "HFTokenizer":
        raise TokenizerError(f"tokenizer_type {cfg.tokenizer_type!r}: only Hugging Face tokenizer.json files are "
                             "read; pass --tokenizer PATH/tokenizer.json")
    if not cfg.vocab_file:
        return None
    candidates = [Path(cfg.vocab_file), REPO_ROOT / cfg.vocab_file]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    tried = dict.fromkeys(str(c.absolute()) for c in candidates)
    raise TokenizerError(f"vocab_file {cfg.vocab_file} was not found (looked for {' and '.join(tried)}): set "
                         "vocab_file to the model's tokenizer.json (the tools that read a model also take "
                         "--tokenizer)")


def tokenizer_file(cfg: ModelConfig | None = None, path: str | Path | None = None,
                   model_dir: Path | None = None, given_as: str = "--tokenizer") -> Path:
    """The model's ``tokenizer.json`` (module docstring), checked to fit ``cfg``'s embedding:

    - ``path`` when given (``given_as`` names it in errors); when ``model_dir`` records a tokenizer, ``path`` must
      be that same file, byte for byte;
    - else the tokenizer ``model_dir`` records (a checkpoint, an import, a Hugging Face folder);
    - else the config's ``vocab_file``;
    - else, only for a call without a config (tools such as ``eval.doc_lengths``), the bundled Pythia tokenizer.

    A model with no tokenizer anywhere is a :class:`TokenizerError` asking for ``--tokenizer``."""
    recorded = recorded_tokenizer(model_dir)
    if path is not None:
        chosen = Path(path)
        read_tokenizer(chosen)
        if recorded is not None and tokenizer_sha256(chosen) != tokenizer_sha256(recorded):
            raise TokenizerError(f"{given_as} {chosen} is not the tokenizer {model_dir} was trained with "
                                 f"({recorded}, sha256 {tokenizer_sha256(recorded)[:12]}): leave it out to use the "
                                 "checkpoint's own")
    elif recorded is not None:
        chosen = recorded
    elif cfg is not None:
        chosen = config_vocab_file(cfg)
        if chosen is None:
            where = model_dir if model_dir is not None else "the config"
            raise TokenizerError(f"{where} records no tokenizer (no tokenizer.json beside the weights, no vocab_file "
                                 "in its config): pass --tokenizer PATH/tokenizer.json")
    else:
        chosen = DEFAULT_TOKENIZER
    if cfg is not None:
        check_fits(chosen, cfg)
    return chosen


def companion_files(tokenizer_json: str | Path) -> list[Path]:
    """The tokenizer files that travel with ``tokenizer_json``: itself, and, when a ``tokenizer_config.json`` is
    beside it (a Hugging Face folder), the other :data:`TOKENIZER_FILES` there."""
    source = Path(tokenizer_json)
    out = [source]
    if (source.parent / "tokenizer_config.json").is_file():
        out += [source.parent / n for n in TOKENIZER_FILES[1:] if (source.parent / n).is_file()]
    return out


def copy_tokenizer(tokenizer_json: str | Path, out_dir: str | Path) -> list[str]:
    """Copy :func:`companion_files` of ``tokenizer_json`` into ``out_dir`` (the tokenizer as ``tokenizer.json``);
    returns the names written.

    For one chosen tokenizer file, which must exist and may have any name in any folder (a config's ``vocab_file``
    such as ``data/20B_tokenizer.json``, ``--tokenizer``, a run's or checkpoint's recorded copy): the files beside
    it travel only where a ``tokenizer_config.json`` makes the folder a Hugging Face one, the file
    :func:`special_tokens` reads the special tokens from. ``convert from-hf`` copies an imported folder with
    :func:`copy_tokenizer_files` instead, which takes whatever tokenizer files the folder holds."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for i, src in enumerate(companion_files(tokenizer_json)):
        name = "tokenizer.json" if i == 0 else src.name
        shutil.copyfile(src, out / name)
        names.append(name)
    return names


def record_run_tokenizer(tokenizer_json: str | Path, run_dir: str | Path) -> Path:
    """Copy the run's tokenizer into ``run_dir/tokenizer/`` (written aside, then renamed into place, so the folder
    is never half-written); returns the folder."""
    final = Path(run_dir) / RUN_TOKENIZER_DIR
    tmp = final.with_name(f".tmp-{RUN_TOKENIZER_DIR}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    copy_tokenizer(tokenizer_json, tmp)
    old = final.with_name(f".old-{RUN_TOKENIZER_DIR}-{os.getpid()}")
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def load_tokenizer(cfg: ModelConfig | None = None, path: str | Path | None = None,
                   model_dir: Path | None = None) -> Tokenizer:
    """The ``tokenizers`` tokenizer of :func:`tokenizer_file`."""
    return read_tokenizer(tokenizer_file(cfg, path, model_dir))


def special_tokens(path: str | Path) -> dict[str, str | None]:
    """``{"bos_token", "eos_token", "unk_token"}`` of the tokenizer file ``path``: from the ``tokenizer_config.json``
    beside it when there is one (a token may be None), else Pythia's :data:`SPECIAL_TOKENS`. As transformers reads
    a folder: a ``special_tokens_map.json`` beside a ``tokenizer_config.json`` without ``added_tokens_decoder``
    (the older format) gives the tokens it names."""
    folder = Path(path).parent
    config, legacy = folder / "tokenizer_config.json", folder / "special_tokens_map.json"
    if not config.is_file():
        return dict(SPECIAL_TOKENS)
    data = _json_object(config)
    if "added_tokens_decoder" not in data and legacy.is_file():
        data = {**data, **_json_object(legacy)}
    out = {}
    for name in SPECIAL_TOKENS:
        token = data.get(name)
        out[name] = token.get("content") if isinstance(token, dict) else token
    return out


def _json_object(path: Path) -> dict:
    """The JSON object in ``path``; a ValueError naming it when it is not one."""
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds no JSON object")
    return data


def special_token_ids(path: str | Path) -> dict[str, int | None]:
    """``{"bos", "eos"}`` ids of :func:`special_tokens` in the tokenizer file ``path`` (None: the tokenizer has
    no such token); a named token that is not in the vocabulary is an error."""
    tokenizer = read_tokenizer(path)
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


def stop_token_ids(path: str | Path) -> tuple[int, ...]:
    """The ids that end a generation with the tokenizer file ``path``: its eos (:func:`special_token_ids`), then
    those of the ``generation_config.json`` beside it in a Hugging Face folder (``eos_token_id``: one id or a list,
    as instruct models publish it: Llama-3's ``<|eot_id|>`` and ``<|end_of_text|>``, Qwen's ``<|im_end|>`` and
    ``<|endoftext|>``), each once; what transformers' ``generate`` stops at. A list that is not of ids in the
    vocabulary is a :class:`TokenizerError`."""
    eos = special_token_ids(path)["eos"]
    ids = [] if eos is None else [eos]
    folder = Path(path).parent
    if (folder / "tokenizer_config.json").is_file() and (folder / GENERATION_CONFIG).is_file():
        try:
            listed = json.loads((folder / GENERATION_CONFIG).read_text()).get("eos_token_id")
        except (ValueError, AttributeError) as e:
            raise TokenizerError(f"{folder / GENERATION_CONFIG} is not a JSON object ({e})") from None
        listed = [] if listed is None else listed if isinstance(listed, list) else [listed]
        size = read_tokenizer(path).get_vocab_size(with_added_tokens=True)
        if not all(type(i) is int and 0 <= i < size for i in listed):
            raise TokenizerError(f"{folder / GENERATION_CONFIG}: eos_token_id must be ids of the tokenizer's "
                                 f"{size} tokens, got {listed!r}")
        ids += listed
    return tuple(dict.fromkeys(ids))


def chat_template(path: str | Path) -> str | None:
    """The chat template that travels with the tokenizer file ``path`` (None: it has none): ``chat_template.jinja``
    beside it (transformers 5 writes it there), else ``tokenizer_config.json``'s ``chat_template`` (a string, or
    transformers' list of named templates, of which the ``default`` one)."""
    folder = Path(path).parent
    if not (folder / "tokenizer_config.json").is_file():
        return None
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    try:
        template = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    except (ValueError, AttributeError) as e:
        raise TokenizerError(f"{folder / 'tokenizer_config.json'} is not a JSON object ({e})") from None
    if isinstance(template, list):
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    return template if isinstance(template, str) else None


def hf_tokenizer(path: str | Path):
    """``path`` (a ``tokenizer.json``) as a ``transformers`` fast tokenizer with its :func:`special_tokens` and
    :func:`chat_template`."""
    from transformers import PreTrainedTokenizerFast

    special_token_ids(path)
    tokens = {k: v for k, v in special_tokens(path).items() if v is not None}
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path), clean_up_tokenization_spaces=False, **tokens)
    tok.chat_template = chat_template(path)
    return tok


def prefix_token_id(path: str | Path, token: str | None = None) -> int:
    """Id of the rolling-window prefix for the tokenizer file ``path``: ``token`` when given, else the one
    lm-evaluation-harness uses (``HFLM.prefix_token_id``: bos when the tokenizer has one, else eos)."""
    if token is not None:
        token_id = read_tokenizer(path).token_to_id(token)
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


def run_tokenizer(cfg: ModelConfig, start_dir: Path | None) -> Path | None:
    """The tokenizer a training run records (module docstring): the config's ``vocab_file``, else the one
    ``start_dir`` (the checkpoint it continues or starts from) records; None when neither names one (or the config
    names a SentencePiece model, which is not recorded). A ``vocab_file`` that differs from ``start_dir``'s recorded
    tokenizer, or that does not fit the model, is a :class:`TokenizerError`."""
    if cfg.tokenizer_type != "HFTokenizer":
        return None
    explicit = config_vocab_file(cfg)
    if explicit is None and recorded_tokenizer(start_dir) is None:
        return None
    return tokenizer_file(cfg, explicit, start_dir, given_as="vocab_file")


# ----------------------------------------------------------------------------------------------
# the tokenizer files of Hugging Face folders (convert)


def write_tokenizer(tokenizer_json: str | Path, cfg: ModelConfig, out: Path) -> dict[str, int | None]:
    """Copy ``tokenizer_json`` to ``out/tokenizer.json`` with the files that travel with it
    (:func:`copy_tokenizer`: an imported or recorded model's ``tokenizer_config.json`` with its
    special tokens and chat template, ``chat_template.jinja``, ``special_tokens_map.json``), else Pythia's special
    tokens (bos = eos = unk = ``<|endoftext|>``); write ``generation_config.json`` (bos, eos or every stop id of
    :func:`stop_token_ids`, the padding ids suppressed); returns the ``{"bos", "eos"}`` ids for ``config.json``.

    The tokenizer files are the run's own, unchanged, so every ``tokenizers`` version that read them reads them;
    a ``tokenizer_config.json`` we write names ``PreTrainedTokenizerFast``, the class transformers 4 and 5 both load
    from it."""
    from transformers import GenerationConfig

    source = Path(tokenizer_json)
    ids = special_token_ids(source)  # the folder's special tokens (a tokenizer_config.json beside it), else Pythia's
    names = copy_tokenizer(source, out)
    if "tokenizer_config.json" not in names:
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **SPECIAL_TOKENS,
                  "model_max_length": cfg.max_position_embeddings, "clean_up_tokenization_spaces": False}
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        (out / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS, indent=2) + "\n")
    padding = list(range(cfg.vocab_size, cfg.padded_vocab_size))  # embedding rows no token uses
    stops = stop_token_ids(source)
    GenerationConfig(bos_token_id=ids["bos"], eos_token_id=list(stops) if len(stops) > 1 else ids["eos"],
                     suppress_tokens=padding or None).save_pretrained(out)
    return ids



def copy_tokenizer_files(hf_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Copy the :data:`TOKENIZER_FILES` that the Hugging Face folder ``hf_dir`` holds into ``out_dir``, names
    unchanged; returns their names (``convert from-hf``: the import keeps the folder's tokenizer as it is).

    Not :func:`copy_tokenizer`, which starts from one ``tokenizer.json`` that must exist and
    takes the files beside it only when a ``tokenizer_config.json`` is there: this copies whatever the folder
    holds, including nothing (a model folder without a tokenizer imports, as tests/test_finetune.py's does), the
    slow formats without a ``tokenizer.json`` (``tokenizer.model``, ``vocab.json`` and ``merges.txt``), and
    ``special_tokens_map.json`` and the rest with no ``tokenizer_config.json``."""
    present = [name for name in TOKENIZER_FILES if (Path(hf_dir) / name).is_file()]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for name in present:
        shutil.copyfile(Path(hf_dir) / name, Path(out_dir) / name)
    return present



def check_tokenizer_json(path: str | Path) -> Tokenizer:
    """The tokenizer of the file ``path``; a ValueError when it does not load with ``tokenizers`` (garbage, or
    another format)."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception for every parse failure
        raise ValueError(f"{path} is not a Hugging Face tokenizer.json that tokenizers can load "
                         f"({str(e).splitlines()[0][:200]})") from None
