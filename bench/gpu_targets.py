"""The GPU issue's performance targets, judged from the result files of one run of ``scripts/gpu_check.sh``.

    python bench/gpu_targets.py DIR [--out DIR/targets.json]

``DIR`` holds ``attention.json`` (bench/attention.py), ``train_throughput.json`` (the kit's throughput runs) and
``decode.json`` (bench/decode.py); a missing file leaves its targets "not measured" (an ``attention.json`` left by a
run stopped at its time limit holds the cases it finished, and is named as incomplete). Each target is a ratio of two
numbers measured in the same run (side by side: bench/attention.py alternates methods on one input; the throughput
runs follow each other on the same GPU; bench/decode.py alternates variants step by step):

- attention, forward+backward time (B=8, H=12, d_h=64, w=128, bf16 on the GPU): DAR ``triton / sdpa_causal <= 1.15``
  at every T, ``reference / triton >= 5`` at the longest T; MSWA ``triton / flex < 1`` at every T and
  ``triton / sdpa_causal < 0.5`` at the longest T; AHA (10% of rows routed) ``triton / sdpa_causal < 0.4`` at the
  longest T. (The longest T is 8,192 on the GPU.)
- training: vanilla MFU ``>= 45%`` for the Pythia-160M shape (d 768, 12 layers; other shapes are reported, not
  judged), and DAR tokens/s ``/ vanilla >= 0.92`` for each model shape, torch_compile setting and DAR
  attention_impl.
- decode: at the longest context and batch 16 (else the largest batch), DAR's tokens/s ``/ vanilla > 1``, for each
  DAR cache (``dar``, ``dar-latent``).

A target is judged (met: yes or no) only when its numbers come from an NVIDIA GPU; off a GPU (``gpu_check.sh
--rehearse``) the ratios are computed and printed, marked "not judged": they are CPU or interpreter times.
Prints a Markdown table (``gpu_check.sh`` appends it to ``summary.md``) and, with ``--out``, writes it as JSON
(with the git commit, command and date).
"""

from __future__ import annotations

import argparse
import json
import operator
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}
PYTHIA_160M = (768, 12)  # (hidden_size, num_layers): the shape the MFU target is set for

# (kernel, numerator method, denominator method, op, bound, longest T only)
ATTENTION_TARGETS = [
    ("dar", "triton", "sdpa_causal", "<=", 1.15, False),
    ("dar", "reference", "triton", ">=", 5.0, True),
    ("mswa", "triton", "flex", "<", 1.0, False),
    ("mswa", "triton", "sdpa_causal", "<", 0.5, True),
    ("aha", "triton", "sdpa_causal", "<", 0.4, True),
]
MFU_TARGET = (">=", 0.45)
DAR_TRAIN_TARGET = (">=", 0.92)
DAR_DECODE_TARGET = (">", 1.0)


def on_gpu(device: str | None) -> bool:
    """Whether a result file's ``device`` names an NVIDIA GPU (the benchmarks write ``torch.cuda.get_device_name()``
    there, else the CPU). Not the ``cuda`` field: that is torch's CUDA version, set on a CUDA build of torch run on
    the CPU too (the rehearsal hides the GPU)."""
    return (device or "").startswith("NVIDIA")


def row(area: str, target: str, value: float | None, op: str, bound: float, judged: bool, note: str = "") -> dict:
    """One target: its measured ratio and whether it is met (None: not measured, or not judged off a GPU)."""
    met = None if value is None or not judged else bool(OPS[op](value, bound))
    return {"area": area, "target": f"{target} {op} {bound:g}", "value": value, "met": met, "judged": judged,
            "note": note}


def attention_targets(results: list[dict], judged: bool) -> list[dict]:
    """:data:`ATTENTION_TARGETS` over bench/attention.py's ``results`` (forward+backward ms per kernel, T, method)."""
    times: dict[tuple[str, int], dict[str, float | None]] = {}
    for r in results:
        times.setdefault((r["kernel"], r["T"]), {})[r["method"]] = r.get("fwd_bwd_ms")
    out = []
    for kernel, num, den, op, bound, longest_only in ATTENTION_TARGETS:
        lengths = sorted(T for k, T in times if k == kernel)
        for T in lengths[-1:] if longest_only else lengths:
            a, b = times[(kernel, T)].get(num), times[(kernel, T)].get(den)
            note = "" if a and b else f"{num if not a else den} not timed"
            out.append(row("attention", f"{kernel} T={T}: {num} / {den} fwd+bwd", a / b if a and b else None,
                           op, bound, judged, note))
    return out


def training_targets(runs: list[dict]) -> list[dict]:
    """Vanilla MFU and DAR/vanilla tokens/s per (model shape, torch_compile) over the kit's throughput runs."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        c = r["config"]
        groups.setdefault((c["hidden_size"], c["num_layers"], c.get("torch_compile", False)), []).append(r)
    out = []
    for (hidden, layers, compiled), members in sorted(groups.items()):
        shape = f"d {hidden} x {layers} layers, torch_compile {str(compiled).lower()}"
        judged = all(on_gpu(r["device"]) for r in members)
        vanilla = next((r for r in members if r["config"]["attention_type"] == "vanilla"), None)
        if vanilla is not None:
            is_160m = (hidden, layers) == PYTHIA_160M
            out.append(row("training", f"{shape}: vanilla MFU", vanilla["engine"].get("mfu"), *MFU_TARGET,
                           judged and is_160m, "" if is_160m else "the target is for Pythia-160M: reported only"))
        for r in members:
            if r["config"]["attention_type"] != "dar":
                continue
            ratio = r["engine"]["tokens_per_sec"] / vanilla["engine"]["tokens_per_sec"] if vanilla else None
            out.append(row("training", f"{shape}: DAR ({r['config'].get('attention_impl')}) tokens/s / vanilla",
                           ratio, *DAR_TRAIN_TARGET, judged, "" if vanilla else "no vanilla run"))
    return out


def decode_targets(report: dict) -> list[dict]:
    """DAR's decode tokens/s against vanilla's at the longest context and batch 16 (else the largest batch)."""
    results = report["results"]
    context = max(r["context"] for r in results)
    batches = {r["batch"] for r in results if r["context"] == context}
    batch = 16 if 16 in batches else max(batches)
    judged = on_gpu(report.get("device"))
    out = []
    for r in results:
        if r["variant"] in ("dar", "dar-latent") and r["context"] == context and r["batch"] == batch:
            out.append(row("decode", f"context {context}, batch {batch}: {r['variant']} tokens/s / vanilla",
                           r.get("speed_vs_vanilla"), *DAR_DECODE_TARGET, judged))
    return out


def judge(folder: Path) -> dict:
    """Every target from ``folder``'s result files; files that are missing are named in ``missing``."""
    def load(name: str):
        path = folder / name
        return json.loads(path.read_text()) if path.is_file() else None

    attention, throughput, decode = load("attention.json"), load("train_throughput.json"), load("decode.json")
    rows = []
    if attention is not None:
        rows += attention_targets(attention["results"], on_gpu(attention.get("device")))
    if throughput is not None:
        rows += training_targets(throughput["runs"])
    if decode is not None:
        rows += decode_targets(decode)
    missing = [n for n, d in [("attention.json", attention), ("train_throughput.json", throughput),
                              ("decode.json", decode)] if d is None]
    # bench/attention.py saves after each (kernel, T): a run stopped by its time limit leaves "complete": false
    incomplete = ["attention.json"] if attention is not None and attention.get("complete") is False else []
    return {"folder": str(folder), "targets": rows, "missing": missing, "incomplete": incomplete}


def markdown(report: dict) -> str:
    """The targets as a Markdown table."""
    lines = ["| area | target | measured | met |", "|---|---|---|---|"]
    for t in report["targets"]:
        value = "-" if t["value"] is None else f"{t['value']:.3f}"
        met = {True: "yes", False: "NO", None: "-"}[t["met"]]
        if t["value"] is not None and not t["judged"]:
            met = "not judged"
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| {t['area']} | {t['target']}{note} | {value} | {met} |")
    if report["missing"]:
        lines.append(f"\nNot measured (no result file): {', '.join(report['missing'])}.")
    if report["incomplete"]:
        lines.append(f"\nStopped before the end (what it measured is above): {', '.join(report['incomplete'])}.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="the kit's output folder (attention.json, train_throughput.json, "
                                             "decode.json)")
    p.add_argument("--out", type=Path, help="also write the targets as JSON here")
    args = p.parse_args(argv)
    if not args.folder.is_dir():
        p.error(f"{args.folder} is not a folder")
    try:
        report = judge(args.folder)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        print(f"gpu_targets.py: error: a result file in {args.folder} is not one the kit writes "
              f"({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    print(markdown(report), end="")
    if args.out:
        sys.path.insert(0, str(ROOT))
        from neox_dar.provenance import provenance, write_result

        write_result({**provenance(), **report}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
