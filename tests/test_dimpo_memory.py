"""DimPO's memory stays bounded where the per-query copies of the code before streaming could not fit: one
3072-token document per split of a model with two 128-dim heads, fitted with DimPO (lists of up to 3072 keys)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from builders import config
from neox_dar.saved_model import save_weights
from neox_dar.data import IndexedDatasetWriter
from neox_dar.model import build_model

T, HEADS, HEAD_DIM = 3072, 2, 128
CHILD = """
import json, resource, sys
from neox_dar.dimpo.__main__ import main
from neox_dar.evaluation.loading import load_for_eval
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
load_for_eval(sys.argv[1])  # the model and the modules its build imports: the baseline
before = peak()
code = main(["fit", sys.argv[1], "--train", sys.argv[2], "--out", sys.argv[3], "--seq-len", "3072", "--train-docs", "1",
             "--valid-docs", "1", "--test-docs", "1", "--methods", "dimpo", "--dims", "16", "--max-steps", "2",
             "--query-block", "512", "--device", "cpu"])
print(json.dumps({"code": code, "fit_mb": peak() - before}))
"""


def test_fit_memory_is_bounded_where_per_query_copies_were_not(tmp_path):
    cfg = config(num_layers=1, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, vocab_size=512,
                 make_vocab_size_divisible_by=1, max_position_embeddings=T, seq_length=T).model
    save_weights(build_model(cfg), cfg, tmp_path / "ckpt")
    writer = IndexedDatasetWriter(tmp_path / "docs", np.uint16)
    for tokens in np.random.default_rng(0).integers(0, 512, (3, T)):
        writer.add_document(tokens)
    writer.finalize()
    # a fixed mmap threshold: freed blocks over 1 MiB go back to the OS, so the peak follows the memory in use
    r = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "ckpt"), str(tmp_path / "docs"),
                        str(tmp_path / "fit")], capture_output=True, text=True, check=False,
                       env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)})
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["code"] == 0
    # before: keys and values (float32) copied per instance, T x d_h each: every H-th query of each head for
    # training (T instances), every query for the test (H x T instances)
    per_instance = T * HEAD_DIM * 4 * 2
    old_gb = (T + HEADS * T) * per_instance / 1e9
    assert old_gb > 25  # more than this machine's 23 GB
    # one document's q, k, v per split, blocks of 512 queries x 3072 keys, DimPO's pair blocks, the fit's model
    assert got["fit_mb"] < 200, got  # measured: 78 MB
    assert json.loads((tmp_path / "fit" / "results.json").read_text())["complete"]
