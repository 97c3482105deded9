"""Throughput of ``python -m data_prep.tokenize`` against plain ``tokenizers`` batch encoding.

    TOKENIZERS_PARALLELISM=false python bench/data_prep.py --copies 4 --workers 1 2

The corpus is the embedded C4 sample repeated ``--copies`` times (a temporary JSONL). The
baseline is ``Tokenizer.encode_batch`` over the already-loaded texts in this process (no
reading, no JSON, no writing). The pipeline is the whole command (reading, JSON parsing and
validation, tokenization, shard files, journal, merge, manifest with input/output sha256), run
in-process through :func:`data_prep.tokenize.run`. Each measurement is the best of ``--repeats``.
With ``TOKENIZERS_PARALLELISM=false`` every process tokenizes on one thread, so the ratios are
per core; without it the baseline and ``--workers 1`` let the tokenizer use all cores.
Prints one JSON object (also written to ``--out`` when given).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_prep.tokenize import run  # noqa: E402


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=str(ROOT / "data/sample/c4_sample.jsonl"))
    p.add_argument("--tokenizer", default=str(ROOT / "data/20B_tokenizer.json"))
    p.add_argument("--copies", type=int, default=4, help="repeat the corpus this many times")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--shard-docs", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="also write the JSON result here")
    args = p.parse_args()

    from tokenizers import Tokenizer

    lines = Path(args.corpus).read_text().splitlines() * args.copies
    texts = [json.loads(line)["text"] for line in lines]
    tok = Tokenizer.from_file(args.tokenizer)
    tokens = sum(len(e.ids) + 1 for e in tok.encode_batch(texts))  # +1: the EOD the pipeline appends
    base_s = best_of(args.repeats, lambda: tok.encode_batch(texts))
    result = {
        "corpus": f"{Path(args.corpus).name} x{args.copies}", "documents": len(texts), "tokens": tokens,
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "default"),
        "cpu_count": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2), "python": platform.python_version(),
        "baseline_encode_batch": {"seconds": round(base_s, 3), "tokens_per_s": round(tokens / base_s)},
        "pipeline": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.jsonl")
        Path(corpus).write_text("\n".join(lines) + "\n")
        for w in args.workers:
            argv = [corpus, "--tokenizer", args.tokenizer, "--out", os.path.join(tmp, f"w{w}"), "--workers", str(w),
                    "--shard-docs", str(args.shard_docs), "--no-progress"]
            manifest = {}

            def once():
                manifest.update(run(argv))

            s = best_of(args.repeats, once)
            assert manifest["tokens"] == tokens, (manifest["tokens"], tokens)
            result["pipeline"][f"workers_{w}"] = {
                "seconds": round(s, 3), "tokens_per_s": round(tokens / s),
                "throughput_vs_baseline": round(base_s / s, 3), "overhead_vs_baseline": round(s / base_s - 1, 3)}
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
