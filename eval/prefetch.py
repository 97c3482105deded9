"""Fetch the evaluation corpora's Hub documents into a local folder, for compute nodes without network.

    python -m eval.prefetch OUT [--corpora fineweb_edu,c4,wikitext103] [--max-docs N|NAME=N|all ...]

Streams each corpus's first documents from the Hugging Face Hub (default: as many as a sweep scores from the Hub,
``HUB_DEFAULT_DOCS``: FineWeb-Edu 2,000, C4 5,000, all of WikiText-103) and writes them to OUT in the layout of
``data/eval`` (one ``.jsonl.gz`` per corpus, each document with its Hub id) with ``OUT/prefetch.json`` (per corpus:
the split, the count, the documents' manifest hash and the file's sha256). OUT is new, empty, or an earlier prefetch
(whose other corpora it keeps); any other folder is refused. OUT is replaced only once every corpus is written.
Then, offline:

    python -m eval.perplexity RUN --source local --data-dir OUT      # a sweep: eval: {source: local,
                                                                     #   args: [--data-dir, OUT]}

scores the same documents, with the same ids and hashes, as ``--source hub``; a file changed since the prefetch is
refused. See docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from neox_dar.data.identity import sha256_file
from neox_dar.evaluation.cli import parse_max_docs
from neox_dar.evaluation.corpora import (CORPORA, HUB_DEFAULT_DOCS, HUB_SOURCES, LOCAL_PATHS, PREFETCH_FILE,
                                         CorpusError, corpus_manifest, load_hub)
from neox_dar.rundir import check_own_folder, staged_dir, write_text_atomic


def prefetch(out: Path, corpora: list[str], max_docs: dict[str, int | None]) -> dict:
    """Stream each corpus's first ``max_docs[corpus]`` Hub documents (None: all) into ``out`` (new, empty, or an
    earlier prefetch: it holds :data:`PREFETCH_FILE`; any other folder is refused) in the local layout: ``{LOCAL_PATHS[corpus]}/{corpus}.prefetch.jsonl.gz``, rows
    ``{"id", "text"}`` (WikiText: ``{"id", "page"}``, the page before lm-eval's detokenizer), and
    :data:`PREFETCH_FILE`. An earlier prefetch in ``out`` keeps its other corpora. ``out`` is replaced when every
    corpus is written (a failure or Ctrl-C leaves it as it was). Returns what :data:`PREFETCH_FILE` holds."""
    check_own_folder(out, "the prefetch folder", PREFETCH_FILE, "an earlier eval.prefetch folder")
    record = {}
    with staged_dir(out, keep=True) as stage:
        if (stage / PREFETCH_FILE).is_file():
            record = json.loads((stage / PREFETCH_FILE).read_text())["corpora"]
        for corpus in corpora:
            docs = load_hub(corpus, max_docs.get(corpus))
            rel = Path(LOCAL_PATHS[corpus]) / f"{corpus}.prefetch.jsonl.gz"
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(stage / rel, "wt", encoding="utf-8", compresslevel=6) as f:
                for d in docs:
                    row = {"id": d.id, "page": d.count_text} if corpus == "wikitext103" else {"id": d.id,
                                                                                           "text": d.text}
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
            src = HUB_SOURCES[corpus]
            record[corpus] = {"source": f"hub:{src.path}/{src.name}/{src.split}", "file": str(rel),
                              "num_documents": len(docs), "documents_sha256": corpus_manifest(docs, "")["sha256"],
                              "file_sha256": sha256_file(stage / rel)}
        write_text_atomic(stage / PREFETCH_FILE, json.dumps({"corpora": record}, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.prefetch", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="a new or empty folder, or an earlier prefetch's (replaced when every "
                                           "corpus is written; its other corpora kept)")
    ap.add_argument("--corpora", default=",".join(CORPORA), help="comma-separated (default: the papers' three)")
    ap.add_argument("--max-docs", action="append", default=[], metavar="N|NAME=N",
                    help="documents per corpus, 'all' for every one (default: what a sweep scores from the Hub)")
    args = ap.parse_args(argv)
    try:
        names = [c.strip() for c in args.corpora.split(",") if c.strip()]
        unknown = [c for c in names if c not in HUB_SOURCES]
        if unknown or not names:
            raise ValueError(f"--corpora: {unknown or 'empty list'} not on the Hub; choose from "
                             f"{', '.join(HUB_SOURCES)}")
        max_docs = {**{n: HUB_DEFAULT_DOCS[n] for n in names}, **parse_max_docs(args.max_docs, names)}
        record = prefetch(args.out, names, max_docs)
    except KeyboardInterrupt:
        print(f"error: interrupted; {args.out} is left as it was", file=sys.stderr)
        return 130
    except (ValueError, CorpusError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, entry in record.items():
        print(f"{name}: {entry['num_documents']:,} documents from {entry['source']} -> {args.out / entry['file']}")
    print(f"wrote {args.out}; evaluate offline with --source local --data-dir {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
