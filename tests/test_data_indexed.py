"""The .bin/.idx format: byte-for-byte with megatron-core, round trip of real text, clear errors."""

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neox_dar.data import IndexedDataset, IndexedDatasetError, IndexedDatasetWriter

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "data/20B_tokenizer.json"
C4 = ROOT / "data/sample/c4_sample.jsonl"


@pytest.fixture(scope="module")
def c4_prefix(tmp_path_factory):
    out = tmp_path_factory.mktemp("c4") / "c4_sample"
    subprocess.run([sys.executable, "-m", "data_prep.tokenize", str(C4), "--tokenizer", str(TOKENIZER),
                    "--out", str(out), "--no-progress", "--shard-docs", "300"], cwd=ROOT, check=True,
                   capture_output=True)
    return str(out)


def _random_docs(rng, n, vocab):
    return [rng.integers(0, vocab, size=int(rng.integers(1, 60))) for _ in range(n)]


@pytest.mark.parametrize("dtype,vocab", [(np.uint16, 50277), (np.int32, 100_000)])
def test_writer_bytes_equal_megatron_core_builder(tmp_path, dtype, vocab):
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    docs = _random_docs(np.random.default_rng(0), 37, vocab)
    ours = IndexedDatasetWriter(tmp_path / "ours", dtype)
    for d in docs:
        ours.add_document(d)
    ours.finalize()
    theirs = IndexedDatasetBuilder(str(tmp_path / "theirs.bin"), dtype=dtype)
    for d in docs:
        theirs.add_item(torch.from_numpy(d.astype(np.int64)))
        theirs.end_document()
    theirs.finalize(str(tmp_path / "theirs.idx"))
    for ext in ("bin", "idx"):
        assert (tmp_path / f"ours.{ext}").read_bytes() == (tmp_path / f"theirs.{ext}").read_bytes()
    head = (tmp_path / "ours.idx").read_bytes()[:34]
    assert head[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<QBQQ", head[9:]) == (
        1, 8 if dtype == np.uint16 else 4, len(docs), len(docs) + 1)


def test_round_trip_real_text_with_megatron_core_reader(c4_prefix):
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronIndexed
    from tokenizers import Tokenizer

    ours, theirs = IndexedDataset(c4_prefix), MegatronIndexed(c4_prefix, mmap=True)
    texts = [json.loads(line)["text"] for line in C4.read_text().splitlines()]
    assert len(ours) == len(theirs) == len(texts) == 1000
    assert ours.dtype == np.uint16
    np.testing.assert_array_equal(ours.sizes, theirs.sequence_lengths)
    np.testing.assert_array_equal(ours.doc_idx, theirs.document_indices)
    tok = Tokenizer.from_file(str(TOKENIZER))
    for i in (0, 1, 499, 998, 999):
        np.testing.assert_array_equal(ours[i], theirs[i])
        assert ours[i][-1] == 0 and 0 not in ours[i][:-1]  # one <|endoftext|> per document, at its end
        assert list(ours[i][:-1]) == tok.encode(texts[i]).ids
    np.testing.assert_array_equal(ours.get(7, 3, 5), theirs.get(7, offset=3, length=5))
    assert tok.decode(list(ours[0][:-1])) == texts[0]


def _copy(prefix, dst):
    shutil.copy(prefix + ".bin", dst + ".bin")
    shutil.copy(prefix + ".idx", dst + ".idx")
    return dst


def test_truncated_bin_is_a_clear_error(c4_prefix, tmp_path):
    p = _copy(c4_prefix, str(tmp_path / "t"))
    with open(p + ".bin", "r+b") as f:
        f.truncate(os.path.getsize(p + ".bin") - 10)
    with pytest.raises(IndexedDatasetError, match="truncated or mismatched"):
        IndexedDataset(p)


def test_truncated_idx_is_a_clear_error(c4_prefix, tmp_path):
    p = _copy(c4_prefix, str(tmp_path / "t"))
    with open(p + ".idx", "r+b") as f:
        f.truncate(os.path.getsize(p + ".idx") - 8)
    with pytest.raises(IndexedDatasetError, match="index truncated"):
        IndexedDataset(p)
    with open(p + ".idx", "r+b") as f:
        f.truncate(20)
    with pytest.raises(IndexedDatasetError, match="truncated index"):
        IndexedDataset(p)


def test_mismatched_pair_is_a_clear_error(c4_prefix, tmp_path):
    rng = np.random.default_rng(1)
    other = IndexedDatasetWriter(tmp_path / "other", np.uint16)
    for d in _random_docs(rng, 5, 50277):
        other.add_document(d)
    other.finalize()
    p = _copy(c4_prefix, str(tmp_path / "m"))
    shutil.copy(tmp_path / "other.bin", p + ".bin")
    with pytest.raises(IndexedDatasetError, match="mismatched"):
        IndexedDataset(p)


def test_bad_magic_and_missing_files(tmp_path):
    (tmp_path / "x.idx").write_bytes(b"NOTANIDX" + b"\x00" * 40)
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(IndexedDatasetError, match="bad magic"):
        IndexedDataset(tmp_path / "x")
    with pytest.raises(IndexedDatasetError, match="not found"):
        IndexedDataset(tmp_path / "missing")
