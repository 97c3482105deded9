"""python -m data_prep.tokenize: worker-count and shard-size independence, crash + resume, stale shards, budgets and
the held-out validation file, formats, bad input, memory bound."""

import contextlib
import gzip
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from data_prep.tokenize import main
from neox_dar.data import IndexedDataset

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "data/20B_tokenizer.json"
C4_LINES = (ROOT / "data/sample/c4_sample.jsonl").read_text().splitlines()


def prep(*args, env=None, check=True):
    """Run the command: in this process, or as a subprocess when ``env`` adds variables."""
    argv = [*map(str, args), "--tokenizer", str(TOKENIZER), "--no-progress"]
    if env is None:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(argv)
        r = types.SimpleNamespace(returncode=rc, stderr=err.getvalue())
    else:
        r = subprocess.run([sys.executable, "-m", "data_prep.tokenize", *argv], cwd=ROOT, capture_output=True,
                           text=True, env=dict(os.environ, **env))
    if check and r.returncode != 0:
        raise AssertionError(r.stderr)
    return r


def digest(prefix) -> str:
    h = hashlib.sha256()
    for ext in (".bin", ".idx"):
        h.update(Path(str(prefix) + ext).read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two real C4 slices (250 + 150 documents) and a clean single-worker reference run."""
    d = tmp_path_factory.mktemp("corpus")
    (d / "a.jsonl").write_text("\n".join(C4_LINES[:250]) + "\n")
    (d / "b.jsonl").write_text("\n".join(C4_LINES[250:400]) + "\n")
    prep(d / "*.jsonl", "--out", d / "ref", "--shard-docs", 40, "--workers", 1)
    return d


def test_workers_1_and_2_write_identical_datasets(corpus):
    prep(corpus / "*.jsonl", "--out", corpus / "w2", "--shard-docs", 40, "--workers", 2)
    assert digest(corpus / "w2") == digest(corpus / "ref")
    assert IndexedDataset(corpus / "ref").sizes.shape == (400,)


def test_killed_run_resumes_to_the_identical_dataset(corpus):
    out = corpus / "killed"
    r = prep(corpus / "*.jsonl", "--out", out, "--shard-docs", 40, "--workers", 2,
             env={"NEOX_DAR_DATA_PREP_KILL_AFTER_SHARDS": "4"}, check=False)
    assert r.returncode == -9
    journal = (Path(f"{out}.shards") / "journal.jsonl").read_text().splitlines()
    assert len(journal) == 1 + 4 and not Path(f"{out}.bin").exists()
    prep(corpus / "*.jsonl", "--out", out, "--shard-docs", 40, "--workers", 1)
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    assert manifest["shards_resumed"] == 4 and manifest["shards"] == 10
    assert digest(out) == digest(corpus / "ref")
    assert not Path(f"{out}.shards").exists()


def test_shards_of_a_different_run_are_removed_with_a_message(corpus):
    out = corpus / "other"
    prep(corpus / "a.jsonl", "--out", out, "--shard-docs", 40, env={"NEOX_DAR_DATA_PREP_KILL_AFTER_SHARDS": "1"},
         check=False)
    r = prep(corpus / "a.jsonl", "--out", out, "--shard-docs", 50)
    assert f"{out}.shards held shards of a different run (differs in: shard_docs); removed them" in r.stderr
    prep(corpus / "a.jsonl", "--out", corpus / "a_only")
    assert digest(out) == digest(corpus / "a_only")


def test_a_failed_run_does_not_block_the_next_one(bad_file, tmp_path):
    """Issue 12 (7): a --strict run that failed left PREFIX.shards, and the next run into the same --out was
    refused ("holds shards of a different run"); now it starts over, and an identical rerun resumes."""
    p, good = bad_file
    out = tmp_path / "x"
    assert prep(p, "--out", out, "--strict", check=False).returncode == 2
    assert Path(f"{out}.shards").is_dir()
    p.write_text("".join(json.dumps({"text": t}) + "\n" for t in good))  # the input, fixed
    r = prep(p, "--out", out, "--strict")
    assert "differs in: inputs" in r.stderr and len(IndexedDataset(out)) == 3
    prep(p, "--out", out, "--keep-shards", "--max-tokens", 10)  # an identical plan resumes, whatever the budget
    r = prep(p, "--out", out)
    assert json.loads(Path(f"{out}.manifest.json").read_text())["shards_resumed"] == 1 and "removed" not in r.stderr


def test_shard_directory_in_use_or_not_ours_is_refused(tmp_path):
    import fcntl

    (tmp_path / "d.jsonl").write_text("\n".join(C4_LINES[:3]) + "\n")
    shards = tmp_path / "x.shards"
    shards.mkdir()
    fd = os.open(shards, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = prep(tmp_path / "d.jsonl", "--out", tmp_path / "x", check=False)
    finally:
        os.close(fd)
    assert r.returncode == 2 and "in use by another data_prep.tokenize run" in r.stderr
    (shards / "notes.txt").write_text("mine")
    r = prep(tmp_path / "d.jsonl", "--out", tmp_path / "x", check=False)
    assert r.returncode == 2 and "did not write (notes.txt)" in r.stderr and (shards / "notes.txt").exists()


def test_input_order_is_a_seeded_shuffle_and_manifest_records_it(corpus):
    manifest = json.loads((corpus / "ref.manifest.json").read_text())
    names = sorted(str(corpus / n) for n in ("a.jsonl", "b.jsonl"))
    random.Random(1234).shuffle(names)
    assert [i["path"] for i in manifest["inputs"]] == names
    first = names[0]
    tok = Tokenizer.from_file(str(TOKENIZER))
    first_text = json.loads(Path(first).read_text().splitlines()[0])["text"]
    assert list(IndexedDataset(corpus / "ref")[0][:-1]) == tok.encode(first_text).ids
    for i in manifest["inputs"]:
        assert i["sha256"] == hashlib.sha256(Path(i["path"]).read_bytes()).hexdigest()
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256(TOKENIZER.read_bytes()).hexdigest()
    assert manifest["documents"] == 400 and manifest["tokens"] == IndexedDataset(corpus / "ref").num_tokens
    assert manifest["bin_sha256"] == hashlib.sha256((corpus / "ref.bin").read_bytes()).hexdigest()
    assert manifest["command"].startswith("python -m data_prep.tokenize ") and manifest["seed"] == 1234


def test_token_budget_stops_exactly(corpus):
    ref = IndexedDataset(corpus / "ref")
    ends = np.cumsum(ref.sizes.astype(np.int64))
    mid = int(ends[57]) + 13  # inside document 58
    prep(corpus / "*.jsonl", "--out", corpus / "cut", "--shard-docs", 40, "--max-tokens", mid)
    cut = IndexedDataset(corpus / "cut")
    assert cut.num_tokens == mid and len(cut) == 59
    np.testing.assert_array_equal(cut.sizes[:58], ref.sizes[:58])
    np.testing.assert_array_equal(cut[58], ref[58][:13])
    assert json.loads((corpus / "cut.manifest.json").read_text())["truncated_last_document"] is True
    prep(corpus / "*.jsonl", "--out", corpus / "edge", "--shard-docs", 40, "--max-tokens", int(ends[99]))
    edge = IndexedDataset(corpus / "edge")
    assert len(edge) == 100 and edge.num_tokens == int(ends[99]) and edge[99][-1] == 0


def test_compressed_parquet_and_text_inputs_match_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    texts = [json.loads(line)["text"] for line in C4_LINES[:12]]
    body = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(body))
    (tmp_path / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(body))
    pq.write_table(pa.table({"text": texts}), tmp_path / "d.parquet")
    paragraphs = [" ".join(t.split()) for t in texts]  # one line each, blank-line separated
    (tmp_path / "d.txt").write_text("\n\n".join(paragraphs) + "\n")
    tok = Tokenizer.from_file(str(TOKENIZER))
    want = [e.ids + [0] for e in tok.encode_batch(texts)]
    for name in ("d.jsonl.gz", "d.jsonl.zst", "d.parquet"):
        prep(tmp_path / name, "--out", tmp_path / name.replace(".", "_"))
        ds = IndexedDataset(tmp_path / name.replace(".", "_"))
        assert [list(ds[i]) for i in range(len(ds))] == want, name
    prep(tmp_path / "d.txt", "--out", tmp_path / "para", "--txt-mode", "paragraph")
    ds = IndexedDataset(tmp_path / "para")
    assert [list(ds[i]) for i in range(len(ds))] == [e.ids + [0] for e in tok.encode_batch(paragraphs)]
    prep(tmp_path / "d.txt", "--out", tmp_path / "whole")
    assert len(IndexedDataset(tmp_path / "whole")) == 1
    zst = zstandard.ZstdCompressor()
    (tmp_path / "two.jsonl.zst").write_bytes(zst.compress(body[:len(body) // 2]) + zst.compress(body[len(body) // 2:]))
    prep(tmp_path / "two.jsonl.zst", "--out", tmp_path / "two")  # a frame boundary inside a line: one stream
    ds = IndexedDataset(tmp_path / "two")
    assert [list(ds[i]) for i in range(len(ds))] == want


def test_cut_or_mislabelled_compressed_inputs_are_one_line_errors(tmp_path):
    """A .zst or .gz cut short (an interrupted download) stops the run in one line: a cut .zst was read as a shorter
    corpus with exit 0, a cut .gz was an EOFError traceback, a .zst that is not zstd a ZstdError traceback."""
    import zstandard

    body = "".join(json.dumps({"text": json.loads(line)["text"]}) + "\n" for line in C4_LINES[:12]).encode()
    (tmp_path / "cut.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(body)[:-100])
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(body)[:-100])
    (tmp_path / "gzip.jsonl.zst").write_bytes(gzip.compress(body))
    # a second frame damaged (a flipped byte, caught by its checksum, as the zstd tool writes them) after the first
    # one's lines were read: "corrupt", with the line (it said "not a zstd stream")
    rng = random.Random(0)
    lines = "".join(json.dumps({"text": "%032x" % rng.getrandbits(128) * 8}) + "\n" for _ in range(12000)).encode()
    first = zstandard.ZstdCompressor().compress(lines)
    second = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(lines))
    second[len(second) // 2] ^= 0xFF
    (tmp_path / "bad.jsonl.zst").write_bytes(first + bytes(second))
    (tmp_path / "text.parquet").write_text("not parquet")
    for name, said in (("text.parquet", f"{tmp_path / 'text.parquet'}: not a readable parquet file"),
                       ("cut.jsonl.zst", "the file ends inside a zstd frame (cut short?)"),
                       ("cut.jsonl.gz", "Compressed file ended before the end-of-stream marker was reached"),
                       ("gzip.jsonl.zst", "not a zstd stream"),
                       ("bad.jsonl.zst", "corrupt zstd data after ")):
        r = prep(tmp_path / name, "--out", tmp_path / name.replace(".", "_"), check=False)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and said in r.stderr, (name, r.stderr)
    (tmp_path / "afile").write_text("x")
    for out, said in ((f"{tmp_path}/dir/", "names a directory, not a prefix of files"),  # wrote dir/.bin, dir/.idx
                      (tmp_path / "afile" / "x", f"{tmp_path / 'afile'} is a file, not a folder")):
        r = prep(tmp_path / "cut.jsonl.gz", "--out", out, check=False)
        assert r.returncode == 2 and said in r.stderr, r.stderr


@pytest.fixture()
def bad_file(tmp_path):
    good = [json.loads(line)["text"] for line in C4_LINES[:3]]
    lines = [
        json.dumps({"text": good[0]}).encode(),
        b'{"text": "unterminated',                   # line 2: malformed JSON
        json.dumps({"body": "no text key"}).encode(),  # line 3: missing field
        b'{"text": "caf\xe9"}',                       # line 4: invalid UTF-8
        json.dumps({"text": "   "}).encode(),         # line 5: empty document
        json.dumps({"text": good[1]}).encode(),
        b"",                                         # line 7: blank line, not a record
        json.dumps({"text": 17}).encode(),            # line 8: not a string
        json.dumps({"text": good[2]}).encode(),
    ]
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    return p, good


def test_bad_records_are_counted_reported_and_skipped(bad_file, tmp_path):
    p, good = bad_file
    r = prep(p, "--out", tmp_path / "bad")
    for line, reason in [(2, "malformed JSON"), (3, "missing text field 'text'"), (4, "invalid UTF-8"),
                         (5, "empty document"), (8, "text field 'text' is a int, not a string")]:
        assert f"{p}:{line}: {reason}" in r.stderr
    skipped = json.loads((tmp_path / "bad.manifest.json").read_text())["skipped"]
    assert skipped["total"] == 5 and skipped["by_reason"] == {
        "malformed JSON": 1, "missing text field 'text'": 1, "invalid UTF-8": 1, "empty document": 1,
        "text field 'text' is a int, not a string": 1}
    tok = Tokenizer.from_file(str(TOKENIZER))
    ds = IndexedDataset(tmp_path / "bad")
    assert [list(ds[i]) for i in range(len(ds))] == [e.ids + [0] for e in tok.encode_batch(good)]


def test_malformed_json_message_names_line_column_and_char(tmp_path):
    """Issue 12 (7): the message read "malformed JSON (Invalid control character at, column 12)"."""
    p = tmp_path / "ctl.jsonl"
    p.write_bytes(json.dumps({"text": "fine"}).encode() + b'\n{"text": "a\tb"}\n{"text": "x", }\n')
    r = prep(p, "--out", tmp_path / "ctl")
    assert f"{p}:2: malformed JSON: Invalid control character at line 1 column 12 (char 11)" in r.stderr
    assert f"{p}:3: malformed JSON: Expecting property name enclosed in double quotes at line 1 column 15 " \
           "(char 14)" in r.stderr


def test_strict_mode_stops_at_the_first_bad_record(bad_file, tmp_path):
    p, _ = bad_file
    r = prep(p, "--out", tmp_path / "strict", "--strict", check=False)
    assert r.returncode == 2
    assert f"{p}:2: malformed JSON" in r.stderr and "(--strict)" in r.stderr
    assert not (tmp_path / "strict.bin").exists()


def test_missing_input_and_bad_tokenizer_are_one_line_errors(tmp_path):
    r = prep(tmp_path / "nope.jsonl", "--out", tmp_path / "x", check=False)
    assert r.returncode == 2 and r.stderr.strip().endswith(f"input not found: {tmp_path / 'nope.jsonl'}")
    (tmp_path / "t.json").write_text("{}")
    (tmp_path / "d.jsonl").write_text('{"text": "hi"}\n')
    r = subprocess.run([sys.executable, "-m", "data_prep.tokenize", str(tmp_path / "d.jsonl"), "--tokenizer",
                        str(tmp_path / "t.json"), "--out", str(tmp_path / "x")], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 2 and "not a Hugging Face tokenizer.json" in r.stderr


def test_sentencepiece_model_with_its_eos_as_eod(tmp_path):
    import sentencepiece as spm

    texts = [" ".join(json.loads(line)["text"].split()) for line in C4_LINES[:150]]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_prefix=str(tmp_path / "sp"), vocab_size=300,
                                   minloglevel=2)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:20]))
    r = subprocess.run([sys.executable, "-m", "data_prep.tokenize", str(tmp_path / "d.jsonl"), "--tokenizer",
                        str(tmp_path / "sp.model"), "--out", str(tmp_path / "sp_out"), "--no-progress"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    ds = IndexedDataset(tmp_path / "sp_out")
    assert sp.eos_id() == 2 and ds.dtype == np.uint16
    assert [list(ds[i]) for i in range(len(ds))] == [ids + [2] for ids in sp.encode(texts[:20])]


def test_inputs_with_no_usable_document_are_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text(json.dumps({"text": ""}) + "\n")
    r = prep(tmp_path / "empty.jsonl", "--out", tmp_path / "e", check=False)
    assert r.returncode == 2 and "no usable documents in the inputs (1 bad records)" in r.stderr
    assert not (tmp_path / "e.shards").exists()  # nothing worth keeping (an empty shard folder was left behind)


def test_hugging_face_dataset_input_streams_offline(tmp_path):
    pytest.importorskip("datasets")
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "train.jsonl").write_text("\n".join(C4_LINES[:6]) + "\n")
    prep(tmp_path / "hub" / "train.jsonl", "--out", tmp_path / "local")
    prep(f"hf:{tmp_path / 'hub'}@train", "--out", tmp_path / "hf",
         env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")})
    assert digest(tmp_path / "hf") == digest(tmp_path / "local")
    manifest = json.loads((tmp_path / "hf.manifest.json").read_text())
    assert manifest["inputs"][0]["hf_dataset"] == str(tmp_path / "hub") and manifest["inputs"][0]["split"] == "train"


def test_token_counts_and_hf_specs_parse():
    from data_prep.sources import parse_hf
    from data_prep.tokenize import parse_count

    assert [parse_count(t) for t in ("10_000_000_000", "10B", "500M", "1e9", "1.5k", "123")] == [
        10**10, 10**10, 5 * 10**8, 10**9, 1500, 123]
    assert parse_hf("hf:allenai/c4:en@validation") == ("allenai/c4", "en", "validation")
    assert parse_hf("hf:roneneldan/TinyStories") == ("roneneldan/TinyStories", None, "train")


@pytest.fixture(scope="module")
def big_docs(tmp_path_factory):
    """24 large documents (about 110 kB of text each, 2.6 MB in all), each 50 C4 documents joined."""
    d = tmp_path_factory.mktemp("big")
    texts = [json.loads(line)["text"] for line in C4_LINES]
    docs = ["\n\n".join(texts[i * 50 % 1000:i * 50 % 1000 + 50]) for i in range(24)]
    (d / "big.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    return d, docs


# the big documents tokenized four ways: 1 or 2 workers, shards of the default 16 MB, of 300 kB or of 7 documents
BIG_RUNS = {"w1": ("--workers", 1), "w2": ("--workers", 2), "w2_300k": ("--workers", 2, "--shard-bytes", "300k"),
            "w1_docs7": ("--workers", 1, "--shard-docs", 7)}


@pytest.fixture(scope="module")
def big_runs(big_docs) -> dict[str, dict]:
    """The manifest of each :data:`BIG_RUNS` run of the big documents (its output: ``DIR/NAME``)."""
    d, _ = big_docs
    manifests = {}
    for name, extra in BIG_RUNS.items():
        prep(d / "big.jsonl", "--out", d / name, *extra)
        manifests[name] = json.loads((d / f"{name}.manifest.json").read_text())
    return manifests


def test_large_documents_are_cut_into_byte_shards_with_identical_output(big_docs, big_runs):
    d, docs = big_docs
    manifests = big_runs
    by_bytes, held = 0, 0  # a shard ends once its lines hold >= 300,000 bytes
    for line in (d / "big.jsonl").read_bytes().splitlines(keepends=True):
        held += len(line)
        if held >= 300_000:
            by_bytes, held = by_bytes + 1, 0
    by_bytes += held > 0
    assert by_bytes >= 8 and {name: m["shards"] for name, m in manifests.items()} == {
        "w1": 1, "w2": 1, "w2_300k": by_bytes, "w1_docs7": 4}
    assert len({digest(d / name) for name in BIG_RUNS}) == 1
    tok = Tokenizer.from_file(str(TOKENIZER))
    ds = IndexedDataset(d / "w1")
    assert [list(ds[i]) for i in range(len(ds))] == [e.ids + [0] for e in tok.encode_batch(docs)]


def test_tokenizer_process_memory_does_not_grow_with_the_shard(big_runs):
    """A worker tokenizes ~1 MiB pieces, so a 2.6 MB shard costs it no more memory than a 300 kB one (the old
    one-batch-per-shard worker peaked 60 MB higher with one shard than with 3-document shards here); and peak RSS
    is in the manifest. (The 2-worker runs of :data:`BIG_RUNS`: one shard of the default 16 MB, and 300 kB ones.)"""
    assert (big_runs["w2"]["shards"], big_runs["w2_300k"]["shard_bytes"]) == (1, 300_000)
    peak = {name: big_runs[run]["peak_rss_mb"]["tokenizer_process"]
            for name, run in (("one_shard", "w2"), ("small_shards", "w2_300k"))}
    assert 0 < peak["one_shard"] < peak["small_shards"] + 30, peak


def test_valid_tokens_hold_out_the_first_documents_and_max_tokens_counts_training(corpus):
    ref = IndexedDataset(corpus / "ref")
    ends = np.cumsum(ref.sizes.astype(np.int64))
    valid, train = int(ends[29]) + 7, int(ends[199] - ends[30]) + 5  # cuts inside documents 30 and 200
    for w in (1, 2):
        prep(corpus / "*.jsonl", "--out", corpus / f"split{w}", "--shard-docs", 40, "--workers", w,
             "--valid-tokens", valid, "--max-tokens", train)
    assert digest(corpus / "split1") == digest(corpus / "split2")
    assert digest(corpus / "split1_valid") == digest(corpus / "split2_valid")
    v, t = IndexedDataset(corpus / "split1_valid"), IndexedDataset(corpus / "split1")
    assert v.num_tokens == valid and len(v) == 31 and t.num_tokens == train and len(t) == 170
    np.testing.assert_array_equal(v[30], ref[30][:7])
    assert all(np.array_equal(t[i], ref[31 + i]) for i in range(169)) and np.array_equal(t[169], ref[200][:5])
    m = json.loads((corpus / "split1.manifest.json").read_text())
    assert (m["tokens"], m["valid"]["tokens"], m["truncated_last_document"], m["valid"]["truncated_last_document"]) \
        == (train, valid, True, True)
    assert m["valid"]["bin_sha256"] == hashlib.sha256((corpus / "split1_valid.bin").read_bytes()).hexdigest()
    # without --max-tokens the training file takes every document after the validation file's
    prep(corpus / "*.jsonl", "--out", corpus / "rest", "--shard-docs", 40, "--valid-tokens", int(ends[9]))
    rest = IndexedDataset(corpus / "rest")
    assert len(rest) == 390 and rest.num_tokens == ref.num_tokens - int(ends[9])
    # the same prefix again without --valid-tokens: the old held-out file goes (it was left beside the new training
    # file, and valid_data_paths: [rest_valid] read the old inputs' validation); a _valid no manifest records stays
    r = prep(corpus / "*.jsonl", "--out", corpus / "rest", "--shard-docs", 40, "--max-tokens", 1000)
    assert not (corpus / "rest_valid.bin").exists() and not (corpus / "rest_valid.idx").exists()
    assert f"removed {corpus / 'rest_valid.bin'} and {corpus / 'rest_valid.idx'}: the held-out file" in r.stderr
    assert IndexedDataset(corpus / "rest").num_tokens == 1000
    (corpus / "rest_valid.bin").write_bytes(b"mine")
    prep(corpus / "*.jsonl", "--out", corpus / "rest", "--shard-docs", 40, "--max-tokens", 1000)
    assert (corpus / "rest_valid.bin").read_bytes() == b"mine"
    r = prep(corpus / "*.jsonl", "--out", corpus / "toomuch", "--valid-tokens", ref.num_tokens + 1, check=False)
    assert r.returncode == 2 and f"too few for --valid-tokens {ref.num_tokens + 1:,}" in r.stderr
    assert f"(the tokenized shards are kept in {corpus / 'toomuch.shards'}/: the same inputs with other budgets " \
           "reuse them; remove it to start over)" in r.stderr and (corpus / "toomuch.shards").is_dir()
    r = prep(corpus / "*.jsonl", "--out", corpus / "nothing_left", "--valid-tokens", ref.num_tokens, check=False)
    assert r.returncode == 2 and "no usable documents after the --valid-tokens documents" in r.stderr


def test_recommended_budgets_are_read_in_one_epoch_through_train_and_valid_data_paths(corpus):
    """docs/data.md's rule: with train_data_paths / valid_data_paths, GPT-NeoX's blend asks each dataset for
    ceil(1.005 * samples) samples, so --max-tokens ceil(1.005 * S) * seq_length + 1 (and the same for the
    validation file) is read in one epoch; S * seq_length + 1 tokens would make GPTDataset shuffle in a second."""
    from neox_dar.config import load_config
    from neox_dar.data import build_datasets
    from neox_dar.data.build import blend_sample_counts
    from neox_dar.data.gpt_dataset import num_epochs_for

    seq, train_samples, valid_samples = 64, 300, 20
    need = {n: blend_sample_counts([1.0], n)[1][0] * seq + 1 for n in (train_samples, valid_samples)}
    for name, train_tokens in (("rec", need[train_samples]), ("short", train_samples * seq + 1)):
        prep(corpus / "*.jsonl", "--out", corpus / name, "--valid-tokens", need[valid_samples],
             "--max-tokens", train_tokens)
        cfg = load_config(overrides=[f"train_data_paths=[{corpus / name}]", f"valid_data_paths=[{corpus / name}_valid]",
                                     f"seq_length={seq}", f"data_cache_path={corpus / 'cache'}"])
        train, valid = build_datasets(cfg, train_samples=train_samples, valid_samples=valid_samples)
        assert (train.num_epochs, valid.num_epochs) == ((1, 1) if name == "rec" else (2, 1))
    # the numbers in docs/data.md and README.md for configs/pythia-160m.yml (5450 steps x 896 x 2048, evaluations
    # every 1000 steps of 10 batches): 10B tokens would need a second epoch
    train_count = blend_sample_counts([1.0], 5450 * 896)[1][0]
    valid_count = blend_sample_counts([1.0], (5450 // 1000 + 1) * 10 * 896)[1][0]
    assert (train_count * 2048 + 1, valid_count * 2048 + 1) == (10_050_797_569, 110_651_393)
    assert num_epochs_for(10_050_797_569, 2048, train_count) == 1 and num_epochs_for(10**10, 2048, train_count) == 2


def test_budget_deals_documents_like_one_pass_over_the_stream():
    from data_prep.budget import Budget

    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = rng.integers(1, 20, rng.integers(1, 40))
        budgets = [int(rng.integers(1, 120)) for _ in range(rng.integers(0, 3))] + [
            None if rng.random() < 0.3 else int(rng.integers(1, 200))]
        want = [[] for _ in budgets]  # (document, tokens kept), one document at a time
        out, filled = 0, 0
        for doc, size in enumerate(sizes):
            if out == len(budgets):
                break
            room = budgets[out] - filled if budgets[out] is not None else size
            want[out].append((doc, int(min(size, room))))
            filled += min(size, room)
            if budgets[out] is not None and filled == budgets[out]:
                out, filled = out + 1, 0
        budget, got = Budget(budgets), [[] for _ in budgets]
        cuts = sorted(rng.choice(np.arange(1, len(sizes) + 1), rng.integers(0, len(sizes) + 1), replace=False))
        for lo, hi in zip([0, *cuts], [*cuts, len(sizes)]):  # the same stream cut into random shards
            for o, first, taken in budget.deal(sizes[lo:hi]):
                got[o].extend((lo + first + i, int(n)) for i, n in enumerate(taken))
        assert got == want
        assert budget.full == (out == len(budgets))


def test_help_documents_the_options_and_counts_parse_exactly():
    from data_prep.tokenize import build_parser, parse_count

    text = build_parser().format_help()
    for option in ("--shard-bytes", "--shard-docs", "--valid-tokens", "--max-tokens", "--workers", "PREFIX_valid"):
        assert option in text
    assert parse_count("10.001B") == 10_001_000_000 and parse_count("16M") == 16_000_000
    with pytest.raises(Exception, match="not a whole number"):
        parse_count("1.5")
