"""The papers' document-length figure: CDF of tokens per document for each evaluation corpus.

    python -m eval.doc_lengths [--corpora fineweb_edu,c4,wikitext103] [--window 128] [--seq-length 2048]
        [--max-docs N] [--tokenizer data/20B_tokenizer.json] --out doc_lengths.png

Vertical lines mark the attention window ``w`` and the training ``seq_length``: the share of a corpus's
documents left of ``w`` never needs a token beyond the window. Prints, per corpus, the fraction of documents at
most ``w`` and at most ``seq_length`` tokens long (``--json`` writes them with the lengths' quantiles).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from neox_dar.evaluation.corpora import CORPORA, CorpusError, load_hub, load_local, select_documents
from neox_dar.evaluation.tables import TITLES
from neox_dar.report.plots import check_figure_path
from neox_dar.rundir import check_writable, write_text_atomic
from neox_dar.tokenizer import encode_texts, load_tokenizer


def document_lengths(texts: list[str], tokenizer) -> np.ndarray:
    """Tokens per document (no prefix token), int64 array of len(texts)."""
    return np.array([ids.size for ids in encode_texts(tokenizer, texts)], dtype=np.int64)


def length_summary(lengths: np.ndarray, window: int, seq_length: int) -> dict:
    """Fractions of documents with at most ``window`` / ``seq_length`` tokens, and length quantiles."""
    return {
        "documents": int(lengths.size),
        "frac_le_window": float((lengths <= window).mean()),
        "frac_le_seq_length": float((lengths <= seq_length).mean()),
        "quantiles": {f"p{q}": float(np.percentile(lengths, q)) for q in (10, 25, 50, 75, 90, 99)},
        "mean": float(lengths.mean()),
    }


def plot_cdf(lengths: dict[str, np.ndarray], window: int, seq_length: int, out: str | Path) -> Path:
    """Write the CDF figure (log-x, one step curve per corpus, dashed lines at ``window`` and ``seq_length``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 3.6), dpi=150)
    for name, values in lengths.items():
        xs = np.sort(np.maximum(values, 1))
        ax.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", label=f"{TITLES[name]} ({xs.size} docs)")
    for x, label, style in ((window, f"w = {window}", "--"), (seq_length, f"seq_length = {seq_length}", ":")):
        ax.axvline(x, color="black", linestyle=style, linewidth=1.0)
        ax.text(x, 0.02, " " + label, rotation=90, va="bottom", ha="right", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("tokens per document (Pythia tokenizer)")
    ax.set_ylabel("fraction of documents")
    ax.set_ylim(0, 1.0)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.doc_lengths", description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", default=",".join(CORPORA))
    ap.add_argument("--window", type=int, default=128, help="attention window w (vertical line)")
    ap.add_argument("--seq-length", type=int, default=2048, help="training sequence length (vertical line)")
    ap.add_argument("--max-docs", type=int, default=None)
    ap.add_argument("--source", default="local", choices=["local", "hub"])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: data/20B_tokenizer.json)")
    ap.add_argument("--json", default=None, help="also write the per-corpus summary here")
    ap.add_argument("--out", required=True, help="PNG path")
    args = ap.parse_args(argv)
    try:
        names = [c.strip() for c in args.corpora.split(",") if c.strip()]
        if not names or any(c not in CORPORA for c in names):
            raise ValueError(f"--corpora must name some of {', '.join(CORPORA)}, got '{args.corpora}'")
        for name, least in (("window", 1), ("seq_length", 1)):
            if getattr(args, name) < least:
                raise ValueError(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
        check_figure_path(args.out)
        if args.json:
            check_writable(args.json, "--json")
        tokenizer = load_tokenizer(path=args.tokenizer)
        lengths = {}
        for name in names:
            docs = load_hub(name, args.max_docs) if args.source == "hub" else load_local(name, data_dir=args.data_dir)
            lengths[name] = document_lengths([d.text for d in select_documents(docs, args.max_docs)], tokenizer)
    except (FileNotFoundError, CorpusError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = {name: length_summary(v, args.window, args.seq_length) for name, v in lengths.items()}
    for name, s in summary.items():
        print(f"{name}: {s['documents']} docs, median {s['quantiles']['p50']:.0f} tokens, "
              f"{100 * s['frac_le_window']:.1f}% <= w={args.window}, "
              f"{100 * s['frac_le_seq_length']:.1f}% <= seq_length={args.seq_length}")
    plot_cdf(lengths, args.window, args.seq_length, args.out)
    if args.json:
        write_text_atomic(args.json, json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
