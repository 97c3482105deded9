"""The .bin/.idx format: byte-for-byte with megatron-core, round trip of real text, clear errors, start-up checks."""

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neox_dar.config import ConfigError, load_config
from neox_dar.training.checks import check_training_config
from neox_dar.data import IndexedDataset, IndexedDatasetError, IndexedDatasetWriter
from neox_dar.data import check as data_check
from neox_dar.data.check import check_data_files

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


def _tokens_file(prefix, dtype=np.uint16, bad=None):
    """Six documents of 10 ids spread over [0, 50000) (some >= 32768); ``bad`` = id put at sequence 3, token 5."""
    docs = [np.linspace(0, 49_999, 10).astype(np.int64) + i for i in range(6)]
    if bad is not None:
        docs[3][5] = bad
    w = IndexedDatasetWriter(prefix, dtype)
    for d in docs:
        w.add_document(d)
    w.finalize()
    return str(prefix)


def _data_cfg(prefix, *extra):
    return load_config(overrides=[f"data_path={prefix}", "seq_length=8", *extra])


def _set_dtype_code(prefix, code):
    with open(prefix + ".idx", "r+b") as f:
        f.seek(17)
        f.write(bytes([code]))


def _damage(kind, p):
    if kind == "idx truncated":
        with open(p + ".idx", "r+b") as f:
            f.truncate(os.path.getsize(p + ".idx") - 8)
    elif kind == "bad magic":
        with open(p + ".idx", "r+b") as f:
            f.write(b"NOTMAGIC!")
    elif kind == "bin short":
        with open(p + ".bin", "r+b") as f:
            f.truncate(os.path.getsize(p + ".bin") - 2)
    elif kind == "uint16 declared int16":
        _set_dtype_code(p, 3)
    elif kind == "int32 declared float32":
        _set_dtype_code(_tokens_file(p, np.int32), 7)
    elif kind == "id >= vocab":
        _tokens_file(p, bad=50_300)


@pytest.mark.parametrize("kind, message", [
    ("idx truncated", r"t\.idx: index truncated: 154 bytes, header says 6 sequences"),
    ("bad magic", r"t\.idx: not a Megatron MMapIndexedDataset index \(bad magic"),
    ("bin short", r"t\.bin: 118 bytes but .*t\.idx describes 60 tokens of uint16 = 120 bytes"),
    ("uint16 declared int16", r"t\.bin: negative token id -\d+ at sequence \d+, token \d+: the \.idx declares int16"),
    ("int32 declared float32", r"t\.idx: token dtype float32 is not an integer type"),
    ("id >= vocab", r"t\.bin: token id 50300 at sequence 3, token 5 is >= vocab_size 50277"),
])
def test_damaged_data_is_a_one_line_config_error_before_training(tmp_path, kind, message):
    p = _tokens_file(tmp_path / "t")
    cfg = load_config(overrides=[f"data_path={p}", "seq_length=8", f"save={tmp_path / 'run'}"])
    check_training_config(cfg, 1)  # intact: passes
    for f in tmp_path.glob("*_token_range.json"):
        f.unlink()
    _damage(kind, p)
    with pytest.raises(ConfigError, match=message) as info:
        check_training_config(cfg, 1)
    assert "\n" not in str(info.value)


def test_train_py_exits_2_with_one_line_for_token_ids_beyond_the_vocabulary(tmp_path):
    p = _tokens_file(tmp_path / "t", bad=50_300)
    out = subprocess.run([sys.executable, "train.py", "configs/tiny.yml", f"data_path={p}", "seq_length=8",
                          f"save={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "WANDB_MODE": "offline"})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert f"{p}.bin: token id 50300 at sequence 3, token 5 is >= vocab_size 50277" in lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_writer_refuses_dtypes_that_cannot_hold_token_ids(tmp_path):
    for dtype in (np.float16, np.float32):
        with pytest.raises(IndexedDatasetError, match=f"token dtype must be one of .*uint16.*, not {np.dtype(dtype)}"):
            IndexedDatasetWriter(tmp_path / "f", dtype)


def test_full_token_scan_is_cached_by_file_size_and_mtime(tmp_path, monkeypatch):
    p = _tokens_file(tmp_path / "t")
    check_data_files(_data_cfg(p))
    cache = tmp_path / "t_token_range.json"
    saved = json.loads(cache.read_text())
    assert saved["range"] == {"min": 0, "argmin": 0, "max": 50004, "argmax": 59, "scan": "full"}

    def no_scan(*args, **kwargs):
        raise AssertionError("scanned again")

    monkeypatch.setattr(data_check, "scan_token_range", no_scan)
    check_data_files(_data_cfg(p))  # read back from the cache
    check_data_files(_data_cfg(p, "data_token_check=sample"))  # a cached full scan serves a sample request too
    st = os.stat(p + ".bin")
    os.utime(p + ".bin", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file changed: scan again
    with pytest.raises(AssertionError, match="scanned again"):
        check_data_files(_data_cfg(p))
    monkeypatch.undo()
    check_data_files(_data_cfg(p, f"data_cache_path={tmp_path / 'cache'}"))
    assert (tmp_path / "cache" / "t_token_range.json").is_file()
    check_data_files(_data_cfg(p, "data_token_check=skip", "vocab_size=100"))  # skip: no scan, no token-id error


def test_sampled_token_scan_reads_evenly_spaced_windows(tmp_path, monkeypatch):
    monkeypatch.setattr(data_check, "SAMPLE_WINDOWS", 4)
    monkeypatch.setattr(data_check, "WINDOW_TOKENS", 5)
    assert data_check._windows(60, "sample") == [(0, 5), (18, 23), (36, 41), (55, 60)]
    assert data_check._windows(20, "sample") == [(0, 20)]  # small files are scanned whole
    p = _tokens_file(tmp_path / "t", bad=50_300)  # sequence 3, token 5: flat position 35, outside every window
    check_data_files(_data_cfg(p, "data_token_check=sample"))
    assert not list(tmp_path.glob("*_token_range.json"))  # samples are not cached
    with pytest.raises(IndexedDatasetError, match="token id 50300 at sequence 3, token 5"):
        check_data_files(_data_cfg(p))
    q = _tokens_file(tmp_path / "q", bad=-1 % 65536)
    _set_dtype_code(q, 3)  # uint16 read as int16: 65535 is -1, and ids >= 32768 inside the windows are negative
    with pytest.raises(IndexedDatasetError, match=r"negative token id .*\(in a sample; data_token_check=full scans"):
        check_data_files(_data_cfg(q, "data_token_check=sample"))
