"""python -m data_prep.tokenize: worker-count independence, crash + resume, budget, formats, bad input."""

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


def test_resume_refuses_shards_of_a_different_run(corpus):
    out = corpus / "other"
    prep(corpus / "a.jsonl", "--out", out, "--shard-docs", 40, env={"NEOX_DAR_DATA_PREP_KILL_AFTER_SHARDS": "1"},
         check=False)
    r = prep(corpus / "a.jsonl", "--out", out, "--shard-docs", 50, check=False)
    assert r.returncode == 1 and "different run (differs in: shard_docs)" in r.stderr


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
    assert skipped["total"] == 5 and skipped["by_reason"]["empty document"] == 1
    tok = Tokenizer.from_file(str(TOKENIZER))
    ds = IndexedDataset(tmp_path / "bad")
    assert [list(ds[i]) for i in range(len(ds))] == [e.ids + [0] for e in tok.encode_batch(good)]


def test_strict_mode_stops_at_the_first_bad_record(bad_file, tmp_path):
    p, _ = bad_file
    r = prep(p, "--out", tmp_path / "strict", "--strict", check=False)
    assert r.returncode == 1
    assert f"{p}:2: malformed JSON" in r.stderr and "(--strict)" in r.stderr
    assert not (tmp_path / "strict.bin").exists()


def test_missing_input_and_bad_tokenizer_are_one_line_errors(tmp_path):
    r = prep(tmp_path / "nope.jsonl", "--out", tmp_path / "x", check=False)
    assert r.returncode == 1 and r.stderr.strip().endswith(f"input not found: {tmp_path / 'nope.jsonl'}")
    (tmp_path / "t.json").write_text("{}")
    (tmp_path / "d.jsonl").write_text('{"text": "hi"}\n')
    r = subprocess.run([sys.executable, "-m", "data_prep.tokenize", str(tmp_path / "d.jsonl"), "--tokenizer",
                        str(tmp_path / "t.json"), "--out", str(tmp_path / "x")], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 1 and "not a Hugging Face tokenizer.json" in r.stderr


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
    assert r.returncode == 1 and "no usable documents in the inputs (1 bad records)" in r.stderr


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
