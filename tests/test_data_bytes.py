"""Byte-level modelling (docs/data.md, docs/evaluation.md): the byte tokenizer round-trips enwik8-like text exactly,
``data_prep.enwik8`` splits by bytes (90M / 5M / 5M for enwik8), bits per character is NLL / (chars x ln 2), and a
byte-level model trains on the split and is evaluated on its test bytes end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from trainrun import ROOT, train_env

from data_prep import byte_tokenizer, enwik8
from neox_dar.data.indexed import IndexedDataset
from neox_dar.evaluation.corpora import CorpusError, load_local
from neox_dar.evaluation.metrics import corpus_metrics
from neox_dar.evaluation.perplexity import encode_documents, is_byte_tokenizer, score_corpus
from neox_dar.model import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

BYTE_TOKENIZER = ROOT / "data" / "byte_tokenizer.json"


def enwik8_like(pages: int = 60) -> bytes:
    """A small MediaWiki XML dump: markup, entities, newlines and multi-byte characters (2, 3 and 4 bytes)."""
    out = ['<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.3/" version="0.3" xml:lang="en">\n']
    for i in range(pages):
        out.append(f"  <page>\n    <title>Ärticle {i} – “{i * i}”</title>\n    <id>{i + 1}</id>\n    <revision>\n"
                   f"      <text xml:space=\"preserve\">'''Article {i}''' is a [[test]] &amp;lt;b&amp;gt; "
                   f"of 日本語 and 🎉 ({i % 7}).\n\n== See also ==\n* [[Category:Tests]]\n</text>\n"
                   "    </revision>\n  </page>\n")
    return "".join(out).encode("utf-8")


def test_the_shipped_byte_tokenizer_is_the_one_data_prep_builds(tmp_path):
    """`python -m data_prep.byte_tokenizer --out F` (docs/data.md) writes the shipped file's tokenizer."""
    out = tmp_path / "byte_tokenizer.json"
    res = subprocess.run([sys.executable, "-m", "data_prep.byte_tokenizer", "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 0 and "257 tokens" in res.stderr, res.stderr
    assert Tokenizer.from_file(str(BYTE_TOKENIZER)).to_str() == Tokenizer.from_file(str(out)).to_str()
    assert byte_tokenizer.build().to_str() == Tokenizer.from_file(str(out)).to_str()
    res = subprocess.run([sys.executable, "-m", "data_prep.byte_tokenizer", "--out", str(out / "x.json")], cwd=ROOT,
                         capture_output=True, text=True)  # a file where its folder should be: one line, no traceback
    assert res.returncode == 2 and res.stderr.startswith("data_prep.byte_tokenizer: error: cannot write"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_byte_tokenizer_round_trips_enwik8_like_text_exactly(tmp_path):
    text = enwik8_like().decode("utf-8") + "literal <0x41> and \x00\x7f control bytes"
    tok = Tokenizer.from_file(str(BYTE_TOKENIZER))
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids == list(text.encode("utf-8"))  # 256 symbols, no merges: one token per byte, id = byte value
    assert tok.decode(ids) == text
    assert tok.get_vocab_size() == 257 and tok.token_to_id("<|endoftext|>") == 256
    assert is_byte_tokenizer(tok) and not is_byte_tokenizer(Tokenizer.from_file(str(ROOT / "data/20B_tokenizer.json")))
    # and through data_prep.tokenize, which reads it like any tokenizer.json
    from data_prep.tokenize import run

    (tmp_path / "doc.txt").write_text(text, encoding="utf-8")
    run([str(tmp_path / "doc.txt"), "--tokenizer", str(BYTE_TOKENIZER), "--out", str(tmp_path / "bytes"),
         "--workers", "1", "--no-progress"])
    tokens = IndexedDataset(tmp_path / "bytes")[0]
    assert tokens.dtype == np.uint16 and list(tokens) == list(text.encode("utf-8")) + [256]  # + EOD


def test_enwik8_split_is_by_bytes(tmp_path):
    data = enwik8_like()
    assert len(data) > 3 * 4000
    (tmp_path / "enwik8").write_bytes(data)
    with zipfile.ZipFile(tmp_path / "enwik8.zip", "w") as z:
        z.write(tmp_path / "enwik8", "enwik8")
    for source in ("enwik8", "enwik8.zip"):
        prefix = tmp_path / f"out_{source}" / "e8"
        m = enwik8.run([str(tmp_path / source), "--out", str(prefix), "--test-bytes", "4000"])
        parts = {name: bytes(IndexedDataset(f"{prefix}_{name}")[0].astype(np.uint8)) for name in ("train", "valid",
                                                                                                     "test")}
        assert parts == {"train": data[:-8000], "valid": data[-8000:-4000], "test": data[-4000:]}
        assert all(len(IndexedDataset(f"{prefix}_{name}")) == 1 for name in parts)  # one document each
        assert Path(f"{prefix}_test.raw").read_bytes() == data[-4000:]
        assert Path(f"{prefix}_valid.raw").read_bytes() == data[-8000:-4000]
        assert m["splits"]["train"]["bytes"] == len(data) - 8000 and m["input"]["bytes"] == len(data)
    # a rerun with another split stopped while it writes (here: the manifest's write fails) leaves the earlier
    # set whole, not a new train split beside the old valid and test (which then lay inside train), and no temporary
    prefix = tmp_path / "out_enwik8" / "e8"
    before = {p.name: p.read_bytes() for p in prefix.parent.iterdir()}
    real = enwik8.write_bytes

    def fails_at_the_manifest(path, data):
        if path.endswith(".manifest.json"):
            raise KeyboardInterrupt
        return real(path, data)

    enwik8.write_bytes = fails_at_the_manifest
    try:
        with pytest.raises(KeyboardInterrupt):
            enwik8.run([str(tmp_path / "enwik8"), "--out", str(prefix), "--test-bytes", "2000"])
    finally:
        enwik8.write_bytes = real
    assert {p.name: p.read_bytes() for p in prefix.parent.iterdir()} == before


def test_enwik8_standard_sizes():
    """90M / 5M / 5M on 10^8 bytes (the rule applied to a zero-filled stand-in of enwik8's size)."""
    parts = enwik8.split(bytes(enwik8.ENWIK8_BYTES), enwik8.TEST_BYTES)
    assert {k: len(v) for k, v in parts.items()} == {"train": 90_000_000, "valid": 5_000_000, "test": 5_000_000}


@pytest.mark.parametrize("args,message", [(["missing.bin"], "input not found"),
                                          (["SMALL", "--test-bytes", "1M"], "too few for a validation and a test"),
                                          (["FOLDER"], "is a folder: name the enwik8 file")])
def test_enwik8_user_errors_are_one_line(tmp_path, capsys, args, message):
    (tmp_path / "small").write_bytes(b"x" * 100)
    named = {"SMALL": str(tmp_path / "small"), "missing.bin": str(tmp_path / "missing.bin"), "FOLDER": str(tmp_path)}
    args = [named.get(a, a) for a in args]
    assert enwik8.main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("data_prep.enwik8: error:") and message in err and "\n" not in err


# ---------------------------------------------------------------------------------------------------------
# evaluation


def split_inside_a_character(tmp_path) -> tuple[bytes, str]:
    """enwik8-like bytes split so the test split starts inside a 3-byte character: (test bytes, its .raw path)."""
    data = enwik8_like()
    cut = data.index("日".encode(), len(data) - 3000) + 1
    prefix = tmp_path / "cut"
    m = enwik8.run([str(_write(tmp_path / "in", data)), "--out", str(prefix), "--test-bytes", str(len(data) - cut)])
    assert m["splits"]["test"]["valid_utf8"] is False
    return data[cut:], f"{prefix}_test.raw"


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_byte_level_scoring_counts_every_byte_once_and_bits_per_char(tmp_path):
    test_bytes, raw = split_inside_a_character(tmp_path)
    docs = load_local("enwik8", raw)
    assert len(docs) == 1
    byte_tok = Tokenizer.from_file(str(BYTE_TOKENIZER))
    (ids,) = encode_documents(byte_tok, docs)
    assert bytes(ids.astype(np.uint8)) == test_bytes  # exact, the cut character's tail included
    with pytest.raises(CorpusError, match="not UTF-8.*byte-level tokenizer"):
        encode_documents(Tokenizer.from_file(str(ROOT / "data/20B_tokenizer.json")), docs)

    from builders import model_config

    cfg = model_config(num_layers=2, hidden_size=32, num_attention_heads=2, vocab_size=257, seq_length=64,
                       vocab_file=str(BYTE_TOKENIZER))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    r = score_corpus(model, byte_tok, docs, 64, 256, progress=False)
    chars = len(test_bytes.decode("utf-8", "surrogateescape"))
    assert r["tokens"] == r["bytes"] == len(test_bytes) and r["chars"] == chars < len(test_bytes)
    assert r["bits_per_char"] == pytest.approx(r["nll"] / (chars * math.log(2)), rel=1e-12)
    assert r["bits_per_byte"] == pytest.approx(r["nll"] / (len(test_bytes) * math.log(2)), rel=1e-12)


def test_bits_per_char_formula():
    m = corpus_metrics(nll=1000.0, tokens=400, words=250, n_bytes=1200, documents=3, chars=1100)
    assert m["chars"] == 1100 and m["bits_per_char"] == pytest.approx(1000.0 / (1100 * math.log(2)))
    assert "bits_per_char" not in corpus_metrics(1000.0, 400, 250, 1200, 3)


def test_a_byte_level_model_trains_on_enwik8_splits_and_is_evaluated(tmp_path):
    """data_prep.enwik8 -> train.py (byte tokenizer, vocabulary 257) -> eval.perplexity --corpora enwik8: every test
    byte is scored once and bits per character is NLL / (chars ln 2)."""
    data = enwik8_like(120)
    prefix = tmp_path / "data" / "e8"
    enwik8.run([str(_write(tmp_path / "enwik8", data)), "--out", str(prefix), "--test-bytes", "3000"])
    save = tmp_path / "run"
    args = ["configs/tiny.yml", "vocab_size=257", f"vocab_file={BYTE_TOKENIZER}", "seq_length=64",
            f"train_data_paths=[{prefix}_train]", f"valid_data_paths=[{prefix}_valid]", "train_iters=20",
            "train_batch_size=8", "train_micro_batch_size_per_gpu=8", "eval_interval=10", "eval_iters=1",
            "log_interval=1", "checkpoint_factor=20", "precision=fp32", f"save={save}"]
    out = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, env=train_env(), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    loss = [r["loss"] for r in rows if "loss" in r]
    assert loss[0] == pytest.approx(math.log(384), abs=0.5) and loss[-1] < loss[0] - 1.0  # 257 padded to 384
    results = tmp_path / "eval.json"
    out = subprocess.run([sys.executable, "-m", "eval.perplexity", str(save), "--corpora", "enwik8", "--corpus-path",
                          f"enwik8={prefix}_test.raw", "--device", "cpu", "--no-progress", "--out", str(results)],
                         cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(results.read_text())["corpora"]["enwik8"]
    chars = len(data[-3000:].decode("utf-8", "surrogateescape"))
    assert r["tokens"] == r["bytes"] == 3000 and r["chars"] == chars
    assert r["bits_per_char"] == pytest.approx(r["nll"] / (chars * math.log(2)), rel=1e-12)
    assert r["bits_per_char"] < math.log2(257)  # it learned something about the bytes
    assert "bits/char" in out.stdout
