"""Peak memory of a DimPO fit (``python -m neox_dar.dimpo fit``) against the number of documents and of layers.

    python bench/dimpo_memory.py --docs 1 4 16 --layers 2 4 8 --seq-len 2048 --max-steps 10 \
        --out bench/results/dimpo_memory_cpu.json

Every setting runs in a fresh process: a randomly initialised GPT-NeoX (hidden 256, 4 heads of 64 dims, vocabulary
1024; the weights do not change the memory) fits random, PCA, SimPO and DimPO (``--max-steps`` steps, so DimPO's
loss runs over lists of up to ``T`` keys) at d' = 16 on random-token documents of ``T`` tokens, ``n`` documents per
split. Reported per setting: the process's peak resident memory (``ru_maxrss``), the peak before the fit (Python,
torch and the modules a model build imports, the model loaded once) and their difference ``fit_mb``, which holds
the fit's own copy of the model (``model_mb``) and the fit's data
(``fit_minus_model_mb``), the fit's wall time, and what the code before
streaming (every instance's keys and values copied per query, ``N x T x d_h`` floats each) would have allocated for
the training and the test copies. The fit's memory should grow linearly with the documents (one layer's keys and
values per document) and stay flat in the layers (one layer held at a time).
Prints one JSON object (also written to ``--out`` when given).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neox_dar.provenance import machine_cpu, provenance, write_result  # noqa: E402

HIDDEN, HEADS, VOCAB, D_PROJ = 256, 4, 1024, 16
# glibc raises its mmap threshold each time a large mmapped block is freed, after which large blocks come from the
# heap and linger there once freed: the peak RSS would measure the allocator's history. A fixed threshold returns
# every block over 1 MiB to the OS when it is freed, so the peak follows the memory actually in use.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def child(docs: int, layers: int, seq_len: int, max_steps: int, work: str) -> None:
    """In a fresh process: build the model and data, fit, print JSON."""
    import numpy as np
    import torch

    from neox_dar.saved_model import save_weights
    from neox_dar.config import load_config
    from neox_dar.data import IndexedDatasetWriter
    from neox_dar.dimpo.__main__ import main
    from neox_dar.model import build_model

    cfg = load_config(overrides=[f"num_layers={layers}", f"hidden_size={HIDDEN}", f"num_attention_heads={HEADS}",
                                 f"vocab_size={VOCAB}", "make_vocab_size_divisible_by=1",
                                 f"max_position_embeddings={seq_len}", f"seq_length={seq_len}"]).model
    torch.manual_seed(0)
    save_weights(build_model(cfg), cfg, Path(work) / "ckpt")
    writer = IndexedDatasetWriter(Path(work) / "docs", np.uint16)
    for tokens in np.random.default_rng(0).integers(0, VOCAB, (3 * docs, seq_len)):
        writer.add_document(tokens)
    writer.finalize()
    from neox_dar.evaluation.loading import load_for_eval

    load_for_eval(Path(work) / "ckpt")  # the imports that building a model pulls in (~140 MB), before the baseline
    model_mb = sum(p.numel() * p.element_size() for p in build_model(cfg).parameters()) / 2**20
    before = peak_mb()
    start = time.perf_counter()
    code = main(["fit", str(Path(work) / "ckpt"), "--train", str(Path(work) / "docs"), "--out",
                 str(Path(work) / "fit"), "--seq-len", str(seq_len), "--train-docs", str(docs), "--valid-docs",
                 str(docs), "--test-docs", str(docs), "--methods", "random,pca,simpo,dimpo", "--dims", str(D_PROJ),
                 "--max-steps", str(max_steps), "--device", "cpu"])
    assert code == 0
    print(json.dumps({"peak_before_fit_mb": before, "peak_mb": peak_mb(), "model_mb": model_mb,
                      "fit_seconds": time.perf_counter() - start}))


def old_copies_gb(docs: int, seq_len: int) -> dict[str, float]:
    """Bytes the per-query copies of the old ``query_lists`` took: keys and values (float32) of every instance."""
    d_h = HIDDEN // HEADS
    per_instance = seq_len * d_h * 4 * 2
    return {"train_copy_gb": docs * seq_len * per_instance / 1e9,               # every H-th query of each head
            "test_copy_gb": docs * HEADS * seq_len * per_instance / 1e9}        # every query of every head


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, nargs="+", default=[1, 4, 16], help="documents per split")
    p.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--max-steps", type=int, default=10, help="steps of each trained method per layer")
    p.add_argument("--out")
    p.add_argument("--child", nargs=4, type=int, help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child, args.work)
        return
    settings = [(n, args.layers[0]) for n in args.docs] + [(args.docs[0], l) for l in args.layers[1:]]
    runs = []
    for docs, layers in settings:
        with tempfile.TemporaryDirectory() as work:
            r = subprocess.run([sys.executable, __file__, "--child", str(docs), str(layers), str(args.seq_len),
                                str(args.max_steps), "--work", work], capture_output=True, text=True,
                               env={**os.environ, **MALLOC_ENV}, check=False)
        if r.returncode != 0:
            raise SystemExit(f"setting docs={docs} layers={layers} failed:\n{r.stderr[-3000:]}")
        m = json.loads(r.stdout.strip().splitlines()[-1])
        m["fit_mb"] = m["peak_mb"] - m["peak_before_fit_mb"]
        m["fit_minus_model_mb"] = m["fit_mb"] - m["model_mb"]
        runs.append({"docs_per_split": docs, "layers": layers, **{k: round(v, 1) for k, v in m.items()},
                     **{k: round(v, 2) for k, v in old_copies_gb(docs, args.seq_len).items()}})
        print(json.dumps(runs[-1]), file=sys.stderr)
    report = {**provenance(), "device": machine_cpu(), "python": platform.python_version(), "malloc_env": MALLOC_ENV,
              "seq_len": args.seq_len,
              "model": {"hidden_size": HIDDEN, "heads": HEADS, "head_dim": HIDDEN // HEADS, "vocab": VOCAB},
              "methods": "random,pca,simpo,dimpo", "d_proj": D_PROJ, "max_steps": args.max_steps, "runs": runs}
    print(json.dumps(report, indent=1))
    if args.out:
        write_result(report, args.out)


if __name__ == "__main__":
    main()
