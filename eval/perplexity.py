"""Rolling-window perplexity of a checkpoint on FineWeb-Edu, C4 and WikiText-103.

    python -m eval.perplexity CHECKPOINT [--corpora fineweb_edu,c4,wikitext103] [--source local|hub]
        [--max-docs N | --max-docs NAME=N ...] [--max-length L] [--stride S] [--batch-size B] [--device D]
        [--dtype float32] [--manifest m.json | --sweep-manifest] [--out results.json]

CHECKPOINT is a run directory, its ``checkpoints`` directory, one step directory, or a Hugging Face GPT-NeoX
folder. By default every token is scored once with lm-evaluation-harness's ``loglikelihood_rolling`` windows
(``max_length`` = the model's ``seq_length``); ``--stride S`` < L gives every later window ``L - S`` tokens
of re-read context (the Hugging Face stride recipe). The default corpora are the small local samples in
``data/eval`` (offline, for tests); sweeps evaluate on the Hub corpora (``--source hub``). See
docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer

from .corpora import (CORPORA, DEFAULT_DATA_DIR, HUB_SOURCES, LOCAL_PATHS, CorpusError, Document, corpus_manifest,
                      load_hub, load_local, manifest_hash, select_documents)
from .loading import DTYPES, encode_texts, load_for_eval, load_tokenizer, prefix_token_id
from .metrics import corpus_metrics, count_bytes, count_words
from .scoring import overall_mean, score_documents

SWEEP_MANIFEST = "eval_manifest.json"  # in a sweep's output directory: the documents every run scores


def score_corpus(model: torch.nn.Module, tokenizer: Tokenizer, docs: list[Document], max_length: int,
                 prefix_token: int, stride: int | None = None, batch_size: int = 8, device: str = "cpu",
                 progress: bool = True, name: str = "corpus", per_document: bool = False) -> dict:
    """Metrics of one corpus (:func:`eval.metrics.corpus_metrics`) plus throughput, attention statistics (means
    over the windows' real positions, padding left out: AHA's ``layer{l}/mu_f`` per head, and their overall mean
    ``mu_f``) and, when ``per_document``, each document's ``{"id", "nll", "tokens"}``."""
    token_ids = encode_texts(tokenizer, [d.text for d in docs])
    scores = score_documents(model, token_ids, max_length, prefix_token, stride=stride, batch_size=batch_size,
                             device=device, progress=progress, desc=name)
    words = sum(count_words(d.count_text) for d in docs)
    n_bytes = sum(count_bytes(d.count_text) for d in docs)
    result = corpus_metrics(float(sum(scores.nll)), int(sum(scores.tokens)), words, n_bytes, len(docs))
    result.update(windows=scores.windows, seconds=scores.seconds,
                  tokens_per_second=result["tokens"] / scores.seconds if scores.seconds > 0 else None)
    if scores.attention_stats:
        result["attention_stats"] = scores.attention_stats
        result["mu_f"] = overall_mean(scores.attention_stats)
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
            where = str(paths.get(name) or Path(data_dir or DEFAULT_DATA_DIR) / LOCAL_PATHS[name])
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
    from neox_dar.sweep.spec import RUN_META

    run_dir = Path(checkpoint)
    if not (run_dir / RUN_META).is_file():
        raise ValueError(f"--sweep-manifest needs a sweep run directory (with {RUN_META}); {run_dir} is not one")
    return run_dir.resolve().parent / SWEEP_MANIFEST


def _parse_paths(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or name not in CORPORA:
            raise ValueError(f"--corpus-path wants NAME=PATH with NAME in {', '.join(CORPORA)}, got '{item}'")
        out[name] = path
    return out


def _parse_max_docs(items: list[str], names: list[str]) -> dict[str, int | None]:
    """``--max-docs`` values applied in order: ``N`` sets every corpus, ``NAME=N`` one corpus; ``all`` for N is
    no limit."""
    out: dict[str, int | None] = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        if sep and name not in CORPORA:
            raise ValueError(f"--max-docs: unknown corpus '{name}' in '{item}'; choose from {', '.join(CORPORA)}")
        if value == "all":
            count = None
        elif value.isdigit() and int(value) >= 1:
            count = int(value)
        else:
            raise ValueError(f"--max-docs wants N or NAME=N with N >= 1 or 'all', got '{item}'")
        out.update({name: count} if sep else dict.fromkeys(names, count))
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eval.perplexity", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="run dir, checkpoints dir, step dir, or Hugging Face GPT-NeoX folder")
    ap.add_argument("--corpora", default=",".join(CORPORA), help=f"comma-separated subset of {','.join(CORPORA)}")
    ap.add_argument("--max-docs", action="append", default=[], metavar="N|NAME=N",
                    help="score only the first N documents of every corpus, or of corpus NAME (repeatable, applied "
                         "in order; N = all: no limit)")
    ap.add_argument("--max-length", type=int, default=None, help="window length L (default: the model's seq_length)")
    ap.add_argument("--stride", type=int, default=None, help="new tokens scored per later window (default L)")
    ap.add_argument("--batch-size", type=int, default=8, help="windows per forward")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="model dtype (log-probs are float32)")
    ap.add_argument("--attention-impl", default=None, choices=["reference", "sdpa", "triton"],
                    help="override the checkpoint's attention_impl")
    ap.add_argument("--source", default="local", choices=["local", "hub"], help="local files or the Hugging Face Hub")
    ap.add_argument("--data-dir", default=None, help="directory holding the local corpora (default: data/eval)")
    ap.add_argument("--corpus-path", action="append", default=[], metavar="NAME=PATH",
                    help="file or directory for one corpus (repeatable)")
    ap.add_argument("--manifest", default=None, help="score exactly the documents of this manifest JSON")
    ap.add_argument("--sweep-manifest", action="store_true",
                    help=f"CHECKPOINT is a sweep run directory: score the documents of <sweep dir>/{SWEEP_MANIFEST}, "
                         "or write it from this run's documents when it does not exist yet")
    ap.add_argument("--write-manifest", default=None, help="write the manifest of the scored documents here")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the config's vocab_file)")
    ap.add_argument("--prefix-token", default="<|endoftext|>", help="token that precedes every document")
    ap.add_argument("--per-document", action="store_true", help="also write each document's NLL and tokens")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--out", default=None, help="write the results JSON here (default: print it)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        names = [c.strip() for c in args.corpora.split(",") if c.strip()]
        unknown = [c for c in names if c not in CORPORA]
        if unknown or not names:
            raise ValueError(f"--corpora: unknown {unknown or 'empty list'}; choose from {', '.join(CORPORA)}")
        if args.manifest and args.sweep_manifest:
            raise ValueError("--manifest and --sweep-manifest exclude each other")
        corpus_args = (names, args.source, args.data_dir, _parse_paths(args.corpus_path),
                       _parse_max_docs(args.max_docs, names))
        if args.sweep_manifest:
            docs, entries = pinned_corpora(sweep_manifest_path(args.checkpoint), *corpus_args)
        else:
            manifest = json.loads(Path(args.manifest).read_text()) if args.manifest else None
            docs, entries = load_corpora(*corpus_args, manifest)
        loaded = load_for_eval(args.checkpoint, args.device, args.dtype, args.attention_impl)
        tokenizer = load_tokenizer(loaded.cfg, args.tokenizer, loaded.model_dir)
        prefix = prefix_token_id(tokenizer, args.prefix_token)
        max_length = args.max_length or loaded.cfg.seq_length
        if max_length > loaded.cfg.max_position_embeddings:
            raise ValueError(f"--max-length {max_length} exceeds max_position_embeddings "
                             f"{loaded.cfg.max_position_embeddings}")
        corpora = {name: score_corpus(loaded.model, tokenizer, docs[name], max_length, prefix, args.stride,
                                      args.batch_size, args.device, not args.no_progress, name, args.per_document)
                   for name in names}
    except (FileNotFoundError, CorpusError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name in names:
        corpora[name]["manifest_sha256"] = entries[name]["sha256"]
        corpora[name]["source"] = entries[name]["source"]
    results = {**loaded.info, "manifest_hash": manifest_hash(entries), "max_length": max_length,
               "stride": args.stride or max_length, "dtype": args.dtype, "device": str(args.device),
               "corpora": corpora}
    text = json.dumps(results, indent=2)
    if args.write_manifest:
        Path(args.write_manifest).write_text(json.dumps({"corpora": entries}, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
        for name, r in corpora.items():
            print(f"{name}: token ppl {r['token_perplexity']:.3f}  word ppl {r['word_perplexity']:.3f}  "
                  f"bits/byte {r['bits_per_byte']:.4f}  ({r['documents']} docs, {r['tokens']} tokens)")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
