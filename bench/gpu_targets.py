"""The GPU issue's performance targets, judged from the result files of one run of ``scripts/gpu_check.sh``.

    python bench/gpu_targets.py DIR [DIR ...] [--out DIR/targets.json]

``DIR`` holds ``attention.json`` (bench/attention.py), ``train_throughput.json`` (the kit's throughput runs) and
``decode.json`` (bench/decode.py), and ``train_compiled.json`` when the kit's train-compiled step ran (its runs join
the throughput runs); a missing file leaves its targets "not
measured" (an ``attention.json`` left by a run stopped at its time limit holds the cases it finished, and is named
as incomplete). Several folders (the parts of one kit run on one warm machine, e.g. ``--part 2`` and ``--part 4``)
are judged as one: each file from the last folder that has it; a vanilla MFU from the last file that holds that
vanilla; and each variant's tokens/s **against the vanilla of its own file** (the runs of one step, which follow
each other on the same GPU: side by side), reported only when its file has none or records another machine. On a GPU
every target is judged at the issue's conditions, and one whose numbers are absent (a run cut by its time limit) is
a "not measured" row, never the ratio at other conditions:

- attention, forward+backward time at T = 2,048 and 8,192 (B=8, H=12, d_h=64, w=128, bf16, AHA with 10% of its rows
  routed: the file's ``config``; another shape is reported only) against SDPA's causal flash attention: DAR
  ``<= 1.10`` at both; SWA and MSWA ``<= 0.45`` at 2,048 and ``<= 0.15`` at 8,192; AHA ``<= 0.6`` and ``<= 0.3``;
  MSWA ``triton / flex < 1`` at both. (Off a GPU the shortest and longest T that ran stand for them.)
- training at T = 2,048 in bf16 (another ``seq_length`` or precision: reported only), for the Pythia-160M shape
  (d 768, 12 layers): vanilla MFU ``>= 28%`` without torch_compile and ``>= 40%`` with it (Pythia-410M, d 1024 x 24
  layers: ``>= 45%`` with it); for every shape and torch_compile setting, tokens/s against vanilla's: MSWA and SWA
  ``>= 1.05``, AHA ``>= 1.0`` (judged when its run routed 5-15% of the rows, ``--aha-mu-f 0.1``), DAR ``>= 0.95``
  (each attention_impl). A run is judged only when its recorded losses are finite and, with torch_compile, its
  first-step loss is the same run's without compile (when that ran) to ``LOSS_AGREEMENT``.
- decode, the Pythia-160M shape (d 768, 12 layers; another shape is reported, not judged) in bfloat16, context
  32,768 and batch 16 (off a GPU: the longest context, batch 16 else the largest): tokens/s against vanilla's, DAR
  ``>= 3`` (each DAR cache: ``dar``, ``dar-latent``) and AHA ``>= 2``; at context 8,192, every windowed variant's
  step time no longer than vanilla's (tokens/s ``/ vanilla >= 1``). A variant whose decode step failed
  bench/decode.py's check against a float32 forward (or vanilla's did) is reported, not judged.

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
ATTENTION_T = (2048, 8192)  # the shortest and longest T, on the GPU
ATTENTION_SHAPE = {"batch": 8, "heads": 12, "head_dim": 64, "window": 128, "dtype": "bf16", "aha_frac": 0.1}
# vanilla MFU per (hidden_size, num_layers, torch_compile): (op, bound)
MFU_TARGETS = {(768, 12, False): (">=", 0.28), (768, 12, True): (">=", 0.40), (1024, 24, True): (">=", 0.45)}
# tokens/s against vanilla's of the same shape and torch_compile setting
TRAIN_RATIO_TARGETS = {"mswa": (">=", 1.05), "swa": (">=", 1.05), "aha": (">=", 1.0), "dar": (">=", 0.95)}
TRAIN_SEQ, TRAIN_PRECISION = 2048, "bf16"  # the conditions of the training targets
AHA_MU_F = 0.1  # AHA's share of routed rows in its training target (bench/train_throughput.py --aha-mu-f)
LOSS_AGREEMENT = 0.02  # |first-step loss with torch_compile - without| (the same seed and tokens; ~10.8 at init)
# decode tokens/s against vanilla's at the longest context and batch 16
DECODE_TARGETS = {"dar": (">=", 3.0), "dar-latent": (">=", 3.0), "aha": (">=", 2.0)}
DECODE_SHAPE = (768, 12)  # (hidden_size, num_layers) the decode targets are for: Pythia-160M
DECODE_CONTEXT, DECODE_BATCH = 32768, 16  # on the GPU the DAR and AHA targets are judged there, or not measured
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


def attention_targets(results: list[dict], judged: bool, config: dict | None = None) -> list[dict]:
    """:data:`ATTENTION_TARGETS` over bench/attention.py's ``results`` (forward+backward ms per kernel, T, method).
    Judged on a GPU at the issue's T (:data:`ATTENTION_T`) and shape (:data:`ATTENTION_SHAPE`, from the file's
    ``config``): a target whose T did not run is a "not measured" row (a run cut by its time limit), never the ratio
    at another T; off a GPU the shortest and longest T that ran stand for them."""
    times: dict[tuple[str, int], dict[str, float | None]] = {}
    graphs: dict[tuple[str, int], dict[str, float | None]] = {}  # --profile on a GPU: replayed from a CUDA graph
    for r in results:
        times.setdefault((r["kernel"], r["T"]), {})[r["method"]] = r.get("fwd_bwd_ms")
        graphs.setdefault((r["kernel"], r["T"]), {})[r["method"]] = r.get("graph_fwd_bwd_ms")
    other = {k: (config or {}).get(k) for k, v in ATTENTION_SHAPE.items() if (config or {}).get(k, v) != v}
    shape_note = f"not the issue's shape ({other}): reported only" if judged and other else ""
    out = []
    for kernel, num, den, op, bound, which in ATTENTION_TARGETS:
        lengths = sorted(T for k, T in times if k == kernel)
        if judged:
            lengths = list(ATTENTION_T)
        for T in {"all": lengths, "shortest": lengths[:1], "longest": lengths[-1:]}[which]:
            if (kernel, T) not in times:
                out.append(row("attention", f"{kernel} T={T}: {num} / {den} fwd+bwd", None, op, bound, judged,
                               "not measured"))
                continue
            a, b = times[(kernel, T)].get(num), times[(kernel, T)].get(den)
            note = "" if a and b else f"{num if not a else den} not timed"
            ga, gb = graphs[(kernel, T)].get(num), graphs[(kernel, T)].get(den)
            if ga and gb:  # reported beside the judged eager ratio: the device's share without the host's
                note = "; ".join(filter(None, [note, f"replayed from CUDA graphs: {ga / gb:.3f}"]))
            out.append(row("attention", f"{kernel} T={T}: {num} / {den} fwd+bwd", a / b if a and b else None,
                           op, bound, judged and not other, "; ".join(filter(None, [note, shape_note]))))
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


def conditions_note(run: dict) -> str:
    """Why a GPU throughput run is not at the issue's conditions (T = :data:`TRAIN_SEQ`, :data:`TRAIN_PRECISION`),
    or "" (fields a file does not record are not held against it)."""
    seq, precision = run["config"].get("seq_length"), run.get("precision")
    off = [f"seq_length {seq}" for _ in [0] if seq not in (None, TRAIN_SEQ)]
    off += [f"precision {precision}" for _ in [0] if precision not in (None, TRAIN_PRECISION)]
    return f"not the issue's conditions ({', '.join(off)}): reported only" if off else ""


def training_targets(runs: list[dict]) -> list[dict]:
    """Vanilla MFU (:data:`MFU_TARGETS`; each group's vanilla from the last file that has one) and each variant's
    tokens/s against the vanilla **of its own file** (:data:`TRAIN_RATIO_TARGETS`: runs that followed each other in
    one step, side by side) per (model shape, torch_compile) over the kit's throughput runs (``_file``: which file, in
    the order they ran); a run that fails :func:`loss_check` (or whose vanilla does), or is not at the issue's
    conditions, is reported, not judged. On a GPU a target with no run is a "not measured" row."""
    groups: dict[tuple, list[dict]] = {}
    vanillas: dict[tuple, dict] = {}
    eager_loss = {}
    for r in runs:
        c = r["config"]
        key = (c["hidden_size"], c["num_layers"], bool(c.get("torch_compile", False)))
        groups.setdefault((r.get("_file", 0), *key), []).append(r)
        if c["attention_type"] == "vanilla":
            vanillas[key] = r
        if not c.get("torch_compile") and "loss_first_step" in r["engine"]:
            eager_loss[run_key(c)] = r["engine"]["loss_first_step"]
    on_a_gpu = bool(runs) and all(on_gpu(r["device"]) for r in runs)

    def shape_of(key: tuple) -> str:
        return f"d {key[0]} x {key[1]} layers, torch_compile {str(key[2]).lower()}"

    out = []
    for key in sorted(set(vanillas) | (set(MFU_TARGETS) if on_a_gpu else set())):
        vanilla, target = vanillas.get(key), MFU_TARGETS.get(key)
        bound = target or (">=", MFU_TARGETS[(768, 12, key[2])][1])
        if vanilla is None:
            out.append(row("training", f"{shape_of(key)}: vanilla MFU", None, *bound, True, "not measured"))
            continue
        ok, note = loss_check(vanilla, eager_loss)
        notes = [note, conditions_note(vanilla), "" if target else "no MFU target for this shape: reported only"]
        out.append(row("training", f"{shape_of(key)}: vanilla MFU", vanilla["engine"].get("mfu"), *bound,
                       on_gpu(vanilla["device"]) and target is not None and ok and not conditions_note(vanilla),
                       "; ".join(filter(None, notes))))
    measured = set()
    for (_, *key), members in sorted(groups.items(), key=lambda kv: kv[0]):
        key = tuple(key)
        judged = all(on_gpu(r["device"]) for r in members)
        vanilla = next((r for r in members if r["config"]["attention_type"] == "vanilla"), None)
        vanilla_ok = loss_check(vanilla, eager_loss)[0] and not conditions_note(vanilla) if vanilla else True
        for r in members:
            variant = r["config"]["attention_type"]
            if variant not in TRAIN_RATIO_TARGETS:
                continue
            measured.add((*key, variant))
            ratio = r["engine"]["tokens_per_sec"] / vanilla["engine"]["tokens_per_sec"] if vanilla else None
            ok, note = loss_check(r, eager_loss)
            notes = ["" if vanilla else "no vanilla run in its file (not side by side): reported only", note,
                     conditions_note(r), "" if vanilla_ok else "vanilla's run is not judged: reported only"]
            ok = ok and vanilla_ok and not conditions_note(r)
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
            out.append(row("training", f"{shape_of(key)}: {variant.upper()} ({r['config'].get('attention_impl')}) "
                           "tokens/s / vanilla", ratio, *TRAIN_RATIO_TARGETS[variant], judged and ok,
                           "; ".join(filter(None, notes))))
    if on_a_gpu:  # the ratios are for Pythia-160M without compile
        for variant, bound in TRAIN_RATIO_TARGETS.items():
            if (768, 12, False, variant) not in measured:
                out.append(row("training", f"{shape_of((768, 12, False))}: {variant.upper()} tokens/s / vanilla",
                               None, *bound, True, "not measured"))
    return out


def decode_targets(report: dict) -> list[dict]:
    """:data:`DECODE_TARGETS` at the longest context and batch 16 (else the largest batch), and every windowed
    variant against vanilla at context 8,192 (same batch)."""
    results = report["results"]
    m = report["model"]
    shape = (m["hidden_size"], m["num_layers"])
    gpu = on_gpu(report.get("device"))
    context = DECODE_CONTEXT if gpu else max(r["context"] for r in results)  # on a GPU: the issue's, or not measured
    batches = {r["batch"] for r in results if r["context"] == context}
    batch = DECODE_BATCH if gpu or DECODE_BATCH in batches or not batches else max(batches)
    dtype_ok = report.get("dtype", "bfloat16") == "bfloat16"
    judged = gpu and shape == DECODE_SHAPE and dtype_ok
    note = "; ".join(filter(None, [
        "" if shape == DECODE_SHAPE else "the targets are for the Pythia-160M shape: reported only",
        "" if dtype_ok else f"{report['dtype']}, not bfloat16: reported only"]))
    name = f"d {shape[0]} x {shape[1]} layers"
    failed = {v for v, c in report.get("checks", {}).items() if not c["ok"]}  # bench/decode.py's check_decode

    def trusted(variant: str) -> tuple[bool, str]:
        """Whether ``variant``'s ratio may be judged (its check and vanilla's passed), and the row's note."""
        wrong = sorted({variant, "vanilla"} & failed)
        why = f"decode check failed for {', '.join(wrong)}: reported only" if wrong else ""
        return judged and not wrong, "; ".join(filter(None, [note, why]))

    out = []
    seen = set()
    for r in results:
        if r["variant"] in DECODE_TARGETS and r["context"] == context and r["batch"] == batch:
            seen.add(r["variant"])
            out.append(row("decode", f"{name}, context {context}, batch {batch}: {r['variant']} tokens/s / vanilla",
                           r.get("speed_vs_vanilla"), *DECODE_TARGETS[r["variant"]], *trusted(r["variant"])))
    for variant in (v for v in DECODE_TARGETS if v not in seen and gpu):
        out.append(row("decode", f"{name}, context {context}, batch {batch}: {variant} tokens/s / vanilla", None,
                       *DECODE_TARGETS[variant], True, "not measured"))
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
        rows += attention_targets(attention["results"], on_gpu(attention.get("device")), attention.get("config"))
    # the throughput runs of every folder, and of gpu_check.sh's train-compiled step (--part 4) when it ran; a run
    # of the same model, attention, impl and compile twice: the later step's (folder's)
    training = [f / name for f in folders for name in ("train_throughput.json", "train_compiled.json")
                if (f / name).is_file()]
    runs = [{**r, "_file": i} for i, path in enumerate(training) for r in json.loads(path.read_text())["runs"]]
    rows += training_targets(runs)
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
