"""The embedded training sample: intact, attributed, and disjoint from the evaluation corpora."""

import gzip
import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data/sample/c4_sample.jsonl"


def test_sample_corpus_is_the_attributed_file():
    digest = hashlib.sha256(SAMPLE.read_bytes()).hexdigest()
    assert digest == "cdd5b754119131d2934e3e799a059a9d64f53a6aac9e7e2ef79b43120bb01a32"
    sources = (ROOT / "data/SOURCES.md").read_text()
    assert digest in sources and "ODC-BY 1.0" in sources
    pile = hashlib.sha256((ROOT / "data/sample/pile_text.jsonl").read_bytes()).hexdigest()
    assert pile in sources


def _eval_docs():
    docs = []
    for p in sorted((ROOT / "data/eval").glob("c4/*.json.gz")):
        docs += [json.loads(line)["text"] for line in gzip.decompress(p.read_bytes()).decode().splitlines() if line]
    for p in sorted((ROOT / "data/eval").glob("fineweb_edu/*.jsonl")):
        docs += [json.loads(line)["text"] for line in p.read_text().splitlines() if line.strip()]
    for p in sorted((ROOT / "data/eval").glob("wikitext/*.raw")):
        docs += [line.strip() for line in p.read_text().splitlines() if len(line.strip()) > 200]
    return docs


def _paragraphs(text):
    return {" ".join(line.split()) for line in text.splitlines() if len(line.strip()) >= 50}


def test_no_evaluation_document_is_in_the_training_sample():
    docs = _eval_docs()
    assert len(docs) > 100  # the C4, FineWeb-Edu and WikiText evaluation samples
    train = [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines()]
    assert not set(docs) & set(train)
    train_paragraphs = set().union(*map(_paragraphs, train))
    shared = [p[:60] for d in docs for p in _paragraphs(d) if p in train_paragraphs]
    assert not shared, shared[:3]  # no paragraph of 50+ characters is in both
