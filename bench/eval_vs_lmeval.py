"""Rolling-window perplexity throughput of ``python -m eval.perplexity``'s scoring against lm-evaluation-harness's own
``hf`` model running ``loglikelihood_rolling`` on the exported copy of the same checkpoint, side by side in one run.

    python bench/eval_vs_lmeval.py [--layers 6] [--hidden 128] [--heads 4] [--max-length 2048] [--docs 6]
        [--batch-size 4] [--repeats 3] [--threads 1] [--quick] [--out bench/results/eval_vs_lmeval_cpu.json]

The model: ``configs/tiny.yml`` at the given size (default the Pythia-14M shape: 6 layers, d 128, 4 heads, a
2048-token window), random weights (seed 0), saved as a neox-dar checkpoint with ``neox_dar.saved_model.save_weights``
beside the Pythia tokenizer, then exported with ``python -m neox_dar.convert to-hf`` (called in this process).

Ours: the checkpoint loaded as ``eval.perplexity`` loads it (``load_for_eval``) and scored with
``neox_dar.evaluation.perplexity.score_corpus`` (``--batch-size`` windows per forward, default 4 here: lm-eval's full
float32 log-softmax of a batch of 2048-token windows is 0.4 GB per window; longest windows first, the NLL straight from the hidden states of the scored positions). lm-eval: ``HFLM(pretrained=<export>)``
(exactly ``--model hf --model_args pretrained=<export>``: ``GPTNeoXForCausalLM`` and the exported tokenizer) with the
same ``max_length`` and ``batch_size``, ``loglikelihood_rolling`` over the same texts (the first ``--docs`` WikiText
articles of ``data/eval``, detokenized as lm-eval's ``wikitext`` task does). The windows are the same (lm-eval's
rule, ``tests/test_eval_rolling.py``); the per-document log-likelihoods of the two are compared here too.

Both run in this process with the same ``torch.set_num_threads``, interleaved (ours, lm-eval, ours, lm-eval, ...) after
one untimed warm-up each, so both see the same machine load. Each run's wall time and process CPU time are recorded;
tokens/s is the scored tokens over the median CPU time (robust to other processes on a shared machine with one
thread; ``tokens_per_wall_s`` beside it), and the ratio (ours / lm-eval) is the median of the per-pair CPU-time
ratios (``ratio_wall`` the same on wall time). On a shared machine the ratio, not the absolute tokens/s, is what to
read; the load average before and after is recorded.
``--quick`` (the smoke test): 1 layer, d 64, 64-token windows, 1 document cut to 100 words, no warm-up, 1 repeat.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # lm-eval's per-batch bars (its _loglikelihood_tokens forces them on)

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neox_dar.saved_model import save_weights  # noqa: E402
from neox_dar.config import load_config  # noqa: E402
from neox_dar.evaluation.corpora import Document, load_local  # noqa: E402
from neox_dar.evaluation.loading import load_for_eval  # noqa: E402
from neox_dar.evaluation.perplexity import score_corpus  # noqa: E402
from neox_dar.model import build_model  # noqa: E402
from neox_dar.provenance import device_name, provenance, write_result  # noqa: E402
from neox_dar.timing import interleaved  # noqa: E402
from neox_dar.tokenizer import DEFAULT_TOKENIZER, load_tokenizer, prefix_token_id  # noqa: E402


def make_checkpoint(args, root: Path) -> tuple[Path, Path, dict]:
    """A random ``configs/tiny.yml``-family model at the requested size: our checkpoint and its HF export."""
    import shutil

    from neox_dar import convert

    overrides = [f"num_layers={args.layers}", f"hidden_size={args.hidden}", f"num_attention_heads={args.heads}",
                 f"seq_length={args.max_length}", f"max_position_embeddings={max(2048, args.max_length)}",
                 "attention_type=vanilla"]
    cfg = load_config(ROOT / "configs" / "tiny.yml", overrides=overrides).model
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    ckpt = root / "ckpt"
    ckpt.mkdir()
    shutil.copyfile(DEFAULT_TOKENIZER, ckpt / "tokenizer.json")  # first: the manifest lists it
    save_weights(model, cfg, ckpt)
    hf = root / "hf"
    if convert.main(["to-hf", str(ckpt), str(hf)]) != 0:
        raise SystemExit("export failed")
    shape = {"config": ["configs/tiny.yml", *overrides], "num_layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
             "num_attention_heads": cfg.num_attention_heads, "seq_length": cfg.seq_length,
             "parameters": sum(p.numel() for p in model.parameters())}
    return ckpt, hf, shape


def documents(args) -> list[Document]:
    docs = load_local("wikitext103")[:args.docs]
    if args.quick:  # one short document: several 64-token windows, seconds on a CPU
        docs = [Document(id=d.id, text=" ".join(d.text.split()[:100]), count_text=d.count_text) for d in docs]
    return docs


def run(args) -> dict:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, hf_dir, shape = make_checkpoint(args, Path(tmp))
        docs = documents(args)

        loaded = load_for_eval(ckpt)  # as python -m eval.perplexity CKPT does
        tokenizer = load_tokenizer(loaded.cfg, model_dir=loaded.model_dir)
        prefix = prefix_token_id(DEFAULT_TOKENIZER)
        lm = HFLM(pretrained=str(hf_dir), max_length=args.max_length, batch_size=args.batch_size, device="cpu",
                  dtype="float32")
        requests = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(d.text,), idx=i)
                    for i, d in enumerate(docs)]

        def ours():
            r = score_corpus(loaded.model, tokenizer, docs, args.max_length, prefix, batch_size=args.batch_size,
                             progress=False, per_document=True)
            return [-x["nll"] for x in r["per_document"]], r["tokens"], r["windows"]

        def theirs():
            return lm.loglikelihood_rolling(requests, disable_tqdm=True), None, None

        times, results = interleaved({"ours": ours, "lm_eval": theirs}, args.warmup, args.repeats)
    ll_ours, tokens, windows = results["ours"]
    ll_theirs = results["lm_eval"][0]
    max_rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ll_ours, ll_theirs))
    report = {"provenance": provenance(), "device": device_name(torch.device("cpu")), "torch": torch.__version__,
              "lm_eval": _version("lm_eval"), "transformers": _version("transformers"), "threads": args.threads,
              "load_average": {"before": load_before, "after": os.getloadavg()},
              "model": shape, "corpus": "wikitext103 (data/eval, detokenized as lm-eval's wikitext task)",
              "documents": len(docs), "tokens": tokens, "windows": windows, "max_length": args.max_length,
              "batch_size": args.batch_size, "warmup": args.warmup, "repeats": args.repeats,
              "max_rel_loglikelihood_diff": max_rel}
    for name in times:
        t = times[name]
        report[name] = {**t, "wall_s_median": statistics.median(t["wall_s"]),
                        "cpu_s_median": statistics.median(t["cpu_s"]),
                        "tokens_per_s": tokens / statistics.median(t["cpu_s"]),
                        "tokens_per_wall_s": tokens / statistics.median(t["wall_s"])}
    pairs = list(zip(times["ours"]["wall_s"], times["lm_eval"]["wall_s"]))
    cpu_pairs = list(zip(times["ours"]["cpu_s"], times["lm_eval"]["cpu_s"]))
    report["ratio_per_pair"] = [b / a for a, b in cpu_pairs]
    report["ratio_ours_vs_lm_eval"] = statistics.median(report["ratio_per_pair"])
    report["ratio_wall"] = statistics.median([b / a for a, b in pairs])
    print(f"ours {report['ours']['tokens_per_s']:.0f} tokens/s, lm-eval hf {report['lm_eval']['tokens_per_s']:.0f} "
          f"tokens/s: {report['ratio_ours_vs_lm_eval']:.2f}x (wall time {report['ratio_wall']:.2f}x); "
          f"{tokens} tokens, {windows} windows; log-likelihoods agree to {max_rel:.1e} relative")
    return report


def _version(pkg: str) -> str:
    from importlib.metadata import version

    return version(pkg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=2048, help="the rolling window (the model's seq_length)")
    ap.add_argument("--docs", type=int, default=6, help="the first N WikiText articles of data/eval")
    ap.add_argument("--batch-size", type=int, default=4, help="windows per forward, both sides")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of both sides (default 1: on a shared machine more threads measure the "
                         "scheduler)")
    ap.add_argument("--quick", action="store_true", help="seconds: the smoke test's size (see above)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "eval_vs_lmeval_cpu.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.hidden, args.heads, args.max_length, args.docs = 1, 64, 4, 64, 1
        args.repeats, args.warmup = 1, 0
    write_result(run(args), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
