"""The paper's key-pair study (Appendix C, Fig. 4) on bench/dimpo_small.py's byte-level model, on a CPU.

    python bench/dimpo_pairs.py --out bench/results/dimpo_fig4_small.json      # and dimpo_fig4_small.png beside it

Trains the byte-level model of ``dimpo_small.py`` (2 layers, 4 heads of 16 dims), then runs
``python -m neox_dar.dimpo study`` on its DimPO documents (4 train, 2 validation, 2 test of 128 bytes by default)
at every ``d'`` below the head dim (8, 4, 2, 1), each panel at the paper's ``k`` (``--ks`` replaces them), with
``--epochs`` and ``--lr-scale`` as in ``dimpo_small.py`` (Table 6's learning rate x steps). The result holds the
study's averages (test KL and MSE per panel, method and k, over the layers and d') and the figure is written beside
it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dimpo_small import add_arguments, fit_options, train_timed  # noqa: E402

from neox_dar.provenance import device_name, provenance, write_result  # noqa: E402


def main() -> None:
    from neox_dar.dimpo.__main__ import main as dimpo

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.add_argument("--panels", default="all,distinct,distance")
    p.add_argument("--ks", help="the k of every panel (default: the paper's)")
    p.add_argument("--dims", help="d' values (default: every one below the head dim)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as work:
        ckpt, data, trained = train_timed(args, Path(work))
        out = Path(work) / "study"
        extra = (["--ks", args.ks] if args.ks else []) + (["--dims", args.dims] if args.dims else [])
        start = time.perf_counter()
        code = dimpo(["study", str(ckpt), "--train", data, "--out", str(out), "--panels", args.panels]
                     + fit_options(args) + extra)
        if code != 0:
            raise SystemExit(code)
        study = json.loads((out / "study.json").read_text())
        import torch

        report = {**provenance(), "device": device_name(torch.device("cpu")), "threads": args.threads, "train_steps": args.train_steps,
                  "train_seconds": round(trained, 1), "study_seconds": round(time.perf_counter() - start, 1),
                  "seq_len": args.seq_len, "docs": args.docs, "epochs": args.epochs, "lr_scale": args.lr_scale,
                  "study": study}
        if args.out:
            write_result(report, args.out)
            shutil.copy(out / "fig4.png", Path(args.out).with_suffix(".png"))


if __name__ == "__main__":
    main()
