"""Rolling-window perplexity of a model on the evaluation corpora: the library behind ``python -m eval.perplexity``
and the in-training evaluation. Documents are loaded (and pinned by a manifest), tokenized, scored over rolling
windows (:mod:`.scoring`) and summed into the paper's metrics (:mod:`.metrics`).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from ..rundir import RUN_META
from ..tokenizer import encode_texts
from .corpora import (HUB_SOURCES, LOCAL_PATHS, CorpusError, Document, corpus_manifest, load_hub,
                      load_local, select_documents, to_bytes)
from .metrics import corpus_metrics, count_bytes, count_chars, count_words
from .parallel import EvalGroup
from .scoring import overall_means, score_documents

SWEEP_MANIFEST = "eval_manifest.json"  # in a sweep's output directory: the documents every run scores
BYTE_TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "byte_tokenizer.json"  # python -m data_prep.byte_tokenizer


@functools.lru_cache(maxsize=1)
def _byte_tokenizer_json() -> str:
    return Tokenizer.from_file(str(BYTE_TOKENIZER)).to_str()


def is_byte_tokenizer(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` is the byte-level tokenizer (``data/byte_tokenizer.json``: ids are UTF-8 bytes)."""
    return tokenizer.get_vocab_size() == 257 and tokenizer.to_str() == _byte_tokenizer_json()


def encode_documents(tokenizer: Tokenizer, docs: list[Document]) -> list[np.ndarray]:
    """Token ids of each document's text: the byte-level tokenizer's ids are the text's bytes, taken directly (also
    the bytes of a raw corpus that are not UTF-8, which no text tokenizer can take); any other tokenizer encodes
    the text (no special tokens added)."""
    if is_byte_tokenizer(tokenizer):
        return [np.frombuffer(to_bytes(d.text), dtype=np.uint8).astype(np.int64) for d in docs]
    for d in docs:
        try:
            d.text.encode("utf-8")
        except UnicodeEncodeError:
            raise CorpusError(f"document '{d.id}' holds bytes that are not UTF-8 (a raw byte corpus such as enwik8): "
                              f"only the byte-level tokenizer ({BYTE_TOKENIZER.name}) can score it") from None
    return encode_texts(tokenizer, [d.text for d in docs])


def score_corpus(model: torch.nn.Module, tokenizer: Tokenizer, docs: list[Document], max_length: int,
                 prefix_token: int, stride: int | None = None, batch_size: int = 8, device: str = "cpu",
                 progress: bool = True, name: str = "corpus", per_document: bool = False,
                 group: EvalGroup | None = None) -> dict:
    """Metrics of one corpus (:func:`.metrics.corpus_metrics`, bits per character included) plus throughput,
    attention statistics (means over the windows' real positions, padding left out, e.g. AHA's ``layer{l}/mu_f`` per
    head, and for each statistic its overall mean, e.g. ``mu_f``) and, when ``per_document``, each document's
    ``{"id", "nll", "tokens"}``. With a ``group`` of several ranks (every rank calls this with the same documents),
    each scores its share of the windows and every rank returns the whole corpus's result
    (:func:`.scoring.score_documents`)."""
    group = group or EvalGroup()
    token_ids = encode_documents(tokenizer, docs)
    scores = score_documents(model, token_ids, max_length, prefix_token, stride=stride, batch_size=batch_size,
                             device=device, progress=progress, desc=name, rank=group.rank,
                             world_size=group.world_size, all_gather=group.all_gather)
    words = sum(count_words(d.count_text) for d in docs)
    n_bytes = sum(count_bytes(d.count_text) for d in docs)
    chars = sum(count_chars(d.count_text) for d in docs)
    result = corpus_metrics(float(sum(scores.nll)), int(sum(scores.tokens)), words, n_bytes, len(docs), chars)
    result.update(windows=scores.windows, seconds=scores.seconds,
                  tokens_per_second=result["tokens"] / scores.seconds if scores.seconds > 0 else None)
    if scores.attention_stats:
        result["attention_stats"] = scores.attention_stats
        result.update(overall_means(scores.attention_stats))
    if per_document:
        result["per_document"] = [{"id": d.id, "nll": nll, "tokens": n}
                                  for d, nll, n in zip(docs, scores.nll, scores.tokens)]
    return result


def load_corpora(names: list[str], source: str = "local", data_dir: str | None = None,
                 paths: dict[str, str] | None = None, max_docs: dict[str, int | None] | None = None,
                 manifest: dict | None = None) -> tuple[dict[str, list[Document]], dict[str, dict]]:
    """The documents each corpus scores and their manifest entries (:func:`eval.corpora.corpus_manifest`);
    ``max_docs`` maps a corpus to its document count (absent or None: all)."""
    paths, max_docs = paths or {}, max_docs or {}
    selected, entries = {}, {}
    for name in names:
        wanted = manifest["corpora"].get(name) if manifest else None
        if manifest and wanted is None:
            raise CorpusError(f"the manifest has no entry for corpus '{name}'")
        if source == "hub":
            docs = load_hub(name, max_docs=wanted["num_documents"] if wanted else max_docs.get(name))
            src = HUB_SOURCES[name]
            where = f"hub:{src.path}/{src.name}/{src.split}"
        else:
            docs = load_local(name, paths.get(name), data_dir)
            # as the user gave it; the shipped corpora by their place in the repository, not this machine's path
            where = str(paths.get(name) or Path(data_dir or "data/eval") / LOCAL_PATHS[name])
        selected[name] = select_documents(docs, max_docs.get(name), wanted, name)
        entries[name] = corpus_manifest(selected[name], where)
    return selected, entries


def _publish(path: Path, manifest: dict) -> bool:
    """Write ``manifest`` to ``path`` unless it exists, atomically (a reader never sees a partial file; of two
    runs racing, exactly one wins). Returns whether this call wrote it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(manifest, f, indent=1)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def pinned_corpora(path: Path, names: list[str], source: str, data_dir: str | None, paths: dict[str, str],
                   max_docs: dict[str, int | None]) -> tuple[dict[str, list[Document]], dict[str, dict]]:
    """:func:`load_corpora` pinned by the manifest at ``path``: its documents when it exists; otherwise this
    run's documents, whose manifest is written there first, so that every later run scores the same ones."""
    if not path.is_file():
        docs, entries = load_corpora(names, source, data_dir, paths, max_docs)
        if _publish(path, {"corpora": entries}):
            print(f"wrote the evaluation manifest {path} (later runs score the same documents)", file=sys.stderr)
            return docs, entries
    print(f"scoring the documents of {path}", file=sys.stderr)
    return load_corpora(names, source, data_dir, paths, max_docs, json.loads(path.read_text()))


def sweep_manifest_path(checkpoint: str | Path) -> Path:
    """``<sweep dir>/eval_manifest.json`` for a sweep run directory (one holding the sweep's ``run.json``)."""
    run_dir = Path(checkpoint)
    if not (run_dir / RUN_META).is_file():
        raise ValueError(f"--sweep-manifest needs a sweep run directory (with {RUN_META}); {run_dir} is not one")
    return run_dir.resolve().parent / SWEEP_MANIFEST


