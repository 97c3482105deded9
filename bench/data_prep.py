"""Throughput of ``python -m data_prep.tokenize`` against plain ``tokenizers`` batch encoding.

    TOKENIZERS_PARALLELISM=false python bench/data_prep.py --copies 4 --workers 1 2

The corpus is the embedded C4 sample repeated ``--copies`` times (a temporary JSONL). The
baseline is ``Tokenizer.encode_batch`` over the already-loaded texts in this process (no
reading, no JSON, no writing). The pipeline is the whole command (reading, JSON parsing and
validation, tokenization, shard files, journal, merge, manifest with input/output sha256), run
in-process through :func:`data_prep.tokenize.run`. Each setting is the best of ``--repeats`` runs,
and the runs of all settings are interleaved.
With ``TOKENIZERS_PARALLELISM=false`` every process tokenizes on one thread, so the ratios are
per core; without it the baseline and ``--workers 1`` let the tokenizer use all cores. Both wall
time and CPU time (this process, its threads and its worker processes) are reported: on a shared,
loaded machine the CPU-time ratio is the reliable measure of the pipeline's overhead, and the
wall-time ratio shows scaling only where the workers have free cores.
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
from neox_dar.provenance import provenance, write_result  # noqa: E402


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, its threads and its reaped worker processes)."""
    t, c = time.perf_counter(), _cpu()
    fn()
    return time.perf_counter() - t, _cpu() - c


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
        build, _ = timed(lambda: GPTDataset("train", indexed, np.arange(num_docs), samples, seq_length, 1234))
        reopen, _ = timed(lambda: GPTDataset("train", indexed, np.arange(num_docs), samples, seq_length, 1234))
    return {"documents": num_docs, "tokens": indexed.num_tokens, "samples": samples, "seq_length": seq_length,
            "build_seconds": round(build, 2), "reopen_seconds": round(reopen, 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=str(ROOT / "data/sample/c4_sample.jsonl"))
    p.add_argument("--tokenizer", default=str(ROOT / "data/20B_tokenizer.json"))
    p.add_argument("--copies", type=int, default=4, help="repeat the corpus this many times")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--shard-docs", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="also write the JSON result here")
    p.add_argument("--index-docs", type=int, default=0,
                   help="instead: time GPTDataset index maps for this many synthetic documents (7000000 ~ 10B tokens)")
    args = p.parse_args()
    if args.index_docs:
        print(json.dumps(bench_index_maps(args.index_docs), indent=2))
        return 0

    from tokenizers import Tokenizer

    lines = Path(args.corpus).read_text().splitlines() * args.copies
    texts = [json.loads(line)["text"] for line in lines]
    tok = Tokenizer.from_file(args.tokenizer)
    tokens = sum(len(e.ids) + 1 for e in tok.encode_batch(texts))  # +1: the EOD the pipeline appends
    times: dict[str, list[tuple[float, float]]] = {"baseline": [], **{f"workers_{w}": [] for w in args.workers}}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.jsonl")
        Path(corpus).write_text("\n".join(lines) + "\n")
        for _ in range(args.repeats):  # interleaved, so load changes on a shared machine hit every setting alike
            times["baseline"].append(timed(lambda: tok.encode_batch(texts)))
            for w in args.workers:
                argv = [corpus, "--tokenizer", args.tokenizer, "--out", os.path.join(tmp, f"w{w}"), "--workers",
                        str(w), "--shard-docs", str(args.shard_docs), "--no-progress"]
                manifest = {}
                times[f"workers_{w}"].append(timed(lambda: manifest.update(run(argv))))
                assert manifest["tokens"] == tokens, (manifest["tokens"], tokens)

    def summary(name: str) -> dict:
        wall = min(w for w, _ in times[name])
        cpu = min(c for _, c in times[name])
        return {"seconds": round(wall, 3), "tokens_per_s": round(tokens / wall), "cpu_seconds": round(cpu, 3),
                "tokens_per_cpu_s": round(tokens / cpu)}

    base = summary("baseline")
    result = {
        **provenance(["bench/data_prep.py", *sys.argv[1:]]),
        "corpus": f"{Path(args.corpus).name} x{args.copies}", "documents": len(texts), "tokens": tokens,
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "default"),
        "cpu_count": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2), "python": platform.python_version(),
        "repeats": args.repeats, "baseline_encode_batch": base, "pipeline": {},
    }
    for w in args.workers:
        row = summary(f"workers_{w}")
        row["wall_throughput_vs_baseline"] = round(base["seconds"] / row["seconds"], 3)
        row["cpu_overhead_vs_baseline"] = round(row["cpu_seconds"] / base["cpu_seconds"] - 1, 3)
        result["pipeline"][f"workers_{w}"] = row
    print(json.dumps(result, indent=2))
    if args.out:
        write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
