"""Evaluation corpora: the data/eval samples load, WikiText is split and counted as lm-eval does,
bad files give clear errors, manifests pin the scored documents, and no document is in the training sample."""

import gzip
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lm_eval.api.task import ConfigurableTask
from lm_eval.tasks.wikitext.preprocess_wikitext import (
    process_results,
    wikitext_detokenizer,
)

from neox_dar.evaluation.corpora import (
    CORPORA,
    DEFAULT_DATA_DIR,
    CorpusError,
    corpus_manifest,
    load_local,
    select_documents,
    wikitext_pages,
)
from neox_dar.evaluation.metrics import count_bytes, count_words

REPO = Path(__file__).resolve().parents[1]
TRAIN_SAMPLE = REPO / "data" / "sample" / "c4_sample.jsonl"


@pytest.fixture(scope="module")
def corpora():
    return {name: load_local(name) for name in CORPORA}


def test_three_corpora_load_from_data_eval(corpora):
    assert DEFAULT_DATA_DIR == REPO / "data" / "eval"
    assert len(corpora["wikitext103"]) == 62          # articles of the WikiText-2 (= WikiText-103) test split
    assert len(corpora["c4"]) == 30
    assert len(corpora["fineweb_edu"]) == 150
    for docs in corpora.values():
        assert len({d.id for d in docs}) == len(docs)
        assert all(d.text.strip() for d in docs)
    assert corpora["fineweb_edu"][0].text.startswith("The Independent Jane")
    assert corpora["wikitext103"][0].count_text.startswith(" = Robert Boulter = \n")


def test_wikitext_scored_detokenized_and_counted_like_lm_eval(corpora):
    for doc in corpora["wikitext103"]:
        page = {"page": doc.count_text}
        assert doc.text == wikitext_detokenizer(page)
        ll = -123.0
        lm_eval_counts = process_results(page, [ll])
        assert lm_eval_counts["word_perplexity"] == (ll, count_words(doc.count_text))
        assert lm_eval_counts["byte_perplexity"] == (ll, count_bytes(doc.count_text))
    total_words = sum(count_words(d.count_text) for d in corpora["wikitext103"])
    assert total_words == sum(len(re.split(r"\s+", d.count_text)) for d in corpora["wikitext103"])


def test_generic_counts_match_lm_eval_tasks(corpora):
    for doc in corpora["c4"] + corpora["fineweb_edu"][:20]:
        assert count_words(doc.text) == ConfigurableTask.count_words(doc.text)
        assert count_bytes(doc.text) == ConfigurableTask.count_bytes(doc.text)


def test_wikitext_page_split_rule():
    raw = "\n".join([" ", " = Alpha = ", " ", " Body one . ", " = = Section = = ", " more ", " ",
                     " = Beta = ", " Body two ", ""])
    pages = wikitext_pages(raw)
    assert pages == [" = Alpha = \n \n Body one . \n = = Section = = \n more \n ", " = Beta = \n Body two \n"]
    assert wikitext_pages(" = Only = \n x") == [" = Only = \n x"]


def test_wikitext_pages_cover_the_file():
    raw = (DEFAULT_DATA_DIR / "wikitext" / "wiki.test.raw").read_text(encoding="utf-8")
    pages = wikitext_pages(raw)
    assert all(p.split("\n", 1)[0].strip().startswith("= ") for p in pages)
    assert "\n".join(pages) == raw[raw.index(" = Robert Boulter"):]   # only the blank first line is dropped


def test_no_evaluation_document_in_training_sample(corpora):
    train = [json.loads(line) for line in TRAIN_SAMPLE.open(encoding="utf-8")]
    norm = lambda s: " ".join(s.split())  # noqa: E731
    train_texts = {norm(r["text"]) for r in train}
    train_urls = {r.get("url") for r in train}
    for name, docs in corpora.items():
        for doc in docs:
            assert norm(doc.text) not in train_texts, (name, doc.id)
    c4_urls = {json.loads(line)["url"] for f in sorted((DEFAULT_DATA_DIR / "c4").glob("*.json.gz"))
               for line in gzip.open(f, "rt", encoding="utf-8")}
    assert not c4_urls & train_urls


def test_missing_corpus_names_the_path(tmp_path):
    missing = tmp_path / "nope.json.gz"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        load_local("c4", missing)
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path))):
        load_local("fineweb_edu", tmp_path)          # a directory without corpus files
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "wikitext"))):
        load_local("wikitext103", data_dir=tmp_path)


@pytest.mark.parametrize("name,content,match", [
    ("c4", b"this is not gzip data at all", "corrupt c4 file"),
    ("c4", gzip.compress(b'{"text": "ok"}\n{"text": "trunc', mtime=0)[:-9], "corrupt c4 file"),
    ("c4", gzip.compress(b'{"text": "ok"}\n{not json}\n', mtime=0), "line 2 is not JSON"),
    ("fineweb_edu", b'{"body": "no text field"}\n', "no string 'text' field"),
    ("wikitext103", b"\xff\xfe = Bad = \n\x80\x81", "not UTF-8"),
    ("wikitext103", b"plain text without any article heading\n", "no ' = Title = '"),
    ("fineweb_edu", b"PAR1 truncated parquet", "corrupt fineweb_edu file"),
])
def test_corrupt_corpus_names_the_path(tmp_path, name, content, match):
    default = ".parquet" if content.startswith(b"PAR1") else ".jsonl"
    suffix = {"c4": ".json.gz", "wikitext103": ".raw"}.get(name, default)
    path = tmp_path / f"bad{suffix}"
    path.write_bytes(content)
    with pytest.raises(CorpusError, match=match) as info:
        load_local(name, path)
    assert str(path) in str(info.value)


def test_fineweb_parquet_directory(tmp_path):
    pq.write_table(pa.table({"id": ["<urn:b>", "<urn:c>"], "text": ["second doc", "third doc"],
                             "score": [3.1, 2.7]}), tmp_path / "part-01.parquet")
    pq.write_table(pa.table({"id": ["<urn:a>"], "text": ["first doc"], "score": [4.0]}), tmp_path / "part-00.parquet")
    docs = load_local("fineweb_edu", tmp_path)
    assert [(d.id, d.text) for d in docs] == [("<urn:a>", "first doc"), ("<urn:b>", "second doc"),
                                              ("<urn:c>", "third doc")]


def test_manifest_pins_documents_and_max_docs_is_a_prefix(corpora):
    docs = corpora["c4"]
    assert select_documents(docs, max_docs=5) == docs[:5]
    entry = corpus_manifest(docs[3:9], "data/eval")
    assert entry["num_documents"] == 6 and len(entry["sha256"]) == 64
    assert corpus_manifest(docs[3:9], "elsewhere")["sha256"] == entry["sha256"]   # the hash ignores the source
    assert select_documents(list(reversed(docs)), manifest_entry=entry, corpus="c4") == docs[3:9]
    assert select_documents(docs, max_docs=2, manifest_entry=entry) == docs[3:5]
    tampered = json.loads(json.dumps(entry))
    tampered["documents"][1]["sha256"] = "0" * 64
    with pytest.raises(CorpusError, match="differs from the manifest"):
        select_documents(docs, manifest_entry=tampered, corpus="c4")
    with pytest.raises(CorpusError, match="not in the loaded corpus"):
        select_documents(docs[:3], manifest_entry=entry, corpus="c4")


def test_a_hub_corpus_without_network_is_one_line(monkeypatch):
    """source: hub on a machine without network (or the Hub refusing): one line naming the way out, for eval.perplexity
    and for training's eval_perplexity (a ConnectionError traceback after the library's retries)."""
    import datasets

    from neox_dar.evaluation.corpora import CorpusError, load_hub

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'allenai/c4' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(CorpusError, match=r"could not be read from the Hugging Face Hub \(ConnectionError: Couldn't "
                                          r"reach 'allenai/c4' on the Hub \(LocalEntryNotFoundError\)\); without") as e:
        load_hub("c4", 2)
    assert "\n" not in str(e.value)
