"""Tokenize text corpora into a GPT-NeoX / Megatron ``MMapIndexedDataset`` (``PREFIX.bin`` + ``PREFIX.idx``).

    python -m data_prep.tokenize INPUT... --tokenizer PATH --out PREFIX
        [--text-key text] [--max-tokens N] [--workers N] [--seed S] [--strict]

Inputs are files, globs or ``hf:NAME[:CONFIG][@SPLIT]`` (see :mod:`data_prep.sources`), taken in
a seeded shuffle of their sorted names. Every document is tokenized and followed by the EOD
token (``<|endoftext|>``, id 0 for Pythia). The record stream is cut into shards of
``--shard-docs`` records; workers tokenize shards in parallel, each into
``PREFIX.shards/shard_N.bin/.idx``, and a journal records finished shards, so a restart after
a crash resumes from the last finished shard. At the end the shards are merged in order into
``PREFIX.bin/.idx`` (byte-identical for any ``--workers``), ``PREFIX.manifest.json`` is written
and the shard directory removed.

Token budget (``--max-tokens``): documents are taken whole while they fit; the first one that
does not fit is cut so the dataset holds exactly the budget (the cut document loses its tail
and its EOD token). Without a budget every document is kept.

Bad records (malformed JSON, missing or non-string text field, invalid UTF-8, empty document)
are skipped, counted by reason and listed as ``file:line: reason``; ``--strict`` makes the
first one an error instead.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import itertools
import json
import multiprocessing
import os
import shlex
import shutil
import signal
import sys
import time
from typing import Iterator

import numpy as np

from neox_dar.data.indexed import IndexedDataset, best_dtype, bin_path, idx_path, write_index

from .encode import TokenizerSpec, init_worker, load_tokenizer_spec, process_shard, sha256_file, shard_prefix
from .journal import Journal
from .sources import Source, expand_inputs, iter_records

# Fault injection for tests: SIGKILL this process right after journaling this many shards in a run.
KILL_AFTER_ENV = "NEOX_DAR_DATA_PREP_KILL_AFTER_SHARDS"
MAX_BAD_SHOWN = 20  # on stderr
MAX_BAD_LISTED = 100_000  # in the manifest


class DataPrepError(RuntimeError):
    """A problem that stops the run; printed as one line."""


def parse_count(text: str) -> int:
    """``10_000_000_000``, ``1e9``, ``10B``, ``500M``, ``20k`` -> int."""
    t = text.strip().replace("_", "").replace(",", "")
    scale = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}.get(t[-1:].lower(), 1)
    if scale != 1:
        t = t[:-1]
    try:
        value = int(float(t) * scale) if ("e" in t.lower() or "." in t) else int(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a token count: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data_prep.tokenize", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[2:]) + "\n\nDetails: docs/data.md",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files, globs or hf:NAME[:CONFIG][@SPLIT]")
    p.add_argument("--tokenizer", required=True, help="Hugging Face tokenizer.json or SentencePiece .model")
    p.add_argument("--out", required=True, metavar="PREFIX", help="output prefix: PREFIX.bin, PREFIX.idx, ...")
    p.add_argument("--text-key", default="text", help="JSON field / parquet column holding the text (default: text)")
    p.add_argument("--max-tokens", type=parse_count, default=None, help="token budget, e.g. 10_000_000_000 or 10B")
    p.add_argument("--workers", type=int, default=1, help="tokenizer processes (default 1: in this process)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the input-file shuffle (default 1234)")
    p.add_argument("--strict", action="store_true", help="stop at the first bad record instead of skipping it")
    p.add_argument("--txt-mode", choices=("file", "paragraph"), default="file",
                   help=".txt inputs: one document per file (default) or per blank-line-separated block")
    p.add_argument("--shard-docs", type=int, default=10_000, help="records per shard (default 10000)")
    p.add_argument("--eod-id", type=int, default=None, help="end-of-document id (default: the tokenizer's)")
    p.add_argument("--keep-shards", action="store_true", help="keep PREFIX.shards/ after the merge")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _shards(sources: list[Source], text_key: str, txt_mode: str, shard_docs: int) -> Iterator[tuple[int, list, int]]:
    """(shard id, records, input bytes consumed at its end) for consecutive runs of ``shard_docs`` records."""
    stream = iter_records(sources, text_key, txt_mode)
    for sid in itertools.count():
        chunk = list(itertools.islice(stream, shard_docs))
        if not chunk:
            return
        yield sid, [rec for rec, _ in chunk], chunk[-1][1]


class _Progress:
    """tqdm bar over input bytes (or over tokens with a budget) showing docs/s, tokens/s and ETA."""

    def __init__(self, sources: list[Source], max_tokens: int | None, enabled: bool):
        from neox_dar.progress import progress_bar

        self.by_tokens = max_tokens is not None
        total = max_tokens if self.by_tokens else (
            sum(s.size for s in sources) if all(s.size is not None for s in sources) else None)
        self.bar = progress_bar(total=total, unit="tok" if self.by_tokens else "B", unit_scale=True,
                                disable=not enabled, smoothing=0.1)
        self.start, self.docs, self.tokens, self.pos = time.time(), 0, 0, 0

    def update(self, docs: int, tokens: int, pos: int) -> None:
        self.docs, self.tokens = self.docs + docs, self.tokens + tokens
        step = tokens if self.by_tokens else max(0, pos - self.pos)
        if self.by_tokens and self.bar.total is not None:
            step = min(step, self.bar.total - self.bar.n)
        self.pos = max(self.pos, pos)
        dt = max(time.time() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{self.docs / dt:,.0f} docs/s, {self.tokens / dt:,.0f} tok/s", refresh=False)
        self.bar.update(step)

    def close(self) -> None:
        self.bar.close()


def run_shards(args, sources: list[Source], spec: TokenizerSpec, dtype: np.dtype, journal: Journal,
               progress: _Progress) -> tuple[int, list[list], int]:
    """Tokenize every shard not yet journaled, in order, until the input or the budget runs out.

    Returns (number of shards the dataset uses, bad records [[source, line, reason]], tokens).
    """
    kill_after = int(os.environ.get(KILL_AFTER_ENV, "0") or 0)
    work = (spec, args.text_key, dtype.str, journal.directory)
    pool = None
    if args.workers > 1:
        pool = cf.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"),
                                      initializer=init_worker, initargs=(True, os.getpid()))
    window: collections.deque = collections.deque()
    shards = _shards(sources, args.text_key, args.txt_mode, args.shard_docs)
    used, bad, tokens, written = 0, [], 0, 0
    try:
        while True:
            while len(window) < (2 * args.workers if pool is not None else 1):
                nxt = next(shards, None)
                if nxt is None:
                    break
                sid, records, pos = nxt
                if sid in journal.done:
                    window.append((sid, None, pos))
                elif pool is None:
                    window.append((sid, process_shard(sid, records, *work), pos))
                else:
                    window.append((sid, pool.submit(process_shard, sid, records, *work), pos))
            if not window:
                break
            sid, job, pos = window.popleft()
            if job is None:
                entry = journal.done[sid]
            else:
                entry = job.result() if isinstance(job, cf.Future) else job
            if args.strict and entry["bad"]:  # journaled shards too: an earlier run may not have been strict
                src, line, reason = entry["bad"][0]
                raise DataPrepError(f"{_where(sources, src, line)}: {reason} (--strict)")
            if job is not None:
                journal.append(entry)
                written += 1
                if kill_after and written >= kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)
            used, tokens = sid + 1, tokens + entry["tokens"]
            bad.extend(entry["bad"])
            progress.update(entry["docs"], entry["tokens"], pos)
            if args.max_tokens is not None and tokens >= args.max_tokens:
                break
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return used, bad, tokens


def _where(sources: list[Source], src: int, line: int) -> str:
    return f"{sources[src].path}:{line}"


def merge_shards(directory: str, num_shards: int, prefix: str, dtype: np.dtype, max_tokens: int | None) -> dict:
    """Concatenate shards 0..num_shards-1 into ``prefix.bin/.idx`` (cut at ``max_tokens``); returns counts."""
    all_sizes, total, truncated = [], 0, False
    tmp = f"{prefix}.merging"
    with open(bin_path(tmp), "wb") as out:
        for sid in range(num_shards):
            shard = IndexedDataset(shard_prefix(directory, sid))
            sizes = shard.sizes.astype(np.int64)
            if max_tokens is not None:
                room = max_tokens - total
                if room <= 0:
                    break
                ends = np.cumsum(sizes)
                whole = int(np.searchsorted(ends, room, side="right"))
                if whole < len(sizes):
                    cut = room - (int(ends[whole - 1]) if whole else 0)
                    sizes = np.append(sizes[:whole], [cut] if cut > 0 else [])
                    truncated = cut > 0
            n = int(sizes.sum())
            with open(bin_path(shard.prefix), "rb") as f:
                remaining = n * dtype.itemsize
                while remaining:
                    block = f.read(min(remaining, 1 << 24))
                    out.write(block)
                    remaining -= len(block)
            all_sizes.append(sizes)
            total += n
        out.flush()
        os.fsync(out.fileno())
    sizes = np.concatenate(all_sizes) if all_sizes else np.zeros(0, np.int64)
    write_index(idx_path(tmp), dtype, sizes, np.arange(len(sizes) + 1))
    os.replace(bin_path(tmp), bin_path(prefix))
    os.replace(idx_path(tmp), idx_path(prefix))
    return {"documents": int(len(sizes)), "tokens": int(total), "truncated_last_document": truncated}


def _report_bad(sources: list[Source], bad: list[list]) -> dict:
    reasons = collections.Counter(reason.split(" (")[0].split(" at byte")[0] for _, _, reason in bad)
    for src, line, reason in bad[:MAX_BAD_SHOWN]:
        print(f"skipped {_where(sources, src, line)}: {reason}", file=sys.stderr)
    if len(bad) > MAX_BAD_SHOWN:
        print(f"... and {len(bad) - MAX_BAD_SHOWN} more (the first {MAX_BAD_LISTED:,} are listed in the manifest)",
              file=sys.stderr)
    if bad:
        print(f"skipped {len(bad)} bad records: " + ", ".join(f"{k}: {v}" for k, v in reasons.most_common()),
              file=sys.stderr)
    return {"total": len(bad), "by_reason": dict(reasons), "records_listed": min(len(bad), MAX_BAD_LISTED),
            "records": [f"{_where(sources, s, ln)}: {r}" for s, ln, r in bad[:MAX_BAD_LISTED]]}


def run(argv: list[str] | None = None) -> dict:
    """Run the command line; returns the manifest."""
    args = build_parser().parse_args(argv)
    if args.workers < 1 or args.shard_docs < 1:
        raise DataPrepError("--workers and --shard-docs must be >= 1")
    t0 = time.time()
    sources = expand_inputs(args.inputs, args.seed)
    spec = load_tokenizer_spec(args.tokenizer, args.eod_id)
    dtype = best_dtype(spec.vocab_size)
    tok_sha = sha256_file(spec.path)
    plan = {"inputs": [dict(s.describe(), mtime_ns=s.mtime_ns) for s in sources], "tokenizer_sha256": tok_sha,
            "eod_id": spec.eod_id, "text_key": args.text_key, "txt_mode": args.txt_mode,
            "shard_docs": args.shard_docs, "dtype": dtype.name, "seed": args.seed}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    shard_dir = f"{args.out}.shards"
    journal = Journal(shard_dir, plan)
    resumed = len(journal.done)
    progress = _Progress(sources, args.max_tokens, enabled=not args.no_progress)
    try:
        num_shards, bad, total_tokens = run_shards(args, sources, spec, dtype, journal, progress)
    finally:
        progress.close()
    if total_tokens == 0:
        _report_bad(sources, bad)
        raise DataPrepError(f"no usable documents in the inputs ({len(bad)} bad records)")
    counts = merge_shards(shard_dir, num_shards, args.out, dtype, args.max_tokens)
    skipped = _report_bad(sources, bad)
    manifest = {
        "format": "Megatron MMapIndexedDataset (GPT-NeoX), one sequence per document",
        "prefix": os.path.abspath(args.out),
        "bin_sha256": sha256_file(bin_path(args.out)), "idx_sha256": sha256_file(idx_path(args.out)),
        "dtype": dtype.name, "documents": counts["documents"], "tokens": counts["tokens"],
        "max_tokens": args.max_tokens, "truncated_last_document": counts["truncated_last_document"],
        "budget_rule": "whole documents while they fit; the first that does not is cut to fill the budget exactly",
        "eod_id": spec.eod_id,
        "tokenizer": {"path": spec.path, "kind": spec.kind, "sha256": tok_sha, "vocab_size": spec.vocab_size},
        "inputs": [dict(s.describe(), order=i, sha256=sha256_file(s.path) if s.size is not None else None)
                   for i, s in enumerate(sources)],
        "seed": args.seed, "text_key": args.text_key, "txt_mode": args.txt_mode, "shard_docs": args.shard_docs,
        "shards": num_shards, "shards_resumed": resumed, "workers": args.workers, "skipped": skipped,
        "command": "python -m data_prep.tokenize " + shlex.join(sys.argv[1:] if argv is None else argv),
        "seconds": round(time.time() - t0, 3),
    }
    with open(f"{args.out}.manifest.json", "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    if not args.keep_shards:
        shutil.rmtree(shard_dir)
    return manifest


def main(argv: list[str] | None = None) -> int:
    try:
        m = run(argv)
    except (DataPrepError, ValueError, OSError, RuntimeError) as e:
        print(f"data_prep.tokenize: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {m['prefix']}.bin/.idx: {m['documents']:,} documents, {m['tokens']:,} tokens "
          f"({m['skipped']['total']} bad records skipped) in {m['seconds']:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
