"""The GPU issue's performance targets, judged from the result files of one run of ``scripts/gpu_check.sh``.

    python bench/gpu_targets.py DIR [DIR ...] [--out DIR/targets.json]

``DIR`` holds ``attention.json`` (bench/attention.py), ``train_throughput.json`` (the kit's throughput runs) and
``decode.json`` (bench/decode.py), and ``train_compiled.json`` when the kit's train-compiled step ran (its runs join
the throughput runs; a run in both files counts once, the later step's); a missing file leaves its targets "not
measured" (an ``attention.json`` left by a run stopped at its time limit holds the cases it finished, and is named
as incomplete). Several folders (the parts of one kit run on one warm machine, e.g. ``--part 2`` and ``--part 4``)
are judged as one: each file from the last folder that has it, the throughput runs of all (a repeated run counts
once, the later folder's); a variant's training run whose recorded machine (the machine's boot id and the GPU's
UUID) is not its vanilla run's is reported, not judged. Each target is a ratio of two
numbers measured in the same run (side by side: bench/attention.py alternates methods on one input; the throughput
runs follow each other on the same GPU; bench/decode.py alternates variants step by step):

- attention, forward+backward time (B=8, H=12, d_h=64, w=128, bf16 on the GPU) against SDPA's causal flash
  attention: DAR ``<= 1.10`` at every T; SWA and MSWA ``<= 0.45`` at the shortest T and ``<= 0.15`` at the longest;
  AHA (10% of rows routed) ``<= 0.6`` and ``<= 0.3``; MSWA ``triton / flex < 1`` at every T. (T is 2,048 and 8,192 on
  the GPU.)
- training, for the Pythia-160M shape (d 768, 12 layers): vanilla MFU ``>= 28%`` without torch_compile and ``>= 40%``
  with it (Pythia-410M, d 1024 x 24 layers: ``>= 45%`` with it); for every shape and torch_compile setting, tokens/s
  against vanilla's: MSWA and SWA ``>= 1.05``, AHA ``>= 1.0`` (judged when its run routed 5-15% of the rows,
  ``--aha-mu-f 0.1``), DAR ``>= 0.95`` (each attention_impl). A run is judged only when its recorded losses are
  finite and, with torch_compile, its first-step loss is the same run's without compile (when that ran) to
  ``LOSS_AGREEMENT``.
- decode, the Pythia-160M shape (d 768, 12 layers; another shape is reported, not judged), the longest context
  and batch 16 (else the largest batch): tokens/s against vanilla's, DAR ``>= 3`` (each
  DAR cache: ``dar``, ``dar-latent``) and AHA ``>= 2``; at context 8,192, every windowed variant's step time no
  longer than vanilla's (tokens/s ``/ vanilla >= 1``). A variant whose decode step failed bench/decode.py's check
  against a float32 forward (or vanilla's did) is reported, not judged.

A target is judged (met: yes or no) only when its numbers come from an NVIDIA GPU; off a GPU (``gpu_check.sh
--rehearse``) the ratios are computed and printed, marked "not judged": they are CPU or interpreter times.
Prints a Markdown table (``gpu_check.sh`` appends it to ``summary.md``) and, with ``--out``, writes it as JSON
(with the git commit, command and date).
"""

from __future__ import annotations

import argparse
import json
import math
import operator
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}

# (kernel, numerator method, denominator method, op, bound, which T: "all", "shortest" or "longest")
ATTENTION_TARGETS = [
    ("dar", "triton", "sdpa_causal", "<=", 1.10, "all"),
    ("swa", "triton", "sdpa_causal", "<=", 0.45, "shortest"),
    ("swa", "triton", "sdpa_causal", "<=", 0.15, "longest"),
    ("mswa", "triton", "sdpa_causal", "<=", 0.45, "shortest"),
    ("mswa", "triton", "sdpa_causal", "<=", 0.15, "longest"),
    ("mswa", "triton", "flex", "<", 1.0, "all"),
    ("aha", "triton", "sdpa_causal", "<=", 0.6, "shortest"),
    ("aha", "triton", "sdpa_causal", "<=", 0.3, "longest"),
]
# vanilla MFU per (hidden_size, num_layers, torch_compile): (op, bound)
MFU_TARGETS = {(768, 12, False): (">=", 0.28), (768, 12, True): (">=", 0.40), (1024, 24, True): (">=", 0.45)}
# tokens/s against vanilla's of the same shape and torch_compile setting
TRAIN_RATIO_TARGETS = {"mswa": (">=", 1.05), "swa": (">=", 1.05), "aha": (">=", 1.0), "dar": (">=", 0.95)}
AHA_MU_F = 0.1  # AHA's share of routed rows in its training target (bench/train_throughput.py --aha-mu-f)
LOSS_AGREEMENT = 0.02  # |first-step loss with torch_compile - without| (the same seed and tokens; ~10.8 at init)
# decode tokens/s against vanilla's at the longest context and batch 16
DECODE_TARGETS = {"dar": (">=", 3.0), "dar-latent": (">=", 3.0), "aha": (">=", 2.0)}
DECODE_SHAPE = (768, 12)  # (hidden_size, num_layers) the decode targets are for: Pythia-160M
WINDOWED = ("swa", "mswa", "aha", "dar", "dar-latent", "uniform")  # each at least as fast as vanilla at 8k
DECODE_8K = 8192


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
    graphs: dict[tuple[str, int], dict[str, float | None]] = {}  # --profile on a GPU: replayed from a CUDA graph
    for r in results:
        times.setdefault((r["kernel"], r["T"]), {})[r["method"]] = r.get("fwd_bwd_ms")
        graphs.setdefault((r["kernel"], r["T"]), {})[r["method"]] = r.get("graph_fwd_bwd_ms")
    out = []
    for kernel, num, den, op, bound, which in ATTENTION_TARGETS:
        lengths = sorted(T for k, T in times if k == kernel)
        for T in {"all": lengths, "shortest": lengths[:1], "longest": lengths[-1:]}[which]:
            a, b = times[(kernel, T)].get(num), times[(kernel, T)].get(den)
            note = "" if a and b else f"{num if not a else den} not timed"
            ga, gb = graphs[(kernel, T)].get(num), graphs[(kernel, T)].get(den)
            if ga and gb:  # reported beside the judged eager ratio: the device's share without the host's
                note = "; ".join(filter(None, [note, f"replayed from CUDA graphs: {ga / gb:.3f}"]))
            out.append(row("attention", f"{kernel} T={T}: {num} / {den} fwd+bwd", a / b if a and b else None,
                           op, bound, judged, note))
    return out


def same_machine(a: dict, b: dict) -> bool:
    """Whether two results may be compared: their recorded machine ids (``neox_dar.provenance.machine_id``: boot id
    and GPU UUID) are equal, or one of them records none (files written before the kit recorded it)."""
    return not (a.get("machine") and b.get("machine")) or a["machine"] == b["machine"]


def run_key(config: dict) -> tuple:
    """A throughput run's identity without its torch_compile setting: (hidden_size, num_layers, attention_type,
    attention_impl)."""
    return config["hidden_size"], config["num_layers"], config["attention_type"], config.get("attention_impl")


def loss_check(run: dict, eager_loss: dict) -> tuple[bool, str]:
    """Whether a throughput run's numbers can be judged: its losses finite (bench/train_throughput.py records the
    first and last step's; older files have none) and, with torch_compile, its first-step loss within
    :data:`LOSS_AGREEMENT` of the same run's without compile when that ran too. -> (ok, note)."""
    e, c = run["engine"], run["config"]
    losses = [e[k] for k in ("loss_first_step", "loss_last_step") if k in e]
    if not all(math.isfinite(x) for x in losses):
        return False, f"loss not finite ({', '.join(map(str, losses))}): reported only"
    eager = eager_loss.get(run_key(c))
    if not c.get("torch_compile") or not losses or eager is None:
        return True, ""
    if abs(losses[0] - eager) > LOSS_AGREEMENT:
        return False, f"first-step loss {losses[0]:.4f} against {eager:.4f} without compile: reported only"
    return True, f"first-step loss {losses[0]:.4f} ({eager:.4f} without compile)"


def training_targets(runs: list[dict]) -> list[dict]:
    """Vanilla MFU (:data:`MFU_TARGETS`) and each variant's tokens/s against vanilla's
    (:data:`TRAIN_RATIO_TARGETS`) per (model shape, torch_compile) over the kit's throughput runs; a run that fails
    :func:`loss_check` (or whose vanilla does) is reported, not judged."""
    groups: dict[tuple, list[dict]] = {}
    eager_loss = {}
    for r in runs:
        c = r["config"]
        groups.setdefault((c["hidden_size"], c["num_layers"], bool(c.get("torch_compile", False))), []).append(r)
        if not c.get("torch_compile") and "loss_first_step" in r["engine"]:
            eager_loss[run_key(c)] = r["engine"]["loss_first_step"]
    out = []
    for key, members in sorted(groups.items()):
        hidden, layers, compiled = key
        shape = f"d {hidden} x {layers} layers, torch_compile {str(compiled).lower()}"
        judged = all(on_gpu(r["device"]) for r in members)
        vanilla = next((r for r in members if r["config"]["attention_type"] == "vanilla"), None)
        vanilla_ok, vanilla_note = loss_check(vanilla, eager_loss) if vanilla else (True, "")
        if vanilla is not None:
            target = MFU_TARGETS.get(key)
            out.append(row("training", f"{shape}: vanilla MFU", vanilla["engine"].get("mfu"),
                           *(target or (">=", MFU_TARGETS[(768, 12, compiled)][1])),
                           judged and target is not None and vanilla_ok,
                           "; ".join(filter(None, [vanilla_note,
                                                   "" if target else "no MFU target for this shape: reported only"]))))
        for r in members:
            variant = r["config"]["attention_type"]
            if variant not in TRAIN_RATIO_TARGETS:
                continue
            ratio = r["engine"]["tokens_per_sec"] / vanilla["engine"]["tokens_per_sec"] if vanilla else None
            ok, note = loss_check(r, eager_loss)
            notes = ["" if vanilla else "no vanilla run", note,
                     "" if vanilla_ok else "vanilla's loss check failed: reported only"]
            ok = ok and vanilla_ok
            if vanilla and not same_machine(r, vanilla):
                ok = False
                notes.append("measured on another machine than vanilla's run: reported only")
            if variant == "aha":  # the target is AHA with about AHA_MU_F of its rows routed (--aha-mu-f)
                mu_f = (r["engine"].get("aha_mu_f") or {}).get("measured")
                ok = ok and mu_f is not None and abs(mu_f - AHA_MU_F) <= AHA_MU_F / 2
                if mu_f is None:
                    notes.append("routed share not set (a zero router routes no row): reported only")
                else:
                    notes.append(f"mu_f {mu_f:.3f}" + ("" if ok else f", not near {AHA_MU_F}: reported only"))
            out.append(row("training", f"{shape}: {variant.upper()} ({r['config'].get('attention_impl')}) tokens/s "
                           "/ vanilla", ratio, *TRAIN_RATIO_TARGETS[variant], judged and ok,
                           "; ".join(filter(None, notes))))
    return out


def decode_targets(report: dict) -> list[dict]:
    """:data:`DECODE_TARGETS` at the longest context and batch 16 (else the largest batch), and every windowed
    variant against vanilla at context 8,192 (same batch)."""
    results = report["results"]
    context = max(r["context"] for r in results)
    batches = {r["batch"] for r in results if r["context"] == context}
    batch = 16 if 16 in batches else max(batches)
    m = report["model"]
    shape = (m["hidden_size"], m["num_layers"])
    judged = on_gpu(report.get("device")) and shape == DECODE_SHAPE
    note = "" if shape == DECODE_SHAPE else "the targets are for the Pythia-160M shape: reported only"
    name = f"d {shape[0]} x {shape[1]} layers"
    failed = {v for v, c in report.get("checks", {}).items() if not c["ok"]}  # bench/decode.py's check_decode

    def trusted(variant: str) -> tuple[bool, str]:
        """Whether ``variant``'s ratio may be judged (its check and vanilla's passed), and the row's note."""
        wrong = sorted({variant, "vanilla"} & failed)
        why = f"decode check failed for {', '.join(wrong)}: reported only" if wrong else ""
        return judged and not wrong, "; ".join(filter(None, [note, why]))

    out = []
    for r in results:
        if r["variant"] in DECODE_TARGETS and r["context"] == context and r["batch"] == batch:
            out.append(row("decode", f"{name}, context {context}, batch {batch}: {r['variant']} tokens/s / vanilla",
                           r.get("speed_vs_vanilla"), *DECODE_TARGETS[r["variant"]], *trusted(r["variant"])))
    for r in results:
        if r["variant"] in WINDOWED and r["context"] == DECODE_8K and r["batch"] == batch:
            out.append(row("decode", f"{name}, context {DECODE_8K}, batch {batch}: {r['variant']} tokens/s / "
                           "vanilla (step time no longer)", r.get("speed_vs_vanilla"), ">=", 1.0,
                           *trusted(r["variant"])))
    return out


def judge(*folders: Path) -> dict:
    """Every target from the result files of ``folders`` (one, or the parts of one kit run, in the order they ran);
    files that are missing are named in ``missing``."""
    def load(name: str):
        paths = [f / name for f in folders if (f / name).is_file()]
        return json.loads(paths[-1].read_text()) if paths else None

    attention, decode = load("attention.json"), load("decode.json")
    rows = []
    if attention is not None:
        rows += attention_targets(attention["results"], on_gpu(attention.get("device")))
    # the throughput runs of every folder, and of gpu_check.sh's train-compiled step (--part 4) when it ran; a run
    # of the same model, attention, impl and compile twice: the later step's (folder's)
    training = [f / name for f in folders for name in ("train_throughput.json", "train_compiled.json")
                if (f / name).is_file()]
    runs = {}
    for path in training:
        for r in json.loads(path.read_text())["runs"]:
            runs[(*run_key(r["config"]), bool(r["config"].get("torch_compile", False)))] = r
    rows += training_targets(list(runs.values()))
    if decode is not None:
        rows += decode_targets(decode)
    missing = [n for n, d in [("attention.json", attention), ("train_throughput.json", training or None),
                              ("decode.json", decode)] if d is None]
    # bench/attention.py saves after each (kernel, T): a run stopped by its time limit leaves "complete": false
    incomplete = ["attention.json"] if attention is not None and attention.get("complete") is False else []
    return {"folder": str(folders[-1]), "folders": [str(f) for f in folders], "targets": rows, "missing": missing,
            "incomplete": incomplete}


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
    p.add_argument("folder", type=Path, nargs="+",
                   help="the kit's output folder (attention.json, train_throughput.json, train_compiled.json, "
                        "decode.json), or the folders of the parts of one run on one machine, in the order they ran")
    p.add_argument("--out", type=Path, help="also write the targets as JSON here")
    args = p.parse_args(argv)
    for folder in args.folder:
        if not folder.is_dir():
            p.error(f"{folder} is not a folder")
    try:
        report = judge(*args.folder)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        print(f"gpu_targets.py: error: a result file in {' or '.join(map(str, args.folder))} is not one the kit "
              f"writes ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    print(markdown(report), end="")
    if args.out:
        sys.path.insert(0, str(ROOT))
        from neox_dar.provenance import provenance, write_result

        write_result({**provenance(), **report}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
