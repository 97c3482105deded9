"""Greedy generation throughput of ``neox_dar.generate`` against ``transformers``' ``generate()`` on the exported copy
of the same checkpoint, batch 1 and 16, side by side in one run; and our decode of the attention variants (DAR
``keys``/``latent``, SWA, MSWA, AHA) beside vanilla's.

    python bench/generate_vs_hf.py [--layers 6] [--hidden 128] [--heads 4] [--window 128] [--prompt-tokens 32]
        [--new-tokens 256] [--batches 1,16] [--variants dar,dar-latent,swa,mswa,aha] [--repeats 3] [--warmup 1]
        [--threads 1] [--quick] [--out bench/results/generate_vs_hf_cpu.json]

The model: ``configs/tiny.yml`` at the given size (default the Pythia-14M shape: 6 layers, d 128, 4 heads of 32,
rotary on a quarter of each head), vanilla attention, random weights (seed 0), saved as a neox-dar checkpoint
(``neox_dar.saved_model.save_weights`` beside the Pythia tokenizer) and exported with ``python -m neox_dar.convert
to-hf`` (called in this process). Ours: the checkpoint loaded as ``python -m neox_dar.generate`` loads it
(``neox_dar.generate.load``) and ``neox_dar.generate.generate`` (prefill, then one token per step through the KV
cache). transformers: ``GPTNeoXForCausalLM.from_pretrained(export)`` (its default attention, sdpa) and
``generate(do_sample=False)`` with its default dynamic KV cache. Both greedy, exactly ``--new-tokens`` new tokens per
row (no eos stop on either side), from the same prompts: the first ``--prompt-tokens`` tokens of the first C4
documents of ``data/eval`` (equal lengths, so neither side pads). The variants: the same shape and seed with
``attention_type`` (and ``window_size``) changed, ``dar-latent`` = DAR with ``dar_inference_cache: latent``; ours
only (their exports run our own modeling code); AHA's random router opens about half the gates (``mu_f`` recorded).

Every model generates in turn (ours, transformers, each variant; then again), in this process with the same
``torch.set_num_threads``, after ``--warmup`` untimed rounds, so all see the same machine load. tokens/s is
``batch x new tokens`` over the median process CPU time of a ``generate`` call (prefill included; robust to other
processes on a shared machine with one thread; ``tokens_per_wall_s`` beside it); ``ratio_vs_hf`` is the median of
the per-round CPU-time ratios, ``vs_vanilla`` the same against our vanilla. On a shared machine the ratios, not the
absolute tokens/s, are what to read; the load average before and after is recorded.
``--quick`` (the smoke test): 1 layer, d 64, 8-token prompts, 4 new tokens, batch 2, one round, no warm-up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neox_dar.saved_model import save_weights  # noqa: E402
from neox_dar.config import load_config  # noqa: E402
from neox_dar.evaluation.corpora import load_local  # noqa: E402
from neox_dar.evaluation.scoring import AttentionStatsMean, overall_means  # noqa: E402
from neox_dar.generate import generate, load  # noqa: E402
from neox_dar.model import build_model  # noqa: E402
from neox_dar.provenance import device_name, provenance, write_result  # noqa: E402
from neox_dar.timing import interleaved  # noqa: E402
from neox_dar.tokenizer import DEFAULT_TOKENIZER, load_tokenizer  # noqa: E402

VARIANTS = {"dar": ["attention_type=dar"], "dar-latent": ["attention_type=dar", "dar_inference_cache=latent"],
            "swa": ["attention_type=swa"], "mswa": ["attention_type=mswa"], "aha": ["attention_type=aha"]}


def model_overrides(args) -> list[str]:
    return [f"num_layers={args.layers}", f"hidden_size={args.hidden}", f"num_attention_heads={args.heads}",
            f"window_size={args.window}", "max_position_embeddings=2048", "seq_length=2048"]


def build(args, extra: list[str]):
    cfg = load_config(ROOT / "configs" / "tiny.yml", overrides=[*model_overrides(args), *extra]).model
    torch.manual_seed(0)
    return build_model(cfg).eval(), cfg


def prompts(args) -> list[list[int]]:
    tok = load_tokenizer()
    ids = [tok.encode(d.text).ids for d in load_local("c4")]
    ids = [x[:args.prompt_tokens] for x in ids if len(x) >= args.prompt_tokens]
    need = max(args.batches)
    if len(ids) < need:
        raise SystemExit(f"only {len(ids)} C4 documents have {args.prompt_tokens} tokens; need {need}")
    return ids[:need]


def run(args) -> dict:
    from transformers import GPTNeoXForCausalLM

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    N = args.new_tokens
    with tempfile.TemporaryDirectory() as tmp:
        from neox_dar import convert

        model, cfg = build(args, ["attention_type=vanilla"])
        ckpt, hf_dir = Path(tmp) / "ckpt", Path(tmp) / "hf"
        ckpt.mkdir()
        shutil.copyfile(DEFAULT_TOKENIZER, ckpt / "tokenizer.json")  # first: the manifest lists it
        save_weights(model, cfg, ckpt)
        if convert.main(["to-hf", str(ckpt), str(hf_dir)]) != 0:
            raise SystemExit("export failed")
        ours = load(ckpt, device="cpu").model  # as python -m neox_dar.generate CKPT does
        hf = GPTNeoXForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
        hf.generation_config.eos_token_id = None  # exactly N new tokens, as ours with no eos_ids
        hf.generation_config.pad_token_id = 0
    variants = {v: build(args, VARIANTS[v])[0] for v in args.variants}
    all_prompts = prompts(args)

    def run_ours(m, batch, stats=None):
        out = generate(m, batch, N, stats=stats)
        return [c.token_ids for c in out]

    def run_hf(batch):
        ids = torch.tensor(batch)
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, min_new_tokens=N,
                              do_sample=False)
        return out[:, ids.shape[1]:].tolist()

    rows = []
    for B in args.batches:
        batch = all_prompts[:B]
        sides = {"ours": lambda: run_ours(ours, batch), "transformers": lambda: run_hf(batch)}
        stats = {}
        for v, m in variants.items():
            stats[v] = AttentionStatsMean(m)
            sides[v] = (lambda m=m, s=stats[v]: run_ours(m, batch, s))
        times, tokens = interleaved(sides, args.warmup, args.repeats, label=f"B={B} ")
        assert all(len(t) == N for k in sides for t in tokens[k]), "a row did not generate exactly N tokens"
        same = sum(a == b for a, b in zip(tokens["ours"], tokens["transformers"]))
        for name in sides:
            t = times[name]
            row = {"side": name, "batch": B, "new_tokens": N, **t,
                   "cpu_s_median": statistics.median(t["cpu_s"]), "wall_s_median": statistics.median(t["wall_s"]),
                   "tokens_per_s": B * N / statistics.median(t["cpu_s"]),
                   "tokens_per_wall_s": B * N / statistics.median(t["wall_s"])}
            if name == "ours":
                row["ratio_vs_hf"] = statistics.median(h / o for o, h in zip(t["cpu_s"], times["transformers"]["cpu_s"]))
                row["ratio_vs_hf_wall"] = statistics.median(
                    h / o for o, h in zip(t["wall_s"], times["transformers"]["wall_s"]))
                row["rows_identical_to_hf"] = same
            if name not in ("ours", "transformers"):
                row["vs_vanilla"] = statistics.median(o / v for o, v in zip(times["ours"]["cpu_s"], t["cpu_s"]))
                if name == "aha":
                    row["mu_f"] = overall_means(stats[name].result()).get("mu_f")
            rows.append(row)
            print(f"  {name:>12} B={B:>2}: {row['tokens_per_s']:8.1f} tokens/s"
                  + (f"  {row['ratio_vs_hf']:.2f}x transformers" if "ratio_vs_hf" in row else "")
                  + (f"  {row['vs_vanilla']:.2f}x vanilla" if "vs_vanilla" in row else ""), flush=True)
    import transformers

    return {"provenance": provenance(), "device": device_name(torch.device("cpu")), "torch": torch.__version__,
            "transformers": transformers.__version__, "threads": args.threads,
            "load_average": {"before": load_before, "after": os.getloadavg()},
            "model": {"config": ["configs/tiny.yml", *model_overrides(args)], "num_layers": cfg.num_layers,
                      "hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_attention_heads,
                      "window_size": cfg.attention.window_size, "parameters": sum(p.numel() for p in model.parameters()),
                      "attention_impl": ours.cfg.attention.attention_impl,
                      "hf_attention_implementation": hf.config._attn_implementation},
            "prompt_tokens": args.prompt_tokens, "prompts": "the first C4 documents of data/eval, cut to prompt_tokens",
            "new_tokens": N, "greedy": True, "warmup": args.warmup, "repeats": args.repeats, "results": rows}


def markdown(report: dict) -> str:
    """The results as the Markdown table of docs/inference.md."""
    lines = ["| model | batch | tokens/s (CPU time) | x transformers | x our vanilla |", "|---|---:|---:|---:|---:|"]
    for r in report["results"]:
        name = {"ours": "neox_dar vanilla", "transformers": "transformers vanilla"}.get(r["side"], f"neox_dar {r['side']}")
        if r.get("mu_f") is not None:
            name += f" (mu_f {r['mu_f']:.2f})"
        vs_hf = {"ours": f"{r.get('ratio_vs_hf', 0):.2f}", "transformers": "1.00"}.get(r["side"], "")
        vs_vanilla = "1.00" if r["side"] == "ours" else f"{r['vs_vanilla']:.2f}" if "vs_vanilla" in r else ""
        lines.append(f"| {name} | {r['batch']} | {r['tokens_per_s']:.1f} | {vs_hf} | {vs_vanilla} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--window", type=int, default=128, help="window_size of SWA, MSWA, AHA and DAR")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="ours only, beside vanilla ('' for none)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of every side (default 1: on a shared machine more threads measure the "
                         "scheduler)")
    ap.add_argument("--quick", action="store_true", help="seconds: the smoke test's size (see above)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "generate_vs_hf_cpu.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.hidden, args.heads, args.window, args.prompt_tokens, args.new_tokens = 1, 64, 4, 4, 8, 4
        args.batches, args.repeats, args.warmup = "2", 1, 0
    args.batches = [int(b) for b in args.batches.split(",")]
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        print(f"error: unknown variants {unknown} (known: {', '.join(VARIANTS)})", file=sys.stderr)
        return 2
    report = run(args)
    write_result(report, args.out)
    if args.markdown:
        print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
