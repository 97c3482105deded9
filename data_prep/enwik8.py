"""enwik8's standard split as byte-level datasets (MSWA paper Table 2 and 3; Transformer-XL's ``prep_enwik8.py``).

    python -m data_prep.enwik8 INPUT --out PREFIX [--test-bytes 5000000]

INPUT is ``enwik8`` (the first 10^8 bytes of an English Wikipedia XML dump) or ``enwik8.zip``. The split is by
bytes: the last ``--test-bytes`` bytes are the test split, the ``--test-bytes`` before them the validation split,
everything before that the training split (90M / 5M / 5M for enwik8). Each split is written as one document of
byte-level token ids (id = byte value, :mod:`data_prep.byte_tokenizer`; no end-of-document token), in
``PREFIX_train``, ``PREFIX_valid``, ``PREFIX_test`` (``.bin`` + ``.idx``), plus the validation and test bytes as
``PREFIX_valid.raw`` and ``PREFIX_test.raw`` for the rolling evaluation (``eval.perplexity --corpora enwik8``) and
``PREFIX.manifest.json``. Files are written under temporary names and renamed into place together, with Ctrl-C
and SIGTERM held, so a rerun with another ``--test-bytes`` never leaves one split beside the other run's. Train with
``vocab_file: data/byte_tokenizer.json``, ``vocab_size: 257``, ``train_data_paths: [PREFIX_train]``,
``valid_data_paths: [PREFIX_valid]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

from neox_dar.data.identity import sha256_file
from neox_dar.data.indexed import IndexedDatasetWriter, best_dtype, bin_path, idx_path
from neox_dar.rundir import uninterrupted

from .byte_tokenizer import DEFAULT_PATH as BYTE_TOKENIZER
from .tokenize import parse_count

ENWIK8_BYTES = 100_000_000
TEST_BYTES = 5_000_000
VOCAB_SIZE = 257  # 256 bytes + <|endoftext|>


class Enwik8Error(RuntimeError):
    """A problem that stops the run; printed as one line."""


def read_input(path: str) -> bytes:
    """The bytes of ``path``, or of the one member of a ``.zip`` (``enwik8`` in the official archive)."""
    if os.path.isdir(path):
        raise Enwik8Error(f"{path} is a folder: name the enwik8 file or enwik8.zip")
    if not os.path.isfile(path):
        raise Enwik8Error(f"input not found: {path}")
    if not zipfile.is_zipfile(path):
        return Path(path).read_bytes()
    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if not n.endswith("/")]
            name = "enwik8" if "enwik8" in names else (names[0] if len(names) == 1 else None)
            if name is None:
                raise Enwik8Error(f"{path}: expected one file (or 'enwik8') in the archive, found {names}")
            return z.read(name)
    except zipfile.BadZipFile as e:
        raise Enwik8Error(f"{path}: corrupt zip archive ({e})") from None


def split(data: bytes, test_bytes: int) -> dict[str, bytes]:
    """``{"train", "valid", "test"}``: all but the last ``2 * test_bytes``, the next ``test_bytes``, the last."""
    if len(data) <= 2 * test_bytes:
        raise Enwik8Error(f"the input holds {len(data):,} bytes: too few for a validation and a test split of "
                          f"{test_bytes:,} bytes each and a training split")
    return {"train": data[:-2 * test_bytes], "valid": data[-2 * test_bytes:-test_bytes], "test": data[-test_bytes:]}


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def write_split(prefix: str, data: bytes) -> list[str]:
    """One document of byte ids as ``prefix.bin/.idx`` under temporary names; returns the final paths (each
    written as ``PATH.writing``, for :func:`rename_written`)."""
    tmp = f"{prefix}.writing"
    writer = IndexedDatasetWriter(tmp, best_dtype(VOCAB_SIZE))
    writer.add_document(np.frombuffer(data, dtype=np.uint8))
    writer.finalize()
    os.replace(bin_path(tmp), f"{bin_path(prefix)}.writing")
    os.replace(idx_path(tmp), f"{idx_path(prefix)}.writing")
    return [bin_path(prefix), idx_path(prefix)]


def write_bytes(path: str, data: bytes) -> list[str]:
    """``data`` as ``PATH.writing``, fsynced; returns ``[path]`` (for :func:`rename_written`)."""
    with open(f"{path}.writing", "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return [path]


def rename_written(paths: list[str]) -> None:
    """Each ``PATH.writing`` renamed to ``PATH``, all of them with Ctrl-C and SIGTERM held."""
    with uninterrupted():
        for path in paths:
            os.replace(f"{path}.writing", path)


def run(argv: list[str] | None = None) -> dict:
    """Run the command line; returns the manifest."""
    p = argparse.ArgumentParser(prog="python -m data_prep.enwik8", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[2:]) + "\n\nDetails: docs/data.md",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="enwik8 or enwik8.zip")
    p.add_argument("--out", required=True, metavar="PREFIX", help="output prefix: PREFIX_train.bin, ...")
    p.add_argument("--test-bytes", type=parse_count, default=TEST_BYTES,
                   help="bytes in each of the validation and test splits (default 5M, the standard split)")
    args = p.parse_args(argv)
    t0 = time.time()
    data = read_input(args.input)
    parts = split(data, args.test_bytes)
    if len(data) != ENWIK8_BYTES:
        print(f"data_prep.enwik8: note: the input holds {len(data):,} bytes, not enwik8's {ENWIK8_BYTES:,}; "
              "split by the same rule", file=sys.stderr)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    written = []
    try:
        for name, part in parts.items():
            written += write_split(f"{args.out}_{name}", part)
            if name != "train":
                written += write_bytes(f"{args.out}_{name}.raw", part)
        manifest = describe(args, data, parts, t0)
        written += write_bytes(f"{args.out}.manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    except BaseException:  # an error or Ctrl-C: the earlier files stay, this run's temporaries go
        for name in parts:
            prefix = f"{args.out}_{name}"
            for path in (bin_path(prefix), idx_path(prefix), f"{prefix}.raw"):  # staged, and being written:
                Path(f"{path}.writing").unlink(missing_ok=True)
            for path in (bin_path(f"{prefix}.writing"), idx_path(f"{prefix}.writing")):
                Path(path).unlink(missing_ok=True)
        Path(f"{args.out}.manifest.json.writing").unlink(missing_ok=True)
        raise
    rename_written(written)
    return manifest


def describe(args, data: bytes, parts: dict[str, bytes], t0: float) -> dict:
    """The manifest of a run: the input, the rule, each split's bytes and files, the tokenizer."""
    return {
        "format": "Megatron MMapIndexedDataset (GPT-NeoX), one document per split, token id = byte value",
        "input": {"path": os.path.abspath(args.input), "bytes": len(data), "sha256": sha256_file(args.input)},
        "rule": "test = the last test_bytes bytes, valid = the test_bytes before them, train = the rest",
        "test_bytes": args.test_bytes,
        "splits": {name: {"prefix": os.path.abspath(f"{args.out}_{name}"), "bytes": len(part),
                          "valid_utf8": _is_utf8(part),
                          "raw": os.path.abspath(f"{args.out}_{name}.raw") if name != "train" else None}
                   for name, part in parts.items()},
        "tokenizer": {"path": str(BYTE_TOKENIZER), "vocab_size": VOCAB_SIZE, "dtype": best_dtype(VOCAB_SIZE).name},
        "seconds": round(time.time() - t0, 3),
    }


def main(argv: list[str] | None = None) -> int:
    try:
        m = run(argv)
    except (Enwik8Error, OSError) as e:
        print(f"data_prep.enwik8: error: {e}", file=sys.stderr)
        return 2
    sizes = ", ".join(f"{name} {s['bytes']:,}" for name, s in m["splits"].items())
    print(f"wrote {m['splits']['train']['prefix'].rsplit('_', 1)[0]}_{{train,valid,test}}.bin/.idx ({sizes} bytes) "
          f"and the valid/test .raw files in {m['seconds']:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
