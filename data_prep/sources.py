"""Input discovery and record streams for ``python -m data_prep.tokenize``.

An input is a file, a glob, or a Hugging Face dataset written ``hf:NAME[:CONFIG][@SPLIT]``
(streamed with the ``datasets`` library; split ``train`` by default). Files are read by suffix:

* ``.jsonl`` / ``.json`` (one JSON object per line), optionally ``.gz`` or ``.zst`` compressed:
  each non-blank line is one record, the document is its ``--text-key`` field;
* ``.parquet``: each row is one record, the document is the ``--text-key`` column;
* ``.txt``: ``--txt-mode file`` (default) makes the whole file one document;
  ``--txt-mode paragraph`` makes every block of lines separated by blank lines one document.

Records carry their raw payload (bytes for JSON lines and text, a Python value for parquet and
Hugging Face rows) plus their source and 1-based line (or row) number; parsing and validation
happen in the tokenizer workers (:func:`data_prep.encode.decode_record`). Fully blank JSON
lines are not records (a trailing newline is no error).
"""

from __future__ import annotations

import glob
import gzip
import io
import os
import random
from dataclasses import dataclass
from typing import Iterator

# A record: (source index, 1-based line or row, kind, payload). Kinds:
#   "json"  payload bytes of one JSON line       "text"    payload bytes of a text document
#   "value" payload str or None (parquet/HF)     "missing" the row has no text field
Record = tuple[int, int, str, object]

FILE_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".parquet", ".txt")


class InputError(ValueError):
    """An input that cannot be found or read."""


@dataclass(frozen=True)
class Source:
    """One input: a local file (``path``, ``size`` bytes) or a Hugging Face dataset (``hf`` spec)."""

    path: str
    size: int | None = None
    mtime_ns: int | None = None
    hf: tuple[str, str | None, str] | None = None  # (name, config, split)

    def describe(self) -> dict:
        if self.hf:
            return {"hf_dataset": self.hf[0], "config": self.hf[1], "split": self.hf[2]}
        return {"path": self.path, "bytes": self.size}


def parse_hf(spec: str) -> tuple[str, str | None, str]:
    """``hf:NAME[:CONFIG][@SPLIT]`` -> (name, config, split)."""
    body = spec[3:]
    body, _, split = body.partition("@")
    name, _, config = body.partition(":")
    if not name:
        raise InputError(f"bad Hugging Face input {spec!r}; write hf:NAME[:CONFIG][@SPLIT]")
    return name, config or None, split or "train"


def _kind(path: str) -> str:
    for suffix in FILE_SUFFIXES:
        if path.endswith(suffix):
            return suffix
    raise InputError(f"{path}: unsupported input type (expected one of {', '.join(FILE_SUFFIXES)})")


def expand_inputs(patterns: list[str], seed: int) -> list[Source]:
    """Files and HF datasets named by ``patterns`` (globs expanded, duplicates removed), sorted, then
    shuffled with ``random.Random(seed)``: the document order depends only on the inputs and the seed."""
    found: dict[str, Source] = {}
    for pat in patterns:
        if pat.startswith("hf:"):
            found[pat] = Source(path=pat, hf=parse_hf(pat))
            continue
        matches = sorted(glob.glob(pat)) if glob.has_magic(pat) else [pat]
        if not matches:
            raise InputError(f"no input matches {pat!r}")
        for m in matches:
            if not os.path.isfile(m):
                raise InputError(f"input is not a file: {m}" if os.path.exists(m) else f"input not found: {m}")
            _kind(m)
            st = os.stat(m)
            found[os.path.abspath(m)] = Source(path=os.path.abspath(m), size=st.st_size, mtime_ns=st.st_mtime_ns)
    sources = [found[k] for k in sorted(found)]
    random.Random(seed).shuffle(sources)
    return sources


class _ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a .zst file's frames, one after another; a file that ends inside a frame (a cut
    download) is an :class:`InputError` (zstandard's stream reader returns what it had, as if the file ended)."""

    def __init__(self, raw, path: str):
        import zstandard

        self.raw, self.path, self.dctx = raw, path, zstandard.ZstdDecompressor()
        self.frame, self.in_frame, self.pending, self.at = self.dctx.decompressobj(), False, b"", 0
        self.produced = 0  # decompressed bytes so far: an error after some is damage, not a file that is not zstd

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.at == len(self.pending):
            chunk = self.raw.read(1 << 20)
            if not chunk:
                if self.in_frame:
                    raise InputError(f"{self.path}: the file ends inside a zstd frame (cut short?)")
                return 0
            self.pending, self.at = self._decompress(chunk), 0
        n = min(len(buffer), len(self.pending) - self.at)
        buffer[:n] = self.pending[self.at:self.at + n]
        self.at += n
        return n

    def _decompress(self, data: bytes) -> bytes:
        out = []
        while data:
            out.append(self.frame.decompress(data))
            self.produced += len(out[-1])
            self.in_frame = not self.frame.eof
            data = self.frame.unused_data if self.frame.eof else b""
            if self.frame.eof:
                self.frame = self.dctx.decompressobj()
        return b"".join(out)


def _open_lines(path: str) -> tuple[io.BufferedReader, io.BufferedReader]:
    raw = open(path, "rb")
    if path.endswith(".gz"):
        return raw, io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), buffer_size=1 << 20)
    if path.endswith(".zst"):
        return raw, io.BufferedReader(_ZstdFrames(raw, path), buffer_size=1 << 20)
    return raw, raw


def iter_source(idx: int, src: Source, text_key: str, txt_mode: str) -> Iterator[tuple[Record, int]]:
    """(record, bytes of this source consumed so far) for every record of ``src``."""
    if src.hf:
        yield from _iter_hf(idx, src, text_key)
        return
    path = src.path
    kind = _kind(path)
    if kind == ".parquet":
        yield from _iter_parquet(idx, src, text_key)
    elif kind == ".txt":
        yield from _iter_txt(idx, src, txt_mode)
    else:
        raw, stream = _open_lines(path)
        with raw:
            pos = raw.tell  # compressed bytes consumed, for progress
            lineno = 0
            try:
                for lineno, line in enumerate(stream, 1):
                    if line.strip():
                        yield (idx, lineno, "json", line), pos()
            except (EOFError, gzip.BadGzipFile) as e:  # a .gz cut short, or not gzip
                after = f"after line {lineno}; " if lineno else ""
                raise InputError(f"{path}: {e} ({after}cut short?)") from None
            except Exception as e:
                if type(e).__name__ == "ZstdError":  # zstandard's: not zstd at all, or damaged after some data
                    done = stream.raw.produced
                    what = (f"corrupt zstd data after {done:,} decompressed bytes"
                            + (f", line {lineno} read" if lineno else "") if done else "not a zstd stream")
                    raise InputError(f"{path}: {what} ({e})") from None
                raise


def _iter_txt(idx: int, src: Source, txt_mode: str) -> Iterator[tuple[Record, int]]:
    with open(src.path, "rb") as f:
        if txt_mode == "file":
            yield (idx, 1, "text", f.read()), src.size
            return
        block: list[bytes] = []
        start = 0
        for lineno, line in enumerate(f, 1):
            if line.strip():
                if not block:
                    start = lineno
                block.append(line)
            elif block:
                yield (idx, start, "text", b"".join(block).rstrip(b"\r\n")), f.tell()
                block = []
        if block:
            yield (idx, start, "text", b"".join(block).rstrip(b"\r\n")), src.size


def _iter_parquet(idx: int, src: Source, text_key: str) -> Iterator[tuple[Record, int]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(src.path)
    except pa.ArrowException as e:  # pyarrow's message names no file
        raise InputError(f"{src.path}: not a readable parquet file ({e})") from None
    if text_key not in pf.schema_arrow.names:
        raise InputError(f"{src.path}: no column {text_key!r} (columns: {', '.join(pf.schema_arrow.names)})")
    total = max(1, pf.metadata.num_rows)
    row = 0
    for batch in pf.iter_batches(columns=[text_key], batch_size=4096):
        for value in batch.column(0).to_pylist():
            row += 1
            yield (idx, row, "value", value), src.size * row // total


def _iter_hf(idx: int, src: Source, text_key: str) -> Iterator[tuple[Record, int]]:
    try:
        import datasets
    except ImportError:
        raise InputError(f"{src.path}: reading Hugging Face datasets needs the `datasets` package "
                         "(pip install datasets)") from None
    name, config, split = src.hf
    stream = datasets.load_dataset(name, config, split=split, streaming=True)
    for row, example in enumerate(stream, 1):
        if text_key in example:
            yield (idx, row, "value", example[text_key]), 0
        else:
            yield (idx, row, "missing", None), 0


def iter_records(sources: list[Source], text_key: str, txt_mode: str) -> Iterator[tuple[Record, int]]:
    """(record, input bytes consumed so far over all sources) for every record, in source order."""
    done = 0
    for i, src in enumerate(sources):
        for rec, pos in iter_source(i, src, text_key, txt_mode):
            yield rec, done + pos
        done += src.size or 0
