"""The paper's Table 1 on a small trained model, on a CPU in minutes: every method at every d' below the head dim.

    python bench/dimpo_small.py --epochs 8 --lr-scale 10 --out bench/results/dimpo_table1_small.json
    python bench/dimpo_small.py --epochs 1 --lr-scale 1 --out bench/results/dimpo_table1_small_paper_hp.json

The model (also the fixture of tests/test_dimpo.py): a byte-level GPT-NeoX (2 layers, hidden 64, 4 heads of 16 dims,
vocabulary 256) trained for 200 Adam steps (``--train-steps``) of 16 x 128 bytes on the shipped C4 sample
(``data/sample``), all but its first 200 documents; those 200 documents, as bytes, are the DimPO documents (4 train,
2 validation, 2 test of their first 128 bytes by default). ``--epochs`` and ``--lr-scale`` pass to ``python -m neox_dar.dimpo fit``; with
512 training instances per layer against the paper's 40,960, ``--epochs 8 --lr-scale 10`` keeps Table 6's
learning rate x steps. The fit prints the table; ``--out`` gets it with the fit's ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neox_dar.provenance import device_name, provenance, write_result  # noqa: E402

C4 = ROOT / "data" / "sample" / "c4_sample.jsonl"
DIMPO_DOCS = 200  # the first C4 documents: DimPO's; the model trains on the others


def train_byte_model(out: Path, steps: int = 200, seq: int = 128, seed: int = 0) -> tuple[Path, str]:
    """Train the byte-level model; returns (checkpoint dir, tokenized DimPO documents prefix) under ``out``."""
    from neox_dar.saved_model import save_weights
    from neox_dar.config import load_config
    from neox_dar.data import IndexedDatasetWriter
    from neox_dar.model import build_model

    with open(C4) as f:
        docs = [np.frombuffer(json.loads(line)["text"].encode("utf-8"), dtype=np.uint8).astype(np.int64) for line in f]
    cfg = load_config(overrides=["num_layers=2", "hidden_size=64", "num_attention_heads=4", "vocab_size=256",
                                 "make_vocab_size_divisible_by=1", f"seq_length={seq}"]).model
    torch.manual_seed(seed)
    model = build_model(cfg)
    stream = np.concatenate(docs[DIMPO_DOCS:])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.95))
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        starts = rng.integers(0, len(stream) - seq - 1, 16)
        batch = torch.from_numpy(np.stack([stream[s:s + seq + 1] for s in starts]))
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_weights(model.eval(), cfg, out / "ckpt")
    writer = IndexedDatasetWriter(out / "bytes", np.uint16)
    for d in docs[:DIMPO_DOCS]:
        writer.add_document(d)
    writer.finalize()
    return out / "ckpt", str(out / "bytes")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The byte-level model's and the fit's options (shared with bench/dimpo_pairs.py)."""
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--lr-scale", type=float, default=10.0)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--docs", type=int, nargs=3, default=[4, 2, 2], metavar=("TRAIN", "VALID", "TEST"))
    p.add_argument("--train-steps", type=int, default=200, help="Adam steps of the byte-level model")
    p.add_argument("--threads", type=int, default=1, help="torch threads (tiny ops run fastest on one)")
    p.add_argument("--out")


def fit_options(args: argparse.Namespace) -> list[str]:
    """``python -m neox_dar.dimpo fit`` (or ``study``) options for the documents and the schedule."""
    return ["--seq-len", str(args.seq_len), "--train-docs", str(args.docs[0]), "--valid-docs", str(args.docs[1]),
            "--test-docs", str(args.docs[2]), "--epochs", str(args.epochs), "--lr-scale", str(args.lr_scale),
            "--device", "cpu"]


def train_timed(args: argparse.Namespace, work: Path) -> tuple[Path, str, float]:
    """:func:`train_byte_model` under ``work`` on ``args.threads`` threads: (checkpoint, documents, seconds)."""
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    ckpt, data = train_byte_model(work, steps=args.train_steps)
    return ckpt, data, time.perf_counter() - start


def main() -> None:
    from neox_dar.dimpo.__main__ import main as dimpo
    from neox_dar.dimpo.fit import load_results
    from neox_dar.dimpo.tables import table1
    from neox_dar.report.tables import to_markdown

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as work:
        ckpt, data, trained = train_timed(args, Path(work))
        fit = Path(work) / "fit"
        code = dimpo(["fit", str(ckpt), "--train", data, "--out", str(fit)] + fit_options(args))
        if code != 0:
            raise SystemExit(code)
        results = load_results(fit)
        markdown = to_markdown(table1(str(fit)))
        report = {**provenance(), "device": device_name(torch.device("cpu")), "threads": args.threads,
                  "train_steps": args.train_steps, "train_seconds": round(trained, 1),
                  "fit_seconds": round(sum(l["seconds"] for l in results["layers"].values()), 1),
                  "table_markdown": markdown, "results": results}
        text = json.dumps(report)  # the folder is gone after the run: the result names it, not this machine's path
        for path in {str(Path(work).resolve()), work}:
            text = text.replace(path, "<temporary folder>")
        report = json.loads(text)
    if args.out:
        write_result(report, args.out)


if __name__ == "__main__":
    main()
