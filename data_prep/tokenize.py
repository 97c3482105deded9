"""Tokenize text corpora into a GPT-NeoX / Megatron ``MMapIndexedDataset`` (``PREFIX.bin`` + ``PREFIX.idx``).

    python -m data_prep.tokenize INPUT... --tokenizer PATH --out PREFIX
        [--text-key text] [--max-tokens N] [--valid-tokens N] [--workers N] [--seed S] [--strict]

Inputs are files, globs or ``hf:NAME[:CONFIG][@SPLIT]`` (see :mod:`data_prep.sources`), taken in
a seeded shuffle of their sorted names. Every document is tokenized and followed by the EOD
token (``<|endoftext|>``, id 0 for Pythia). The record stream is cut into shards of about
``--shard-bytes`` of text (16 MB by default; ``--shard-docs`` also caps the records per shard), and
each shard into pieces of about 1 MiB that the workers tokenize in parallel, so one large file uses
every worker and a worker holds one piece at a time. Finished shards are written to
``PREFIX.shards/shard_N.bin/.idx`` and journaled, so a restart after a crash resumes from the last
finished shard (shards of a different run found there are removed, with a message). At the end the
shards are merged in order (byte-identical for any ``--workers`` and any shard size) into the shard
directory, with the manifest, and only then renamed into place: ``PREFIX.manifest.json`` first, then
``PREFIX_valid.bin/.idx``, ``PREFIX.bin`` and last ``PREFIX.idx``; the shard directory is then removed.
A kill while they are renamed leaves a ``PREFIX.idx`` that the new manifest does not describe, which
training refuses (:func:`neox_dar.data.identity.prefix_identity`) until the same command, run again,
completes the set.

Token budgets: with ``--valid-tokens V`` the first documents go to a held-out validation file
``PREFIX_valid.bin/.idx`` until it holds exactly V tokens, and the training file starts at the next
document; ``--max-tokens N`` makes the training file hold exactly N tokens. Documents are taken
whole while they fit; the first one that does not fit is cut to fill the budget exactly (it loses
its tail and its EOD token). Without ``--max-tokens`` the training file takes every remaining
document. Train with ``train_data_paths: [PREFIX]`` and ``valid_data_paths: [PREFIX_valid]``.

Bad records (malformed JSON, missing or non-string text field, invalid UTF-8, empty document)
are skipped, counted by reason and listed as ``file:line: reason``; ``--strict`` makes the
first one an error instead.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import decimal
import json
import multiprocessing
import os
import resource
import shlex
import shutil
import signal
import sys
import time
from typing import Iterator

import numpy as np

from neox_dar.data.identity import sha256_file
from neox_dar.data.indexed import best_dtype
from neox_dar.progress import progress_bar
from neox_dar.rundir import write_text_atomic

from .budget import Budget, Segment
from .encode import PIECE_BYTES, TokenizerSpec, encode_piece, init_worker, load_tokenizer_spec
from .journal import MANIFEST, Journal, shard_output
from .outputs import make_out_dir, merge_shards, output_entry, replace_outputs
from .sources import Record, Source, expand_inputs, iter_records

# Fault injection for tests: SIGKILL this process right after journaling this many shards in a run.
KILL_AFTER_ENV = "NEOX_DAR_DATA_PREP_KILL_AFTER_SHARDS"
MAX_BAD_SHOWN = 20  # on stderr
MAX_BAD_LISTED = 100_000  # in the manifest


class DataPrepError(RuntimeError):
    """A problem that stops the run; printed as one line."""


def parse_count(text: str) -> int:
    """``10_000_000_000``, ``1e9``, ``10B``, ``10.001B``, ``500M``, ``16M``, ``20k`` -> int (exact, no float rounding)."""
    t = text.strip().replace("_", "").replace(",", "")
    scale = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}.get(t[-1:].lower(), 1)
    if scale != 1:
        t = t[:-1]
    try:
        value = decimal.Decimal(t) * scale
    except decimal.InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data_prep.tokenize", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[2:]) + "\n\nDetails: docs/data.md",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files, globs or hf:NAME[:CONFIG][@SPLIT]")
    p.add_argument("--tokenizer", required=True, metavar="DIR_OR_FILE",
                   help="Hugging Face tokenizer.json, SentencePiece .model, or a model folder holding one")
    p.add_argument("--out", required=True, metavar="PREFIX", help="output prefix: PREFIX.bin, PREFIX.idx, ...")
    p.add_argument("--text-key", default="text", help="JSON field / parquet column holding the text (default: text)")
    p.add_argument("--max-tokens", type=parse_count, default=None,
                   help="tokens in the training file, e.g. 10_000_000_000 or 10B (default: all that remain)")
    p.add_argument("--valid-tokens", type=parse_count, default=None,
                   help="also write a held-out PREFIX_valid.bin/.idx of exactly this many tokens, from the first "
                        "documents (none of which is in PREFIX.bin)")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="tokenizer processes, one thread each (default: one per CPU this process may use, here "
                        "%(default)s); 1 tokenizes in this process with the tokenizer's own threads")
    p.add_argument("--seed", type=int, default=1234, help="seed of the input-file shuffle (default 1234)")
    p.add_argument("--strict", action="store_true", help="stop at the first bad record instead of skipping it")
    p.add_argument("--txt-mode", choices=("file", "paragraph"), default="file",
                   help=".txt inputs: one document per file (default) or per blank-line-separated block")
    p.add_argument("--shard-bytes", type=parse_count, default=16_000_000,
                   help="text per shard, the unit of resume, e.g. 16M (default 16M)")
    p.add_argument("--shard-docs", type=int, default=None, help="also end a shard after this many records")
    p.add_argument("--eod-id", type=int, default=None, help="end-of-document id (default: the tokenizer's)")
    p.add_argument("--keep-shards", action="store_true", help="keep PREFIX.shards/ after the merge")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _text_bytes(record: Record) -> int:
    """Size of a record's text: bytes of a JSON line or text file, characters of a parquet / HF value."""
    payload = record[3]
    return len(payload) if isinstance(payload, (bytes, str)) else 0


def cut_shards(stream, shard_bytes: int, shard_docs: int | None) -> Iterator[list[tuple[list[Record], int]]]:
    """Shards of the ``(record, input position)`` stream, each a list of pieces ``(records, position after them)``.

    A shard ends once it holds ``shard_bytes`` of text (or ``shard_docs`` records); a piece once it
    holds ``PIECE_BYTES``. Both count records before validation, so boundaries do not depend on
    what is bad, and a document is never split.
    """
    shard, piece, size, count, piece_size = [], [], 0, 0, 0
    for rec, pos in stream:
        n = _text_bytes(rec)
        piece.append(rec)
        size, count, piece_size = size + n, count + 1, piece_size + n
        end_shard = size >= shard_bytes or count == shard_docs
        if end_shard or piece_size >= PIECE_BYTES:
            shard.append((piece, pos))
            piece, piece_size = [], 0
        if end_shard:
            yield shard
            shard, size, count = [], 0, 0
    if piece:
        shard.append((piece, pos))
    if shard:
        yield shard


class _Progress:
    """tqdm bar over input bytes (or over tokens with a training budget) showing docs/s, tokens/s and ETA."""

    def __init__(self, sources: list[Source], total_tokens: int | None, enabled: bool):
        from neox_dar.progress import progress_bar

        self.by_tokens = total_tokens is not None
        total = total_tokens if self.by_tokens else (
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


def _jobs(shards, done: dict) -> Iterator[tuple[int, list[Record] | None, bool, int]]:
    """(shard id, piece's records or None for a journaled shard, last piece of its shard?, input position)."""
    for sid, pieces in enumerate(shards):
        if sid in done:
            yield sid, None, True, pieces[-1][1]
            continue
        for i, (records, pos) in enumerate(pieces):
            yield sid, records, i == len(pieces) - 1, pos


def run_shards(args, sources: list[Source], spec: TokenizerSpec, dtype: np.dtype, journal: Journal,
               budget: Budget, progress: _Progress) -> tuple[list[tuple[int, list[Segment]]], list[list], float]:
    """Tokenize every shard not yet journaled, in order, until the input runs out or ``budget`` is full.

    Pieces are tokenized in order by the workers (at most 2 per worker in flight); a shard is written
    and journaled when its last piece is back. Returns (the merge plan: [(shard id, its segments)],
    bad records [[source, line, reason]], the largest peak RSS of a tokenizing process in MB).
    """
    kill_after = int(os.environ.get(KILL_AFTER_ENV, "0") or 0)
    work = (spec, args.text_key, dtype.str)
    pool = None
    if args.workers > 1:
        pool = cf.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"),
                                      initializer=init_worker, initargs=(True, os.getpid()))
    jobs = _jobs(cut_shards(iter_records(sources, args.text_key, args.txt_mode), args.shard_bytes,
                            args.shard_docs), journal.done)
    window: collections.deque = collections.deque()
    plan, bad, parts, written, peak_rss = [], [], [], 0, 0.0
    try:
        while not budget.full:
            while len(window) < (2 * args.workers if pool is not None else 1):
                job = next(jobs, None)
                if job is None:
                    break
                sid, records, last, pos = job
                if records is not None:
                    records = pool.submit(encode_piece, records, *work) if pool else encode_piece(records, *work)
                window.append((sid, records, last, pos))
            if not window:
                break
            sid, result, last, pos = window.popleft()
            if result is None:  # journaled by an earlier run
                entry, sizes = journal.done[sid], journal.sizes(sid)
                if args.strict and entry["bad"]:  # an earlier run may not have been strict
                    raise DataPrepError(_strict(sources, entry["bad"][0]))
                progress.update(entry["docs"], entry["tokens"], pos)
            else:
                part = result.result() if isinstance(result, cf.Future) else result
                if args.strict and part["bad"]:
                    raise DataPrepError(_strict(sources, part["bad"][0]))
                peak_rss = max(peak_rss, part["peak_rss_mb"])
                progress.update(len(part["sizes"]), len(part["tokens"]), pos)
                parts.append(part)
                if not last:
                    continue
                entry, sizes = journal.write_shard(sid, parts, dtype)
                parts = []
                written += 1
                if kill_after and written >= kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)
            bad.extend(entry["bad"])
            plan.append((sid, budget.deal(sizes)))
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return plan, bad, peak_rss


def _where(sources: list[Source], src: int, line: int) -> str:
    return f"{sources[src].path}:{line}"


def _strict(sources: list[Source], bad: list) -> str:
    src, line, reason = bad
    return f"{_where(sources, src, line)}: {reason} (--strict)"


def _report_bad(sources: list[Source], bad: list[list]) -> dict:
    reasons = collections.Counter(reason.split(": ")[0] for _, _, reason in bad)
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


def _check_filled(args, budget: Budget, bad: list) -> None:
    """One-line errors for outputs the inputs could not fill; a warning for a short training file."""
    *valid, train = budget.filled
    if valid and valid[0] < args.valid_tokens:
        raise DataPrepError(f"the inputs hold only {valid[0]:,} tokens ({len(bad)} bad records skipped): too few "
                            f"for --valid-tokens {args.valid_tokens:,} and a training file")
    if train == 0:
        what = "after the --valid-tokens documents" if valid else "in the inputs"
        raise DataPrepError(f"no usable documents {what} ({len(bad)} bad records)")
    if args.max_tokens is not None and train < args.max_tokens:
        print(f"data_prep.tokenize: warning: the inputs ran out: the training file holds {train:,} tokens, "
              f"fewer than --max-tokens {args.max_tokens:,}", file=sys.stderr)


def run(argv: list[str] | None = None) -> dict:
    """Run the command line; returns the manifest."""
    args = build_parser().parse_args(argv)
    if args.workers < 1 or (args.shard_docs is not None and args.shard_docs < 1):
        raise DataPrepError("--workers and --shard-docs must be >= 1")
    t0 = time.time()
    sources = expand_inputs(args.inputs, args.seed)
    spec = load_tokenizer_spec(args.tokenizer, args.eod_id)
    dtype = best_dtype(spec.vocab_size)
    tok_sha = sha256_file(spec.path)
    plan = {"inputs": [dict(s.describe(), mtime_ns=s.mtime_ns) for s in sources], "tokenizer_sha256": tok_sha,
            "eod_id": spec.eod_id, "bos_id": spec.bos_id, "text_key": args.text_key, "txt_mode": args.txt_mode,
            "shard_bytes": args.shard_bytes, "shard_docs": args.shard_docs, "dtype": dtype.name, "seed": args.seed}
    make_out_dir(args.out)
    shard_dir = f"{args.out}.shards"
    journal = Journal(shard_dir, plan)
    empty = False
    try:
        if journal.discarded:
            print(f"data_prep.tokenize: {shard_dir} held {journal.discarded}; removed them, starting over",
                  file=sys.stderr)
        resumed = len(journal.done)
        prefixes = ([f"{args.out}_valid"] if args.valid_tokens else []) + [args.out]
        budget = Budget(([args.valid_tokens] if args.valid_tokens else []) + [args.max_tokens])
        total = None if args.max_tokens is None else args.max_tokens + (args.valid_tokens or 0)
        progress = _Progress(sources, total, enabled=not args.no_progress)
        try:
            shard_plan, bad, worker_rss = run_shards(args, sources, spec, dtype, journal, budget, progress)
        finally:
            progress.close()
        try:
            _check_filled(args, budget, bad)
        except DataPrepError as e:
            _report_bad(sources, bad)
            if not any(budget.filled):  # no usable document: the shards hold nothing worth keeping
                empty = True
                raise
            raise DataPrepError(f"{e} (the tokenized shards are kept in {shard_dir}/: the same inputs with other "
                                "budgets reuse them; remove it to start over)") from None
        staged = [shard_output(shard_dir, i) for i in range(len(prefixes))]
        if not args.no_progress:
            print(f"data_prep.tokenize: merging {len(shard_plan)} shard(s), then hashing the inputs for the manifest",
                  file=sys.stderr)
        merge_shards(shard_dir, shard_plan, staged, dtype)
        skipped = _report_bad(sources, bad)
        train = output_entry(staged[-1], args.out, budget, len(prefixes) - 1)
        manifest = {
            "format": "Megatron MMapIndexedDataset (GPT-NeoX), one sequence per document",
            **train, "dtype": dtype.name, "max_tokens": args.max_tokens,
            "valid": output_entry(staged[0], prefixes[0], budget, 0) if args.valid_tokens else None,
            "valid_tokens": args.valid_tokens,
            "budget_rule": "the --valid-tokens file takes the first documents, then the training file the next ones; "
                           "each takes whole documents while they fit, and the first that does not is cut to fill "
                           "its budget exactly (its tail is dropped)",
            "eod_id": spec.eod_id, "bos_id": spec.bos_id,
            "tokenizer": {"path": spec.path, "kind": spec.kind, "sha256": tok_sha, "vocab_size": spec.vocab_size},
            "inputs": [dict(s.describe(), order=i, sha256=sha) for i, (s, sha) in
                       enumerate(zip(sources, _input_hashes(sources, not args.no_progress)))],
            "seed": args.seed, "text_key": args.text_key, "txt_mode": args.txt_mode,
            "shard_bytes": args.shard_bytes, "shard_docs": args.shard_docs, "shards": len(shard_plan),
            "shards_resumed": resumed, "workers": args.workers,
            "peak_rss_mb": {"main": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                            "tokenizer_process": round(worker_rss, 1)},
            "skipped": skipped,
            "command": "python -m data_prep.tokenize " + shlex.join(sys.argv[1:] if argv is None else argv),
            "seconds": round(time.time() - t0, 3),
        }
        write_text_atomic(os.path.join(shard_dir, MANIFEST), json.dumps(manifest, indent=2) + "\n")
        removed = replace_outputs(staged, prefixes, os.path.join(shard_dir, MANIFEST), args.out)
        if removed:
            print(f"data_prep.tokenize: removed {' and '.join(removed)}: the held-out file of the output this "
                  "replaces (these inputs were tokenized without --valid-tokens)", file=sys.stderr)
        if not args.keep_shards:
            shutil.rmtree(shard_dir)
    finally:
        journal.close()
        if empty:
            shutil.rmtree(shard_dir, ignore_errors=True)
    return manifest


def _input_hashes(sources: list[Source], show: bool) -> list[str | None]:
    """sha256 of every input file (None for a Hugging Face dataset), with a bar over their bytes: the Pile's
    30 files take minutes."""
    hashes = []
    with progress_bar(total=sum(s.size or 0 for s in sources), unit="B", unit_scale=True, desc="hashing inputs",
                      disable=not show) as bar:
        for s in sources:
            hashes.append(sha256_file(s.path) if s.size is not None else None)
            bar.update(s.size or 0)
    return hashes


def main(argv: list[str] | None = None) -> int:
    try:
        m = run(argv)
    except (DataPrepError, ValueError, OSError, RuntimeError) as e:
        print(f"data_prep.tokenize: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("data_prep.tokenize: interrupted (Ctrl-C): the outputs are as they were; the finished shards are kept, "
              "so the same command continues from them", file=sys.stderr)
        return 130
    valid = f"; {m['valid']['prefix']}.bin/.idx: {m['valid']['tokens']:,} tokens" if m["valid"] else ""
    print(f"wrote {m['prefix']}.bin/.idx: {m['documents']:,} documents, {m['tokens']:,} tokens{valid} "
          f"({m['skipped']['total']} bad records skipped) in {m['seconds']:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
