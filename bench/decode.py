"""Decoding cost of each attention variant against vanilla on the same model: cache bytes per sequence, cache bytes
read per generated token, and decode tokens/s, at several contexts and batch sizes.

    python bench/decode.py [CONFIG ...] [key=value ...] [--variants vanilla,swa,mswa,aha,dar,uniform,linear]
        [--contexts 2048,8192,32768] [--batches 1,16] [--steps 4] [--warmup 1] [--device cpu|cuda]
        [--dtype float32|bfloat16] [--aha-mu-f 0.1] [--threads N] [--out bench/results/decode_<device>.json]
        [--markdown] [--profile] [--preset pythia-160m|mswa-fig3|mswa-fig3-cpu|dimpo-table4|dimpo-table4-cpu]
        [--sdpa-backends flash,efficient,math,cudnn]

Default model: ``configs/pythia-14m.yml`` with 4 layers (d 128, 4 heads of 32: MSWA's 4 x 4 window table is the
paper's), ``window_size: 128``, DAR/uniform ``d_down = d/4`` (``dar-latent``: DAR with ``dar_inference_cache: latent``),
linear ``d_f = 16``, ``dimpo``: the last half of the layers DimPO-projected (keys at ``d' = d_h / 4``); random weights.

First each variant's decode step is checked (:func:`check_decode`): prompts prefilled, three tokens decoded on the
path that is timed, their logits against a float32 full forward on the plain PyTorch path, within three times the
distance of the model's own dtype's forward (``checks`` in the JSON, ``check_ok`` in each row; a failed check is
printed, its times are still recorded, and the exit status is 1).

Per variant, context ``C`` and batch ``B``: the model's caches are made for ``C`` tokens per row
(``CausalLM.new_cache``) and their first ``C - warmup - steps`` columns are taken as written (zeros: the decode cost
does not depend on the values, and the prefill is not timed), then ``warmup`` + ``steps`` decode steps run
(``CausalLM.decode``, one token per row), so the timed steps see contexts just below ``C``. Variants alternate
step by step, so they share the machine's load (the 1-minute load average before and after is recorded); a step's
time is wall time (CUDA synchronised); tokens/s is ``B / median step time``. ``cache_bytes_per_sequence`` is what
the caches hold (``ModelCache.nbytes() / B``), next to the figure ``python -m neox_dar.describe`` prints (each
layer's ``kv_cache_bytes_per_token(C, dtype bytes) x C``, summed).
``kv_bytes_read_per_token`` counts what one decode step of the implementation reads from the caches per row: the
whole cache, except AHA (the last ``w`` columns of every head, and every column for the (row, head) pairs whose gate
is open). AHA's router is replaced by a fixed gate pattern opening a ``--aha-mu-f`` share of the (layer, row, head)
triples (random routers open about half); the realised share is recorded.

A variant ``NAME@W`` runs ``NAME`` at ``window_size = W`` (e.g. ``mswa@512``). With several contexts the report also
holds, per variant and batch, the median step time over the contexts (``over_contexts``: MSWA Fig. 3 reports the
median over the positions 500, 1,000, 1,500 and 2,000).

Presets (:data:`PRESETS`; options given on the command line replace a preset's):

- ``pythia-160m``: the GPU kit's decode step (scripts/gpu_check.sh): Pythia-160M's shape (12 layers, 12 heads of 64),
  ``window_size: 128``, vanilla, SWA, MSWA, AHA, DAR and DAR's latent cache at contexts 8,192 and 32,768, batch 16,
  bfloat16 on a GPU, 20 timed steps after 3 warm-up steps.
- ``mswa-fig3``: MSWA Fig. 3 (Sec. 5.3, Appendix B.2.3): 32 layers, 16 heads of 64 (d 1,024), positions 500, 1,000,
  1,500, 2,000 of a 2,048-token sequence, batches 8 to 512, vanilla, SWA and MSWA at base windows 128 and 512
  (the paper names none), bfloat16 on a GPU (FlashAttention in the paper; here the project's ``sdpa`` decode).
  Vanilla's cache at batch 512 is 128 GiB (32 x 2 x 1,024 x 2,048 x 2 bytes a sequence): an 80 GB GPU runs
  ``--batches 8,16,64,128`` (256 fits on 141 GB).
- ``mswa-fig3-cpu``: the same layer shape and positions with 4 layers (MSWA's 4 layer groups, one layer each) at
  batches 8 and 16, float32, for this CPU.
- ``dimpo-table4``: DimPO Table 4's throughput: Llama-3.2-1B's shape (``configs/llama-3.2-1b.yml``, 16 layers, 32
  query and 8 key/value heads of 64), vanilla against ``dimpo`` (the last 8 layers' keys at ``d' = 16``: a KV-cache
  saving of 18.75% by the paper's accounting, against its settings of about 6, 10 and 12%), contexts 4,096 and
  8,192, batch 1, bfloat16 on a GPU (the paper's eager attention: here ``sdpa``).
- ``dimpo-table4-cpu``: the same at 4 layers, float32, for this CPU.

``--profile`` runs one more step per variant and point (the cache made one column larger, so that step is at
context ``C``) under torch's profiler (:func:`neox_dar.timing.launch_profile`): its CUDA kernels' launches and
device microseconds against the step's wall microseconds, in each row's ``profile``: a wall time well above the
kernels' is the host's (Python, launches, a new shape's planning), and the host's own longest events
(``profile.host``: aten ops and the CUDA runtime's calls) say where it went.

``--sdpa-backends`` limits ``scaled_dot_product_attention`` in the decode steps (the check's and the timed ones)
to the named backends, to compare them on one machine (e.g. ``--variants vanilla --sdpa-backends efficient`` against
torch's choice, cuDNN's on the H200 with torch 2.11); the variants whose decode step has its own kernel on the
``triton`` path (DAR's, AHA's) are not affected there.

Writes JSON (device, versions, git commit, command, UTC date, the model, every number) to ``--out`` and prints a
table (``--markdown``: the Markdown table of docs/inference.md). Runs on a GPU as is (``--device cuda --dtype
bfloat16``). On the CPU it uses one thread unless ``--threads`` says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neox_dar.config import ConfigError, load_config, split_args  # noqa: E402
from neox_dar.model import build_model  # noqa: E402
from neox_dar.provenance import device_name, provenance, synchronize, write_result  # noqa: E402
from neox_dar.timing import launch_profile  # noqa: E402

DEFAULT_CONFIG = ["configs/pythia-14m.yml", "num_layers=4", "window_size=128", "seq_length=2048",
                  "max_position_embeddings=65536"]
VARIANTS = {"vanilla": [], "swa": [], "mswa": [], "aha": [], "dar": [],
            "dar-latent": ["attention_type=dar", "dar_inference_cache=latent"], "uniform": [], "linear": [],
            "dimpo": None}  # the last half of the layers DimPO-projected to d' = d_h / 4 (set in build)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_MSWA_FIG3 = ["configs/pythia-410m.yml", "num_layers=32", "seq_length=2048", "max_position_embeddings=2048"]
_FIG3_VARIANTS = "vanilla,swa@128,mswa@128,swa@512,mswa@512"
_LLAMA_1B = ["configs/llama-3.2-1b.yml", "max_position_embeddings=8192"]
PRESETS = {  # name: options (the module docstring says what each reproduces)
    "pythia-160m": {"config": ["configs/pythia-160m.yml", "window_size=128", "max_position_embeddings=65536"],
                    "variants": "vanilla,swa,mswa,aha,dar,dar-latent", "contexts": "8192,32768", "batches": "16",
                    "dtype": "bfloat16", "steps": 20, "warmup": 3},
    "mswa-fig3": {"config": _MSWA_FIG3, "variants": _FIG3_VARIANTS, "contexts": "500,1000,1500,2000",
                  "batches": "8,16,64,128,256,512", "dtype": "bfloat16", "device": "cuda"},
    "mswa-fig3-cpu": {"config": [*_MSWA_FIG3, "num_layers=4"], "variants": _FIG3_VARIANTS,
                      "contexts": "500,1000,1500,2000", "batches": "8,16", "dtype": "float32", "device": "cpu"},
    "dimpo-table4": {"config": _LLAMA_1B, "variants": "vanilla,dimpo", "contexts": "4096,8192", "batches": "1",
                     "dtype": "bfloat16", "device": "cuda"},
    "dimpo-table4-cpu": {"config": [*_LLAMA_1B, "num_layers=4"], "variants": "vanilla,dimpo",
                         "contexts": "4096,8192", "batches": "1", "dtype": "float32", "device": "cpu"},
}
DEFAULTS = {"config": DEFAULT_CONFIG, "variants": ",".join(VARIANTS), "contexts": "2048,8192,32768", "batches": "1,16",
            "dtype": "float32", "device": "cuda" if torch.cuda.is_available() else "cpu", "steps": 4, "warmup": 1}


class FixedGate(nn.Module):
    """Stands in for AHA's router: logits (B, T, H) of +20 for the open (row, head) pairs, -20 for the others."""

    def __init__(self, open_pairs: torch.Tensor):
        super().__init__()
        self.open_pairs = open_pairs  # (B, H) bool

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        logits = torch.where(self.open_pairs, 20.0, -20.0).to(a.device, torch.float32)
        return logits[:, None].expand(a.shape[0], a.shape[1], -1)


def aha_gates(layers: int, batch: int, heads: int, mu_f: float) -> torch.Tensor:
    """(L, B, H) bool: every ``round(1 / mu_f)``-th (layer, row, head) triple open."""
    every = max(1, round(1 / mu_f))
    return (torch.arange(layers * batch * heads) % every == 0).view(layers, batch, heads)


def kv_bytes_read(model, cache, gates: torch.Tensor | None, context: int) -> float:
    """Bytes one decode step reads from the caches per row: the caches' bytes, except AHA's (see the module
    docstring)."""
    B = cache.layout.batch
    total = 0.0
    for layer, (module, layer_cache) in enumerate(zip(model.attention_modules(), cache.layers)):
        if module.name != "aha":
            total += layer_cache.nbytes() / B
            continue
        ring = layer_cache.groups[0].ring
        per_column = ring.nbytes() / (B * ring.slots)  # k and v of every key/value head
        opened = gates[layer].view(B, module.num_kv_heads, -1).any(-1).sum().item()  # (row, kv head) pairs
        near = min(module.window, context)  # an open (row, kv head) pair reads the whole context, its window included
        total += per_column * near + opened * per_column / module.num_kv_heads * (context - near) / B
    return total


def build(args, variant: str, device: torch.device, dtype: torch.dtype):
    files, overrides = split_args(args.config)
    name, _, window = variant.partition("@")
    extra = VARIANTS[name] or [f"attention_type={name}"]
    if name == "dimpo":
        base = load_config(*files, overrides=overrides).model
        L = base.num_layers
        extra = [f'attention_config=[[["vanilla"], {L - L // 2}], [["dimpo"], {L // 2}]]']
        if not any(o.startswith("dimpo_d_proj=") for o in overrides):
            extra.append(f"dimpo_d_proj={max(1, base.head_dim // 4)}")
    extra += [f"window_size={window}"] if window else []
    cfg = load_config(*files, overrides=[*overrides, *extra]).model
    torch.manual_seed(0)
    model = build_model(cfg).to(device=device, dtype=dtype).eval()
    return model


CHECK_STEPS = 3
CHECK_SLACK = 3.0
"""A decode step passes :func:`check_decode` when its logits are within ``CHECK_SLACK`` times the model-dtype full
forward's distance from the float32 reference, or within :data:`CHECK_FLOOR` of it."""
CHECK_FLOOR = 1e-4


@contextlib.contextmanager
def plain_path(model):
    """``model``'s attention modules on the plain PyTorch path (``attention_impl: sdpa``) inside the block."""
    modules = model.attention_modules()
    impls = [m.impl for m in modules]
    for m in modules:
        m.impl = "sdpa"
    try:
        yield model
    finally:
        for m, impl in zip(modules, impls):
            m.impl = impl


SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH",
                 "cudnn": "CUDNN_ATTENTION"}
"""``--sdpa-backends`` names: torch's ``SDPBackend`` members."""


def sdpa_backends(names: list[str] | None):
    """A context factory: ``scaled_dot_product_attention`` limited to the backends ``names`` (keys of
    :data:`SDPA_BACKENDS`) inside it, or torch's own choice (None)."""
    if not names:
        return contextlib.nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return lambda: sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[n]) for n in names])


def check_decode(model, device: torch.device, dtype: torch.dtype, backends=contextlib.nullcontext) -> dict:
    """Whether ``model``'s decode step is right before it is timed. Two prompts of random tokens, one just beyond
    the window and one of ``max(4 w, 1,100)`` tokens (several of DAR's 512-column far chunks on a GPU; both within
    ``max_position_embeddings``), in one
    batch, prefilled, then :data:`CHECK_STEPS` tokens decoded on the model's own path (``attention_impl``, its
    dtype: what is timed). The prefill and a full forward over the same sequences run on the plain PyTorch path
    (``sdpa``, in the model's dtype: no training kernel is compiled for the check), and a float32 copy of the
    model's full forward on that path is the reference. The decode passes when its logits' distance from the
    reference (``max |x - ref| / max |ref|``) is at most ``CHECK_SLACK`` times the model-dtype forward's, or
    :data:`CHECK_FLOOR`: in bfloat16 the bar is that dtype's own rounding, and a decode step off by much less than
    its logits fails (an attention output 20% off fails at the Pythia-160M shape; 10% off is 2.3x that rounding).
    AHA's routers are replaced for the check by a fixed gate pattern, every fourth head open in every row (gates
    computed in two precisions differ near the threshold). ``backends()``: the context the decode steps run in
    (:func:`sdpa_backends`, as they are timed). -> ``{decode_rel_err, forward_rel_err, max_abs_logit, ok}``."""
    w, most = model.cfg.attention.window_size or 1, model.cfg.max_position_embeddings - CHECK_STEPS
    lengths = [min(w + 37, most), min(max(4 * w, 1100), most)]
    generator = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, model.cfg.vocab_size, (n + CHECK_STEPS,), generator=generator).to(device)
            for n in lengths]
    routers = [(m, m.router) for m in model.attention_modules() if m.name == "aha"]
    for i, (m, _) in enumerate(routers):
        m.router = FixedGate(torch.arange(m.num_heads, device=device)[None].add(i).remainder(4).eq(0))  # any batch

    def forward(m) -> torch.Tensor:  # (rows, CHECK_STEPS + 1, V): the positions the decode's logits are for
        return torch.stack([m.head(m.decoder(s[None])[0, n - 1:n + CHECK_STEPS]).float()
                            for s, n in zip(seqs, lengths)])

    try:
        with torch.inference_mode():
            with plain_path(copy.deepcopy(model).float()) as reference:
                ref = forward(reference)
            del reference
            cache = model.new_cache(lengths, CHECK_STEPS, device=device, dtype=dtype)
            with plain_path(model):
                forward_own = forward(model)
                steps = [model.prefill([s[:n] for s, n in zip(seqs, lengths)], cache)[:, None]]
            with backends():
                for t in range(CHECK_STEPS):
                    steps.append(model.decode(torch.stack([s[n + t] for s, n in zip(seqs, lengths)])[:, None],
                                              cache))
            decoded = torch.cat(steps, 1).float()
    finally:
        for m, router in routers:
            m.router = router
    top = ref.abs().max().item()
    decode_err, forward_err = ((x - ref).abs().max().item() / top for x in (decoded, forward_own))
    return {"decode_rel_err": decode_err, "forward_rel_err": forward_err, "max_abs_logit": top,
            "ok": bool(decode_err <= max(CHECK_SLACK * forward_err, CHECK_FLOOR))}


def run(args) -> dict:
    load_before = os.getloadavg()
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    rows = []
    models = {v: build(args, v, device, dtype) for v in args.variants}
    backends = sdpa_backends(args.sdpa_backends)
    checks = {}
    for v, model in models.items():
        checks[v] = check_decode(model, device, dtype, backends)
        c = checks[v]
        print(f"{v:>8} decode check against float32 (sdpa): decode {c['decode_rel_err']:.2g}, full forward "
              f"{c['forward_rel_err']:.2g} of logits up to {c['max_abs_logit']:.3g}: {'ok' if c['ok'] else 'FAILED'}",
              flush=True)
    for C in args.contexts:
        for B in args.batches:
            states = {}
            for v, model in models.items():
                gates = None
                if v == "aha":
                    mods = model.attention_modules()
                    gates = aha_gates(len(mods), B, mods[0].num_heads, args.aha_mu_f)
                    for m, g in zip(mods, gates):
                        m.router = FixedGate(g.to(device))
                new = args.warmup + args.steps + args.profile  # the profiled step is one more, at context C
                cache = model.new_cache([C - new] * B, new, device=device, dtype=dtype)
                cache.layout.advance(C - new)
                states[v] = (cache, gates, [])
            tokens = torch.zeros(B, 1, dtype=torch.long, device=device)
            profiles = {}
            with torch.inference_mode(), backends():
                for step in range(args.warmup + args.steps):
                    for v, model in models.items():
                        cache, _, times = states[v]
                        synchronize(device)
                        t0 = time.perf_counter()
                        model.decode(tokens, cache)
                        synchronize(device)
                        if step >= args.warmup:
                            times.append(time.perf_counter() - t0)
                if args.profile:
                    for v, model in models.items():
                        profiles[v] = launch_profile(lambda: model.decode(tokens, states[v][0]), device, top=8)
            for v, model in models.items():
                cache, gates, times = states[v]
                formula = sum(m.kv_cache_bytes_per_token(C, torch.finfo(dtype).bits // 8)
                              for m in model.attention_modules()) * C
                step_s = statistics.median(times)
                q = statistics.quantiles(times, n=4) if len(times) > 1 else [step_s] * 3
                rows.append({"variant": v, "context": C, "batch": B, "check_ok": checks[v]["ok"],
                             "cache_bytes_per_sequence": cache.nbytes() / B,
                             "describe_bytes_per_sequence": formula,
                             "kv_bytes_read_per_token": kv_bytes_read(model, cache, gates, C),
                             "step_ms_median": 1e3 * step_s, "step_ms_all": [1e3 * t for t in times],
                             "step_ms_spread": {"min": 1e3 * min(times), "q1": 1e3 * q[0], "q3": 1e3 * q[2],
                                                "max": 1e3 * max(times)},
                             "decode_tokens_per_s": B / step_s,
                             **({"mu_f": gates.float().mean().item()} if gates is not None else {}),
                             **({"profile": profiles[v]} if v in profiles else {})})
                print(_line(rows[-1]), flush=True)
            del states
    for r in rows:
        base = next(x for x in rows if x["variant"] == "vanilla" and x["context"] == r["context"]
                    and x["batch"] == r["batch"]) if "vanilla" in args.variants else None
        if base is not None:
            r["cache_vs_vanilla"] = r["cache_bytes_per_sequence"] / base["cache_bytes_per_sequence"]
            r["read_vs_vanilla"] = r["kv_bytes_read_per_token"] / base["kv_bytes_read_per_token"]
            r["speed_vs_vanilla"] = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
    m = next(iter(models.values())).cfg
    over_contexts = [{"variant": v, "batch": B, "contexts": args.contexts,
                      "step_ms_median": statistics.median(r["step_ms_median"] for r in rows
                                                          if r["variant"] == v and r["batch"] == B)}
                     for B in args.batches for v in args.variants] if len(args.contexts) > 1 else []
    for r in over_contexts:
        base = next((x for x in over_contexts if x["variant"] == "vanilla" and x["batch"] == r["batch"]), None)
        if base is not None:
            r["speed_vs_vanilla"] = base["step_ms_median"] / r["step_ms_median"]
    return {"provenance": provenance(), "device": device_name(device), "torch": torch.__version__,
            "dtype": args.dtype, "threads": torch.get_num_threads(),
            "model": {"config": args.config, "num_layers": m.num_layers, "hidden_size": m.hidden_size,
                      "num_attention_heads": m.num_attention_heads, "num_kv_heads": m.num_kv_heads,
                      "head_dim": m.head_dim, "window_size": m.attention.window_size,
                      "dar_d_down": next((m.cfg.attention.dar_d_down for v, m in models.items()
                                          if v.startswith("dar")), None)},
            "load_average": {"before": load_before, "after": os.getloadavg()},
            "preset": args.preset, "sdpa_backends": args.sdpa_backends, "steps": args.steps, "warmup": args.warmup,
            "aha_mu_f_target": args.aha_mu_f,
            "checks": checks, "results": rows, "over_contexts": over_contexts}


def _line(r: dict) -> str:
    spread = r["step_ms_spread"]
    return (f"{r['variant']:>8} C={r['context']:>6} B={r['batch']:>3}: cache {r['cache_bytes_per_sequence'] / 2**20:9.2f} "
            f"MiB/seq (describe {r['describe_bytes_per_sequence'] / 2**20:9.2f}), read "
            f"{r['kv_bytes_read_per_token'] / 2**20:9.2f} MiB/token, {r['decode_tokens_per_s']:9.1f} tokens/s "
            f"(step {r['step_ms_median']:.2f} ms, quartiles {spread['q1']:.2f}-{spread['q3']:.2f})")


def markdown(report: dict) -> str:
    """The results as the Markdown table of docs/inference.md."""
    lines = ["| variant | context | batch | cache MiB / seq | x vanilla | read MiB / token | x vanilla | tokens/s "
             "| x vanilla |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["results"]:
        lines.append(f"| {r['variant']}{' (mu_f %.2f)' % r['mu_f'] if 'mu_f' in r else ''} | {r['context']} | "
                     f"{r['batch']} | {r['cache_bytes_per_sequence'] / 2**20:.3f} | {r.get('cache_vs_vanilla', 1):.3f} | "
                     f"{r['kv_bytes_read_per_token'] / 2**20:.3f} | {r.get('read_vs_vanilla', 1):.3f} | "
                     f"{r['decode_tokens_per_s']:.1f} | {r.get('speed_vs_vanilla', 1):.2f} |")
    if report.get("over_contexts"):
        lines += ["", over_contexts_markdown(report)]
    return "\n".join(lines)


def over_contexts_markdown(report: dict) -> str:
    """The median step time over the contexts per variant and batch (MSWA Fig. 3's statistic), as Markdown."""
    contexts = ", ".join(map(str, report["over_contexts"][0]["contexts"]))
    lines = [f"Median step time over the contexts {contexts}:", "",
             "| variant | batch | step ms | x vanilla speed |", "|---|---:|---:|---:|"]
    lines += [f"| {r['variant']} | {r['batch']} | {r['step_ms_median']:.2f} | {r.get('speed_vs_vanilla', 1):.2f} |"
              for r in report["over_contexts"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", nargs="*", help="config files and key=value overrides (default: see above)")
    ap.add_argument("--preset", choices=list(PRESETS), help="a paper's configuration (see above)")
    ap.add_argument("--variants", help=f"comma-separated, from {','.join(VARIANTS)}, each optionally @WINDOW")
    ap.add_argument("--contexts")
    ap.add_argument("--batches")
    ap.add_argument("--steps", type=int, default=None, help="timed decode steps per point (default 4)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps before them (default 1)")
    ap.add_argument("--device")
    ap.add_argument("--dtype", choices=list(DTYPES))
    ap.add_argument("--aha-mu-f", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads (default 1 on the CPU: on a shared machine more threads measure the scheduler)")
    ap.add_argument("--profile", action="store_true",
                    help="one more step per variant and point under torch's profiler: its kernels' launches and "
                         "device microseconds against its wall microseconds (on the CPU: aten ops), in 'profile'")
    ap.add_argument("--sdpa-backends", type=lambda x: x.split(","), default=None, metavar="NAMES",
                    help=f"comma-separated, from {','.join(SDPA_BACKENDS)}: the decode steps' "
                         "scaled_dot_product_attention limited to these backends (default: torch's choice); "
                         "recorded as 'sdpa_backends'")
    ap.add_argument("--out", default=None)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    if args.sdpa_backends and not set(args.sdpa_backends) <= set(SDPA_BACKENDS):
        print(f"error: --sdpa-backends takes names from {', '.join(SDPA_BACKENDS)}, got "
              f"{','.join(args.sdpa_backends)}", file=sys.stderr)
        return 2
    for key, value in {**DEFAULTS, **PRESETS.get(args.preset, {})}.items():
        if getattr(args, key) in (None, []):  # not given (no config file or override on the command line: [])
            setattr(args, key, value)
    if args.threads or torch.device(args.device).type == "cpu":
        torch.set_num_threads(args.threads or 1)
    args.variants = args.variants.split(",")
    args.contexts = [int(c) for c in args.contexts.split(",")]
    args.batches = [int(b) for b in args.batches.split(",")]
    unknown = sorted(v for v in args.variants if v.partition("@")[0] not in VARIANTS
                     or not (v.partition("@")[2] or "1").isdigit())
    if unknown or args.steps < 1 or args.warmup < 0 or not 0 < args.aha_mu_f <= 1:
        print(f"error: unknown variants {unknown}" if unknown else "error: --steps >= 1, --warmup >= 0 and "
              "--aha-mu-f in (0, 1]", file=sys.stderr)
        return 2
    try:
        report = run(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        if not (args.sdpa_backends and "No viable backend for scaled_dot_product_attention" in str(e)):
            raise
        print(f"error: --sdpa-backends {','.join(args.sdpa_backends)}: none of these runs the decode step's "
              f"attention on {args.device} in {args.dtype}", file=sys.stderr)
        return 2
    out = args.out or ROOT / "bench" / "results" / f"decode_{torch.device(args.device).type}.json"
    write_result(report, out)
    if args.markdown:
        print(markdown(report))
    failed = [v for v, c in report["checks"].items() if not c["ok"]]
    if failed:
        print(f"error: the decode step of {', '.join(failed)} does not give the full forward's logits (the "
              f"'checks' in {out}): their times are recorded, not to be trusted", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
