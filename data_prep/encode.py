"""Tokenizer loading and the per-piece work of ``data_prep.tokenize`` (run in its worker processes).

A piece is a short run of records (about ``PIECE_BYTES`` of text; one record when a document is
larger). :func:`encode_piece` validates and decodes each record, tokenizes the good ones in one
``encode_batch_fast`` call (no offsets), appends the end-of-document id to each and returns the
tokens as one flat array, so a worker's memory is bounded by one piece, not by a shard or a file.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import threading
import time
from dataclasses import dataclass

import numpy as np

EOD_TOKEN = "<|endoftext|>"
PIECE_BYTES = 1 << 20  # text per tokenizer call: bounds a worker's memory and balances the workers' load


class BadRecord(ValueError):
    """A record that is not a usable document (the message is the reason)."""


@dataclass(frozen=True)
class TokenizerSpec:
    """What a worker needs to rebuild the tokenizer: path, kind ("hf" or "spm"), EOD id, vocab size; and, for the
    manifest, the BOS id the tokenizer itself puts before each document (None: it adds none)."""

    path: str
    kind: str
    eod_id: int
    vocab_size: int
    bos_id: int | None = None


def _load(path: str, kind: str):
    if kind == "hf":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        tok.no_truncation()
        tok.no_padding()
        return tok
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=path)


def tokenizer_path(path: str) -> str:
    """``path`` itself, or for a model folder its ``tokenizer.json`` (else its SentencePiece ``tokenizer.model``)."""
    if os.path.isdir(path):
        for name in ("tokenizer.json", "tokenizer.model"):
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, name)
        raise FileNotFoundError(f"no tokenizer.json or tokenizer.model in {path}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"tokenizer not found: {path}")
    return path


def _config_eos(path: str) -> str | None:
    """The ``eos_token`` of the ``tokenizer_config.json`` beside ``path`` (a Hugging Face folder's), if any."""
    config = os.path.join(os.path.dirname(path), "tokenizer_config.json")
    if not os.path.isfile(config):
        return None
    try:
        token = json.loads(open(config, encoding="utf-8").read()).get("eos_token")
    except ValueError as e:
        raise ValueError(f"{config} is not valid JSON ({e})") from None
    return token.get("content") if isinstance(token, dict) else token


def load_tokenizer_spec(path: str, eod_id: int | None = None) -> TokenizerSpec:
    """Inspect a Hugging Face ``tokenizer.json`` or a SentencePiece ``.model`` (or a model folder holding one);
    find the EOD id and the BOS the tokenizer prepends.

    The EOD id is ``--eod-id`` when given, else ``<|endoftext|>`` when the vocabulary has it (Pythia, OLMo-2,
    Qwen: the document separator of their pretraining data), else the folder's ``tokenizer_config.json``
    ``eos_token`` (Llama-3: ``<|end_of_text|>``), for Hugging Face tokenizers; the model's ``eos_id`` for
    SentencePiece. Documents are encoded with the tokenizer's own special tokens, so a tokenizer whose
    post-processor prepends BOS (Llama-3's ``<|begin_of_text|>``) starts every document with it, as in its
    pretraining data (a bare SentencePiece ``.model`` adds none; Llama-2's folder has a ``tokenizer.json`` that
    does).
    """
    path = tokenizer_path(path)
    kind = "spm" if path.endswith(".model") else "hf"
    try:
        tok = _load(path, kind)
    except Exception as e:  # noqa: BLE001 - any parse failure becomes one clear line
        raise ValueError(f"{path}: not a {'SentencePiece model' if kind == 'spm' else 'Hugging Face tokenizer.json'}"
                         f" ({type(e).__name__}: {e})") from None
    if kind == "hf":
        vocab = tok.get_vocab_size(with_added_tokens=True)
        found = tok.token_to_id(EOD_TOKEN)
        if found is None and _config_eos(path) is not None:
            found = tok.token_to_id(_config_eos(path))
        plain, special = tok.encode("a", add_special_tokens=False).ids, tok.encode("a").ids
        bos = special[0] if special[1:1 + len(plain)] == plain and len(special) > len(plain) else None
    else:
        vocab = tok.get_piece_size()
        found = tok.eos_id() if tok.eos_id() >= 0 else None
        bos = None
    eod = eod_id if eod_id is not None else found
    if eod is None:
        raise ValueError(f"{path} has no {EOD_TOKEN} / EOS token; pass --eod-id")
    if not 0 <= eod < vocab:
        raise ValueError(f"EOD id {eod} is outside the vocabulary of {vocab} tokens")
    spec = TokenizerSpec(path=os.path.abspath(path), kind=kind, eod_id=int(eod), vocab_size=int(vocab), bos_id=bos)
    _TOKENIZERS[spec.path] = tok  # reused when this process tokenizes (--workers 1)
    return spec


_TOKENIZERS: dict[str, object] = {}  # path -> loaded tokenizer, one per process
_SPM_THREADS: int | None = None  # SentencePiece batch threads: its default (all cores), 1 in worker processes


def encode_texts(spec: TokenizerSpec, texts: list[str]) -> list[list[int]]:
    """Token ids of each text (no EOD), in one batch call (``encode_batch_fast``: no offsets are tracked)."""
    tok = _TOKENIZERS.get(spec.path)
    if tok is None:
        tok = _TOKENIZERS[spec.path] = _load(spec.path, spec.kind)
    if spec.kind == "hf":
        return [e.ids for e in tok.encode_batch_fast(texts)]
    return tok.encode(texts, num_threads=_SPM_THREADS)


def decode_record(kind: str, payload: object, text_key: str) -> str:
    """The document text of a record; :class:`BadRecord` with the reason when it has none."""
    if kind == "missing":
        raise BadRecord(f"missing text field {text_key!r}")
    if kind == "json":
        obj = load_json(payload)
        if not isinstance(obj, dict) or text_key not in obj:
            raise BadRecord(f"missing text field {text_key!r}")
        text = obj[text_key]
    elif kind == "text":
        text = decode_utf8(payload)
    else:
        text = payload
    if text is None:
        raise BadRecord(f"missing text field {text_key!r}")
    if not isinstance(text, str):
        raise BadRecord(f"text field {text_key!r} is a {type(text).__name__}, not a string")
    if not text.strip():
        raise BadRecord("empty document")
    check_unicode(text)
    return text


def decode_utf8(payload: bytes) -> str:
    """``payload`` as UTF-8 text; :class:`BadRecord` naming the first invalid byte."""
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRecord(f"invalid UTF-8: byte 0x{payload[e.start]:02x} at offset {e.start}") from None


def load_json(payload: bytes) -> object:
    """The value of one JSON line; :class:`BadRecord` for invalid UTF-8, malformed JSON, or nesting deeper than
    Python's recursion limit (which ``json`` reports as a RecursionError)."""
    text = decode_utf8(payload)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRecord(f"malformed JSON: {json_error(e)}") from None
    except RecursionError:
        raise BadRecord("malformed JSON: nested too deeply") from None


def check_unicode(text: str, where: str = "") -> None:
    """:class:`BadRecord` when ``text`` cannot be written as UTF-8: a lone surrogate (JSON's ``"\\ud800"``, or an
    undecodable byte kept by Python's ``surrogateescape``); ``where`` prefixes the reason."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRecord(f"{where}invalid Unicode (lone surrogate escape)") from None


def json_error(e: json.JSONDecodeError) -> str:
    """``Invalid control character at line 1 column 23 (char 22)``: the message with its position."""
    at = "" if e.msg.endswith(" at") else " at"
    return f"{e.msg}{at} line {e.lineno} column {e.colno} (char {e.pos})"


def encode_piece(records: list, spec: TokenizerSpec, text_key: str, dtype: str) -> dict:
    """Tokenize one piece of records; returns its result for the shard it belongs to.

    Result: records (count), tokens [T] (every good document's ids followed by the EOD id,
    back to back, of ``dtype``), sizes int64 [D] (tokens per good document, EOD included),
    bad [[source, line, reason], ...], peak_rss_mb (this process's peak resident memory so far).
    """
    texts, bad = [], []
    for src, line, kind, payload in records:
        try:
            texts.append(decode_record(kind, payload, text_key))
        except BadRecord as e:
            bad.append([src, line, str(e)])
    ids = encode_texts(spec, texts) if texts else []
    sizes = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
    tokens = np.empty(int(sizes.sum()), dtype=dtype)
    ends = np.cumsum(sizes)
    for x, end in zip(ids, ends):
        tokens[end - 1 - len(x):end - 1] = x
    tokens[ends - 1] = spec.eod_id
    return {"records": len(records), "tokens": tokens, "sizes": sizes, "bad": bad,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def init_worker(single_thread: bool, parent_pid: int) -> None:
    """Worker-process start: one tokenizer thread per worker when several workers share the cores, Ctrl-C left to
    the main process (it stops the workers), and a watchdog that ends the worker if the main process dies (a
    SIGKILLed run leaves no orphans)."""
    global _SPM_THREADS
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if single_thread:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        _SPM_THREADS = 1

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()
