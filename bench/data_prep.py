"""Throughput and memory of ``python -m data_prep.tokenize`` against plain ``tokenizers`` ``encode_batch_fast``.

    python bench/data_prep.py --workers 1 2 --repeats 3 --out bench/results/data_prep_wiki_part00.json

The corpus (default: the 102 MB Wikipedia part ``../shared/data/wikipedia/enwiki2015.train.part00.jsonl.zst``)
is read once per setting. The baseline is one ``Tokenizer.encode_batch_fast`` call over all of its
texts, already decoded and in memory, with the library's own threads on every core (only that call
is timed: no reading, no JSON, no writing). The pipeline is the whole command (reading and
decompressing, JSON parsing and validation, tokenization, shard files, journal, merge, manifest with
input and output sha256), each run a fresh process. Every setting runs in its own process, and the
runs of all settings are interleaved, so load changes on a shared machine hit every setting alike.
Reported per setting: the best wall time and its tokens/s, the CPU time (the process and all its
threads and worker processes), peak resident memory (the main process and the largest tokenizer
process), every run's wall time, and the ratio of the pipeline's rate to the baseline's, both from
the best runs and as the median of the ratios of runs taken side by side.
Prints one JSON object (also written to ``--out`` when given).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neox_dar.provenance import machine_cpu, provenance, write_result  # noqa: E402

WIKI = ROOT.parent / "shared/data/wikipedia/enwiki2015.train.part00.jsonl.zst"


def _cpu_children() -> float:
    t = os.times()
    return t.children_user + t.children_system


def baseline_child(corpus: str, tokenizer: str) -> None:
    """In a fresh process: decode the corpus, time one ``encode_batch_fast`` over all texts; print JSON."""
    from tokenizers import Tokenizer

    from data_prep.encode import BadRecord, decode_record
    from data_prep.sources import expand_inputs, iter_records

    texts = []
    for (_, _, kind, payload), _ in iter_records(expand_inputs([corpus], 0), "text", "file"):
        try:
            texts.append(decode_record(kind, payload, "text"))
        except BadRecord:
            pass
    tok = Tokenizer.from_file(tokenizer)
    t, c = time.perf_counter(), time.process_time()
    encodings = tok.encode_batch_fast(texts)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    print(json.dumps({"seconds": wall, "cpu_seconds": cpu, "documents": len(texts),
                      "tokens": sum(len(e) + 1 for e in encodings),  # +1: the EOD the pipeline appends
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_baseline(args) -> dict:
    c = _cpu_children()
    out = subprocess.run([sys.executable, __file__, "--baseline-child", "--corpus", args.corpus, "--tokenizer",
                          args.tokenizer], check=True, capture_output=True, text=True).stdout
    r = json.loads(out.splitlines()[-1])
    r["process_cpu_seconds"] = _cpu_children() - c  # includes reading the corpus
    return r


def run_pipeline(args, workers: int, tmp: str) -> dict:
    prefix = os.path.join(tmp, f"w{workers}")
    cmd = [sys.executable, "-m", "data_prep.tokenize", args.corpus, "--tokenizer", args.tokenizer, "--out", prefix,
           "--workers", str(workers), "--shard-bytes", args.shard_bytes, "--no-progress"]
    t, c = time.perf_counter(), _cpu_children()
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    wall, cpu = time.perf_counter() - t, _cpu_children() - c
    m = json.loads(Path(prefix + ".manifest.json").read_text())
    return {"seconds": wall, "cpu_seconds": cpu, "tokens": m["tokens"], "documents": m["documents"],
            "shards": m["shards"], "peak_rss_mb": m["peak_rss_mb"], "bin_sha256": m["bin_sha256"]}


def bench_index_maps(num_docs: int, seq_length: int = 2048) -> dict:
    """Build and reopen GPTDataset index maps for ``num_docs`` random-length documents (~1,425 tokens each,
    about 10B tokens for 7M documents); the .bin is a sparse file, so no disk space or tokenization is needed."""
    import numpy as np

    from neox_dar.data import GPTDataset, IndexedDataset, write_index

    sizes = np.random.default_rng(0).integers(50, 2800, num_docs)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "synthetic")
        write_index(prefix + ".idx", np.uint16, sizes, np.arange(num_docs + 1))
        with open(prefix + ".bin", "wb") as f:
            f.truncate(int(sizes.sum()) * 2)
        indexed = IndexedDataset(prefix)
        samples = indexed.num_tokens // seq_length
        times = []
        for _ in range(2):  # build, then reopen from the cache
            t = time.perf_counter()
            GPTDataset("train", indexed, np.arange(num_docs), samples, seq_length, 1234)
            times.append(time.perf_counter() - t)
    return {"documents": num_docs, "tokens": indexed.num_tokens, "samples": samples, "seq_length": seq_length,
            "build_seconds": round(times[0], 2), "reopen_seconds": round(times[1], 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=str(WIKI), help="a JSONL file (.jsonl, .jsonl.gz, .jsonl.zst) with 'text'")
    p.add_argument("--tokenizer", default=str(ROOT / "data/20B_tokenizer.json"))
    p.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count()])
    p.add_argument("--shard-bytes", default="16M", help="the pipeline's --shard-bytes (default 16M)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="also write the JSON result here")
    p.add_argument("--index-docs", type=int, default=0,
                   help="instead: time GPTDataset index maps for this many synthetic documents (7000000 ~ 10B tokens)")
    p.add_argument("--baseline-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.baseline_child:
        baseline_child(args.corpus, args.tokenizer)
        return 0
    if args.index_docs:
        print(json.dumps(bench_index_maps(args.index_docs), indent=2))
        return 0

    runs: dict[str, list[dict]] = {"baseline": [], **{f"workers_{w}": [] for w in args.workers}}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):  # interleaved
            loads.append(os.getloadavg()[0])
            runs["baseline"].append(run_baseline(args))
            for w in args.workers:
                runs[f"workers_{w}"].append(run_pipeline(args, w, tmp))
    tokens = runs["baseline"][0]["tokens"]
    hashes = {r["bin_sha256"] for w in args.workers for r in runs[f"workers_{w}"]}
    assert all(r["tokens"] == tokens for rs in runs.values() for r in rs) and len(hashes) == 1, "outputs differ"

    def summary(name: str) -> dict:
        rs = runs[name]
        best = min(rs, key=lambda r: r["seconds"])
        row = {"seconds": round(best["seconds"], 2), "tokens_per_s": round(tokens / best["seconds"]),
               "cpu_seconds": round(best["cpu_seconds"], 2), "tokens_per_cpu_s": round(tokens / best["cpu_seconds"]),
               "peak_rss_mb": best["peak_rss_mb"], "all_seconds": [round(r["seconds"], 2) for r in rs],
               "all_cpu_seconds": [round(r["cpu_seconds"], 2) for r in rs]}
        if name != "baseline":
            row["shards"] = best["shards"]
            row["rate_vs_baseline_best"] = round(runs["baseline_best"] / best["seconds"], 3)
            row["rate_vs_baseline_median_pairwise"] = round(statistics.median(
                b["seconds"] / r["seconds"] for b, r in zip(runs["baseline"], rs)), 3)
        return row

    runs["baseline_best"] = min(r["seconds"] for r in runs["baseline"])
    result = {
        **provenance(["bench/data_prep.py", *sys.argv[1:]]),
        "corpus": args.corpus, "corpus_bytes": os.path.getsize(args.corpus),
        "documents": runs["baseline"][0]["documents"], "tokens": tokens, "shard_bytes": args.shard_bytes,
        "device": machine_cpu(), "load_avg_1m_at_each_repeat": [round(x, 2) for x in loads],
        "python": platform.python_version(), "repeats": args.repeats,
        "baseline_encode_batch_fast": summary("baseline"),
        "pipeline": {f"workers_{w}": summary(f"workers_{w}") for w in args.workers},
    }
    print(json.dumps(result, indent=2))
    if args.out:
        write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
