"""Evaluation corpora: WikiText-103 test, C4 ``en`` validation, FineWeb-Edu (the papers' three, :data:`CORPORA`),
loaded from local files or the Hub; and enwik8's test split (:data:`EXTRA_CORPORA`, a local file only).

Each corpus is a list of :class:`Document`: an id, the text the model scores, and the text words and bytes are
counted on (the same string except for WikiText, where lm-evaluation-harness scores the detokenized page but
counts the original page).

Local formats (a path may be one file or a directory of such files, read in sorted order):

* ``wikitext103``: a raw WikiText file (``wiki.test.raw``), split into articles exactly as the
  ``EleutherAI/wikitext_document_level`` dataset that lm-eval's ``wikitext`` task reads does: a new page starts
  at every line that is a level-1 heading (`` = Title = ``); or ``.jsonl.gz`` rows ``{"id", "page"}``, one page
  each (what :func:`prefetch` writes).
* ``c4``: ``.json.gz`` / ``.jsonl`` / ``.json`` with one JSON object per line and a ``text`` field.
* ``fineweb_edu``: ``.parquet`` or ``.jsonl(.gz)`` with a ``text`` field (and ``id`` when present).
* ``enwik8``: a raw byte file (``.raw``), one document: the test split ``python -m data_prep.enwik8`` writes
  (``PREFIX_test.raw``, enwik8's last 5M bytes). It has no default path (``--corpus-path enwik8=...``). Its text is
  the bytes decoded as UTF-8 with ``surrogateescape``, so a split boundary inside a character loses nothing (a
  byte-level model scores the exact bytes; see :func:`neox_dar.evaluation.perplexity.encode_documents`).

Hub sources (``source="hub"``) stream the same splits with ``datasets``; sweeps score the first
:data:`HUB_DEFAULT_DOCS` documents of each. :func:`prefetch` writes those documents into a folder of the local
layout, with their ids and hashes (:data:`PREFETCH_FILE`), for compute nodes without network: ``source="local"``
with that folder as the data directory then scores the Hub's documents, ids and hashes included, and refuses a
file that changed since.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from neox_dar.corpus_names import ALL_CORPORA, CORPORA, EXTRA_CORPORA
from neox_dar.data.identity import sha256_file
from neox_dar.progress import progress_bar

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "eval"
LOCAL_PATHS = {  # relative to the data directory
    "wikitext103": "wikitext",
    "c4": "c4",
    "fineweb_edu": "fineweb_edu",
}


class CorpusError(ValueError):
    """A corpus file that exists but cannot be read as the corpus it should be."""


@dataclass(frozen=True)
class Document:
    """One evaluation document: ``text`` is tokenized and scored, ``count_text`` gives words, characters and bytes.
    Raw byte corpora (enwik8) hold bytes that are not UTF-8 as surrogate escapes, encoded back exactly by
    :func:`to_bytes`."""

    id: str
    text: str
    count_text: str

    @property
    def sha256(self) -> str:
        """Hash of the scored text (and of the counted text when it differs)."""
        payload = self.text if self.count_text == self.text else self.text + "\x00" + self.count_text
        return hashlib.sha256(to_bytes(payload)).hexdigest()


def to_bytes(text: str) -> bytes:
    """A document's bytes: UTF-8, with the surrogate escapes of a raw byte corpus turned back into their bytes."""
    return text.encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class HubSource:
    path: str
    name: str | None
    split: str
    text_field: str


HUB_SOURCES = {
    "wikitext103": HubSource("EleutherAI/wikitext_document_level", "wikitext-103-raw-v1", "test", "page"),
    "c4": HubSource("allenai/c4", "en", "validation", "text"),
    "fineweb_edu": HubSource("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", "text"),
}
# Documents a sweep scores from each Hub source (the first N in the split's order; None: all), about 2M Pythia
# tokens for C4 and FineWeb-Edu and the whole WikiText-103 test set (see docs/evaluation.md for the counts).
HUB_DEFAULT_DOCS: dict[str, int | None] = {"fineweb_edu": 2000, "c4": 5000, "wikitext103": None}


# ----------------------------------------------------------------------------------------------
# WikiText


def wikitext_pages(raw: str) -> list[str]:
    """Split raw WikiText into article pages, as ``EleutherAI/wikitext_document_level`` does.

    Lines are split on ``\\n``; a line whose stripped form (after ``= = =`` -> ``===``, ``= =`` -> ``==``)
    starts with ``"= "`` and ends with ``" ="`` starts a new page; pages are the ``\\n``-joined lines; empty
    (whitespace-only) pages are dropped except the last, which is always kept.
    """
    pages: list[str] = []
    lines: list[str] = []
    for line in raw.split("\n"):
        heading = line.replace("= = =", "===").replace("= =", "==").strip()
        if heading.startswith("= ") and heading.endswith(" ="):
            page = "\n".join(lines)
            if page.strip():
                pages.append(page)
            lines = []
        lines.append(line)
    pages.append("\n".join(lines))
    return pages


@functools.cache
def _wikitext_detokenizer():
    """lm-eval's ``wikitext_detokenizer``, read from its module file alone: importing it by name runs
    ``lm_eval.tasks``' package code (its TaskManager, ~1.5 s) first. Falls back to the import by name."""
    spec = importlib.util.find_spec("lm_eval")
    path = Path(spec.origin).parent / "tasks" / "wikitext" / "preprocess_wikitext.py" if spec and spec.origin else None
    if path is not None and path.is_file():
        module_spec = importlib.util.spec_from_file_location("_neox_dar_preprocess_wikitext", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module.wikitext_detokenizer
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

    return wikitext_detokenizer


def wikitext_document(doc_id: str, page: str) -> Document:
    """A WikiText page scored as lm-eval scores it: the detokenized page, counted on the original page."""
    return Document(doc_id, _wikitext_detokenizer()({"page": page}), page)


def _load_wikitext_file(path: Path) -> Iterator[Document]:
    if path.name.endswith(".jsonl.gz"):  # prefetched pages
        for _, row in _read_jsonl(path, "wikitext103", "page"):
            yield wikitext_document(str(row["id"]), row["page"])
        return
    try:
        # universal newlines, as the dataset script's open(..., encoding="utf-8") reads the file
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    except UnicodeDecodeError as e:
        raise CorpusError(f"corrupt wikitext103 file {path}: not UTF-8 text ({e})") from None
    pages = wikitext_pages(raw)
    if len(pages) < 2 and not raw.lstrip().startswith("="):
        raise CorpusError(f"corrupt wikitext103 file {path}: no ' = Title = ' article headings found")
    for i, page in enumerate(pages):
        yield wikitext_document(f"{path.name}:{i}", page)


# ----------------------------------------------------------------------------------------------
# JSON lines (C4, FineWeb-Edu) and parquet (FineWeb-Edu)


def _read_jsonl(path: Path, corpus: str, field: str = "text") -> Iterator[tuple[int, dict]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise CorpusError(f"corrupt {corpus} file {path}: line {lineno + 1} is not JSON ({e})") from None
                if not isinstance(row, dict) or not isinstance(row.get(field), str):
                    raise CorpusError(f"corrupt {corpus} file {path}: line {lineno + 1} has no string '{field}' "
                                      "field")
                yield lineno, row
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise CorpusError(f"corrupt {corpus} file {path}: {type(e).__name__}: {e}") from None


def _read_parquet(path: Path, corpus: str) -> Iterator[tuple[int, dict]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise CorpusError(f"corrupt {corpus} file {path}: {e}") from None
    if "text" not in table.column_names:
        raise CorpusError(f"corrupt {corpus} file {path}: no 'text' column (columns: {table.column_names})")
    columns = [c for c in ("id", "text") if c in table.column_names]
    yield from enumerate(table.select(columns).to_pylist())


def _load_records(path: Path, corpus: str) -> Iterator[Document]:
    rows = _read_parquet(path, corpus) if path.suffix == ".parquet" else _read_jsonl(path, corpus)
    for i, row in rows:
        doc_id = str(row["id"]) if row.get("id") is not None else f"{path.name}:{i}"
        yield Document(doc_id, row["text"], row["text"])


# ----------------------------------------------------------------------------------------------
# raw bytes (enwik8)


def _load_raw(path: Path) -> Document:
    """A raw byte file as one document (bytes that are not UTF-8 kept as surrogate escapes)."""
    text = path.read_bytes().decode("utf-8", "surrogateescape")
    return Document(path.name, text, text)


# ----------------------------------------------------------------------------------------------
# dispatch


_SUFFIXES = {
    "wikitext103": (".raw", ".txt", ".jsonl.gz"),
    "c4": (".json.gz", ".jsonl.gz", ".jsonl", ".json"),
    "fineweb_edu": (".parquet", ".jsonl", ".jsonl.gz", ".json.gz"),
    "enwik8": (".raw",),
}


def corpus_files(corpus: str, path: str | Path) -> list[Path]:
    """The files of ``corpus`` at ``path`` (a file, or a directory read in sorted order)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{corpus} corpus not found: {p}")
    if p.is_file():
        return [p]
    files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(_SUFFIXES[corpus]))
    if not files:
        raise FileNotFoundError(f"{corpus} corpus: no {'/'.join(_SUFFIXES[corpus])} files in {p}")
    return files


def _check_corpus(corpus: str) -> None:
    if corpus not in ALL_CORPORA:
        raise ValueError(f"unknown corpus '{corpus}'; choose from {', '.join(ALL_CORPORA)}")


def load_local(corpus: str, path: str | Path | None = None, data_dir: str | Path | None = None) -> list[Document]:
    """All documents of ``corpus`` from ``path`` (default: ``{data_dir}/`` + :data:`LOCAL_PATHS`)."""
    _check_corpus(corpus)
    if path is None:
        if corpus not in LOCAL_PATHS:
            raise FileNotFoundError(f"{corpus} has no default file: pass --corpus-path {corpus}=PREFIX_test.raw "
                                    "(written by python -m data_prep.enwik8)")
        path = Path(data_dir or DEFAULT_DATA_DIR) / LOCAL_PATHS[corpus]
        if data_dir is not None and (Path(data_dir) / PREFETCH_FILE).is_file():
            check_prefetched(Path(data_dir), corpus)
    files = corpus_files(corpus, path)
    if corpus == "wikitext103":
        docs = [doc for f in files for doc in _load_wikitext_file(f)]
    elif corpus == "enwik8":
        docs = [_load_raw(f) for f in files]
    else:
        docs = [doc for f in files for doc in _load_records(f, corpus)]
    if not docs:
        raise CorpusError(f"{corpus} corpus at {path} holds no documents")
    return docs


def load_hub(corpus: str, max_docs: int | None = None) -> list[Document]:
    """The first ``max_docs`` documents of ``corpus``'s Hub split (:data:`HUB_SOURCES`), streamed with ``datasets``."""
    _check_corpus(corpus)
    if corpus not in HUB_SOURCES:
        raise CorpusError(f"{corpus} is read from local files only (--source local --corpus-path {corpus}=...)")
    try:
        import datasets
    except ImportError as e:
        raise RuntimeError("--source hub needs the 'datasets' package (pip install datasets)") from e
    src = HUB_SOURCES[corpus]
    prefix = f"{src.path}/{src.name}/{src.split}"
    try:
        return _stream_hub(datasets.load_dataset(src.path, src.name, split=src.split, streaming=True), corpus, src,
                           prefix, max_docs)
    except CorpusError:
        raise
    except Exception as e:  # no network, the Hub refusing, a dataset moved: one line, whatever the library raised
        first = str(e).splitlines()[0] if str(e) else ""
        raise CorpusError(f"{prefix} could not be read from the Hugging Face Hub ({type(e).__name__}: {first}); "
                          "without network, score local copies (source: local; python -m eval.prefetch OUT fetches "
                          "the Hub's documents where there is network)") from None


def _stream_hub(stream, corpus: str, src, prefix: str, max_docs: int | None) -> list[Document]:
    """The first ``max_docs`` documents of a Hub ``stream`` of ``corpus``."""
    docs = []
    with progress_bar(total=max_docs, unit="doc", desc=f"{corpus} from the Hub") as bar:
        for i, row in enumerate(stream):
            if max_docs is not None and i >= max_docs:
                break
            text = row.get(src.text_field)
            if not isinstance(text, str):
                raise CorpusError(f"{prefix} row {i} has no string '{src.text_field}' field")
            if corpus == "wikitext103":
                docs.append(wikitext_document(f"{prefix}:{i}", text))
            else:
                doc_id = str(row["id"]) if row.get("id") is not None else f"{prefix}:{i}"
                docs.append(Document(doc_id, text, text))
            bar.update()
    if not docs:
        raise CorpusError(f"{prefix} yielded no documents")
    return docs


# ----------------------------------------------------------------------------------------------
# subsets and manifests


def corpus_manifest(docs: list[Document], source: str) -> dict:
    """``{"source", "documents": [{"id", "sha256"}], "sha256"}``: the subset's identity, hashed."""
    entries = [{"id": d.id, "sha256": d.sha256} for d in docs]
    digest = hashlib.sha256(json.dumps(entries, sort_keys=True).encode("utf-8")).hexdigest()
    return {"source": source, "num_documents": len(docs), "documents": entries, "sha256": digest}


def manifest_hash(manifest: dict[str, dict]) -> str:
    """One hash for a whole evaluation manifest (corpus name -> :func:`corpus_manifest`)."""
    summary = {name: entry["sha256"] for name, entry in sorted(manifest.items())}
    return hashlib.sha256(json.dumps(summary, sort_keys=True).encode("utf-8")).hexdigest()


def select_documents(docs: list[Document], max_docs: int | None = None,
                     manifest_entry: dict | None = None, corpus: str = "") -> list[Document]:
    """The documents a run scores: the manifest's documents in its order (each present with the same hash),
    or all documents; then the first ``max_docs`` of them."""
    if manifest_entry is not None:
        by_id = {d.id: d for d in docs}
        chosen = []
        for entry in manifest_entry["documents"]:
            doc = by_id.get(entry["id"])
            if doc is None:
                raise CorpusError(f"{corpus}: manifest document '{entry['id']}' is not in the loaded corpus")
            if doc.sha256 != entry["sha256"]:
                raise CorpusError(f"{corpus}: document '{entry['id']}' differs from the manifest (sha256 "
                                  f"{doc.sha256[:12]}... != {entry['sha256'][:12]}...)")
            chosen.append(doc)
        docs = chosen
    if max_docs is not None:
        if max_docs < 1:
            raise ValueError(f"--max-docs must be >= 1, got {max_docs}")
        docs = docs[:max_docs]
    return docs


# ----------------------------------------------------------------------------------------------
# prefetched Hub documents, for machines without network

PREFETCH_FILE = "prefetch.json"
"""What ``python -m eval.prefetch`` wrote: per corpus its Hub split, file, document count, the documents' manifest
hash and the file's sha256."""


def check_prefetched(data_dir: Path, corpus: str) -> None:
    """CorpusError (one line) when ``corpus``'s file in an ``eval.prefetch`` folder is not the file it wrote."""
    entry = json.loads((data_dir / PREFETCH_FILE).read_text())["corpora"].get(corpus)
    if entry is None:
        raise CorpusError(f"{data_dir} was prefetched without {corpus} (python -m eval.prefetch {data_dir} "
                          f"--corpora {corpus} ...)")
    path = data_dir / entry["file"]
    if not path.is_file() or sha256_file(path) != entry["file_sha256"]:
        raise CorpusError(f"{path} is not the file python -m eval.prefetch wrote ({data_dir / PREFETCH_FILE} "
                          "records its sha256): prefetch again")
