"""Rolling-window perplexity of a checkpoint on FineWeb-Edu, C4 and WikiText-103.

    python -m eval.perplexity CHECKPOINT [--corpora fineweb_edu,c4,wikitext103] [--max-docs N]
        [--max-length L] [--stride S] [--batch-size B] [--device D] [--dtype float32] [--out results.json]

CHECKPOINT is a run directory, its ``checkpoints`` directory, one step directory, or a Hugging Face GPT-NeoX
folder. By default every token is scored once with lm-evaluation-harness's ``loglikelihood_rolling`` windows
(``max_length`` = the model's ``seq_length``); ``--stride S`` < L gives every later window ``L - S`` tokens
of re-read context (the Hugging Face stride recipe). See docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer

from .corpora import (CORPORA, DEFAULT_DATA_DIR, HUB_SOURCES, LOCAL_PATHS, CorpusError, Document, corpus_manifest,
                      load_hub, load_local, manifest_hash, select_documents)
from .loading import DTYPES, encode_texts, load_for_eval, load_tokenizer, prefix_token_id
from .metrics import corpus_metrics, count_bytes, count_words
from .scoring import score_documents


def score_corpus(model: torch.nn.Module, tokenizer: Tokenizer, docs: list[Document], max_length: int,
                 prefix_token: int, stride: int | None = None, batch_size: int = 8, device: str = "cpu",
                 progress: bool = True, name: str = "corpus", per_document: bool = False) -> dict:
    """Metrics of one corpus (:func:`eval.metrics.corpus_metrics`) plus throughput, AHA-style attention
    statistics (token-weighted means over all forwards, e.g. ``layer{l}/mu_f`` per head) and, when
    ``per_document``, each document's ``{"id", "nll", "tokens"}``."""
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
    if per_document:
        result["per_document"] = [{"id": d.id, "nll": nll, "tokens": n}
                                  for d, nll, n in zip(docs, scores.nll, scores.tokens)]
    return result


def load_corpora(names: list[str], source: str = "local", data_dir: str | None = None,
                 paths: dict[str, str] | None = None, max_docs: int | None = None,
                 manifest: dict | None = None) -> tuple[dict[str, list[Document]], dict[str, dict]]:
    """The documents each corpus scores and their manifest entries (:func:`eval.corpora.corpus_manifest`)."""
    paths = paths or {}
    selected, entries = {}, {}
    for name in names:
        wanted = manifest["corpora"].get(name) if manifest else None
        if manifest and wanted is None:
            raise CorpusError(f"the manifest has no entry for corpus '{name}'")
        if source == "hub":
            docs = load_hub(name, max_docs=wanted["num_documents"] if wanted else max_docs)
            src = HUB_SOURCES[name]
            where = f"hub:{src.path}/{src.name}/{src.split}"
        else:
            docs = load_local(name, paths.get(name), data_dir)
            where = str(paths.get(name) or Path(data_dir or DEFAULT_DATA_DIR) / LOCAL_PATHS[name])
        selected[name] = select_documents(docs, max_docs, wanted, name)
        entries[name] = corpus_manifest(selected[name], where)
    return selected, entries


def _parse_paths(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or name not in CORPORA:
            raise ValueError(f"--corpus-path wants NAME=PATH with NAME in {', '.join(CORPORA)}, got '{item}'")
        out[name] = path
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eval.perplexity", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="run dir, checkpoints dir, step dir, or Hugging Face GPT-NeoX folder")
    ap.add_argument("--corpora", default=",".join(CORPORA), help=f"comma-separated subset of {','.join(CORPORA)}")
    ap.add_argument("--max-docs", type=int, default=None, help="score only the first N documents of each corpus")
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
        manifest = json.loads(Path(args.manifest).read_text()) if args.manifest else None
        docs, entries = load_corpora(names, args.source, args.data_dir, _parse_paths(args.corpus_path),
                                     args.max_docs, manifest)
        loaded = load_for_eval(args.checkpoint, args.device, args.dtype, args.attention_impl)
        tokenizer = load_tokenizer(loaded.cfg, args.tokenizer, loaded.hf_dir)
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
