"""Training throughput of a config on the device present: tokens/s, TFLOP/s and MFU through train.py's
DeepSpeed engine, and (``--compare-hf``, the default on CPU) the time per training step of our model against
``transformers.GPTNeoXForCausalLM`` of the same shape and weights.

    python bench/train_throughput.py configs/tiny.yml configs/attention/vanilla.yml [key=value ...]
        [--steps 10] [--warmup 3] [--compare-hf | --no-compare-hf] [--out bench/results/x.json]

Engine part: one process (a 1-rank group), ``train_batch_size`` of the config (micro x grad-accum), random
tokens, ``--steps`` optimizer steps timed after ``--warmup`` (CUDA synchronised). MFU needs a peak FLOP/s:
detected GPU or ``peak_flops=...``.

Comparison part: plain PyTorch training steps (forward, float32 cross-entropy, backward, AdamW step) on one
micro-batch, both models in the config's precision (fp32 on CPU), identical weights; the two models' steps
alternate so both see the same machine load; the median step time of each is reported (on CPU the process's
CPU time, robust to other processes on a shared machine; on GPU synchronised wall time).

On CUDA the engine part also records ``attention_kernels``: the attention kernels one more step launched
(profiler names; for ``attention_impl: sdpa`` they say which SDPA backend ran).

Writes JSON (device, driver, CUDA/torch/Triton versions, git commit, command, UTC date, every number) to ``--out``
(default ``bench/results/train_throughput_<device>.json``) and prints a summary.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neox_dar.config import Config, ConfigError, load_config, split_args  # noqa: E402
from neox_dar.model import build_model  # noqa: E402
from neox_dar.provenance import device_name, device_report, provenance, synchronize, write_result  # noqa: E402
from neox_dar.training.metrics import peak_flops  # noqa: E402
from neox_dar.variants.layers import layer_types  # noqa: E402


def route_fraction(model, tokens: torch.Tensor, fraction: float) -> None:
    """Open about ``fraction`` of AHA's gates, as the GPU targets ask (AHA at 10% routed), where a zero-initialised
    router opens none: each AHA layer's threshold becomes the ``1 - fraction`` quantile of its scores ``s`` on
    ``tokens`` (its router, randomly initialised: ``aha_router_init: random``, trains as in any run)."""
    layers = [m for m in model.attention_modules() if m.name == "aha"]
    scores = {}
    hooks = [m.router.register_forward_hook(lambda mod, inp, out, m=m: scores.__setitem__(m, out.detach()))
             for m in layers]
    with torch.no_grad():
        model(tokens)
    for hook in hooks:
        hook.remove()
    for m in layers:
        s = torch.sigmoid(scores[m].float()).flatten()
        m.threshold = torch.quantile(s[torch.randperm(s.numel(), device=s.device)[:1 << 24]], 1 - fraction).item()


def aha_share(model, target: float) -> dict:
    """``{"target", "measured"}``: the last micro-batch's share of open gates over every AHA layer and head."""
    return {"target": target, "measured": torch.stack(
        [m.stats["mu_f"] for m in model.attention_modules() if m.name == "aha"]).float().mean().item()}


def add_aha_mu_f(parser: argparse.ArgumentParser) -> None:
    """The ``--aha-mu-f F`` option of the training benchmarks (:func:`bench_config` applies it)."""
    parser.add_argument("--aha-mu-f", type=float, default=None, metavar="F",
                        help="AHA: open about this share of the gates (a random router, each layer's threshold at "
                             "the 1 - F quantile of its scores on the first micro-batch; the GPU targets' AHA is at "
                             "0.1); the result records the share measured")


def bench_config(args: argparse.Namespace) -> Config:
    """The config of a training benchmark's ``config`` arguments (files and key=value overrides), with
    ``aha_router_init=random`` under ``--aha-mu-f`` (a zero router scores every row 1/2); a bad config or share is a
    one-line error (exit 2). With ``--aha-mu-f`` the config is read twice, first without that key, so a model
    without AHA layers gets the one-line error and not the key's has-no-effect warning before it."""
    paths, overrides = split_args(args.config)
    try:
        cfg = load_config(*paths, overrides=overrides)
        if args.aha_mu_f is None:
            return cfg
        if not (0 < args.aha_mu_f < 1 and "aha" in layer_types(cfg.model)):
            print("error: --aha-mu-f needs a share in (0, 1) and a model with AHA layers", file=sys.stderr)
            raise SystemExit(2)
        return load_config(*paths, overrides=[*overrides, "aha_router_init=random"])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def engine_step(cfg: Config, aha_mu_f: float | None = None):
    """train.py's DeepSpeed engine (1 rank) and one optimizer step of it on fixed random tokens: returns
    ``(info, step, grad_accum, micro, flops, model)``, ``step()`` running ``grad_accum`` micro-batches of ``micro``
    and returning the first one's loss (a detached device tensor: no synchronisation) (``aha_mu_f``:
    :func:`route_fraction` on the first micro-batch)."""
    from neox_dar.training.batches import micro_batch_loss
    from neox_dar.training.distributed import init_distributed
    from neox_dar.training.engine import build_engine

    info = init_distributed()
    engine, model, flops = build_engine(cfg, info)
    grad_accum = engine.gradient_accumulation_steps()
    micro = cfg.training.train_micro_batch_size_per_gpu
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.model.vocab_size, (grad_accum, micro, cfg.model.seq_length + 1), generator=gen).to(info.device)
    if aha_mu_f is not None:
        route_fraction(model, tokens[0, :, :-1], aha_mu_f)

    def step() -> torch.Tensor:
        first = None
        for m in range(grad_accum):
            x, y = tokens[m, :, :-1], tokens[m, :, 1:]
            loss = micro_batch_loss(engine, x, y)
            first = loss.detach() if first is None else first
            engine.backward(loss + model.aux_loss().float())
            engine.step()
        return first

    return info, step, grad_accum, micro, flops, model


def engine_throughput(cfg: Config, steps: int, warmup: int, aha_mu_f: float | None = None) -> dict:
    """tokens/s, TFLOP/s and MFU of ``steps`` optimizer steps of train.py's DeepSpeed engine (1 rank); with
    ``aha_mu_f``, AHA's share of open gates over the timed steps (``aha_mu_f_measured``). ``loss_first_step`` and
    ``loss_last_step``: the first micro-batch's loss at the first step (warm-up included) and at the last; the same
    model, seed and tokens give the same first loss with and without torch_compile, to its precision."""
    info, step, grad_accum, micro, flops, model = engine_step(cfg, aha_mu_f)

    losses = [step() for _ in range(warmup)]
    synchronize(info.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        losses.append(step())
    synchronize(info.device)
    seconds = (time.perf_counter() - t0) / steps
    tokens_per_sec = grad_accum * micro * cfg.model.seq_length / seconds
    peak = peak_flops(cfg.run.peak_flops, info.device, cfg.training.dtype)
    out = {"step_time_s": seconds, "tokens_per_sec": tokens_per_sec, "global_batch": grad_accum * micro,
           "flops_per_token": flops, "tflops_per_device": flops * tokens_per_sec / 1e12, "peak_flops": peak,
           "mfu": flops * tokens_per_sec / peak if peak else None,
           "loss_first_step": losses[0].item(), "loss_last_step": losses[-1].item()}
    if aha_mu_f is not None:
        out["aha_mu_f"] = aha_share(model, aha_mu_f)
    if info.device.type == "cuda":
        out["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(info.device) / 1e9
        out["attention_kernels"] = attention_kernels(step)
    return out


# Attention kernels by name: SDPA's (cuDNN's, FlashAttention's, the memory-efficient one), flex_attention's, and the
# project's Triton kernels (kernels/: the banded forward and backward, dq, delta, AHA's routed and decode's range
# kernels) or, on CPU, their autograd functions (MSWAFunction, its backward node) and custom ops (under
# torch.compile: neox_dar::mswa_forward, ...)
ATTENTION_KERNEL = re.compile(r"flash|fmha|cudnn|attention|sdpa|flex|_attn|_fwd_kernel|_bwd_kernel|_dq_kernel|"
                              r"_delta_kernel|_routed_|_range_|(dar|mswa|aha)(_forward|_backward|function)", re.I)


def attention_kernels(step) -> list[str]:
    """The attention kernels one more ``step()`` launches on CUDA, by profiler name: which SDPA backend ran
    (cuDNN's, FlashAttention's, the memory-efficient one) or which Triton kernels (names cut at 120 characters)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sorted({e.name[:120] for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA and ATTENTION_KERNEL.search(e.name)})


def compare_with_hf(cfg: Config, device: torch.device, steps: int, warmup: int) -> dict:
    """Median time per plain-PyTorch training step: ours vs ``GPTNeoXForCausalLM`` (same shape and weights)."""
    from transformers import GPTNeoXForCausalLM

    from neox_dar.hf import to_hf

    if cfg.model.attention.attention_type != "vanilla":
        raise SystemExit("--compare-hf needs attention_type: vanilla (Hugging Face has only full attention)")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.training.dtype]
    torch.manual_seed(cfg.training.seed)
    ours = build_model(cfg.model).to(device=device, dtype=dtype)
    with tempfile.TemporaryDirectory() as tmp:  # through the project's converter: same weights, HF names
        to_hf(ours, cfg.model, tmp)
        hf = GPTNeoXForCausalLM.from_pretrained(tmp, attn_implementation="sdpa", dtype=dtype).to(device)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.model.vocab_size, (cfg.training.train_micro_batch_size_per_gpu, cfg.model.seq_length + 1),
                           generator=gen).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    # CPU: process CPU time (all threads), which other processes' load on a shared machine barely disturbs;
    # CUDA: wall time around synchronised steps
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    runs = {}
    for name, model, logits_of in (("ours", ours, lambda m: m(x)), ("hf", hf, lambda m: m(input_ids=x).logits)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if device.type == "cuda" else {}))

        def step(model=model, opt=opt, logits_of=logits_of) -> float:
            synchronize(device)
            t0 = clock()
            logits = logits_of(model)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            synchronize(device)
            return clock() - t0

        runs[name] = step
    times = {"ours": [], "hf": []}
    for i in range(warmup + steps):
        for name in (("ours", "hf") if i % 2 == 0 else ("hf", "ours")):
            t = runs[name]()
            if i >= warmup:
                times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"ours_step_s": med["ours"], "hf_step_s": med["hf"], "hf_over_ours": med["hf"] / med["ours"],
            "clock": "process CPU time" if device.type == "cpu" else "wall time",
            "batch": cfg.training.train_micro_batch_size_per_gpu, "seq_length": cfg.model.seq_length, "hf_attention": "sdpa",
            "ours_attention_impl": ours.attention_modules()[0].resolved_impl(device),
            "all_step_s": times}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="+", help="YAML files and key=value overrides, as for train.py")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compare-hf", action=argparse.BooleanOptionalAction, default=None,
                   help="time ours vs transformers.GPTNeoXForCausalLM (default: on CPU only)")
    add_aha_mu_f(p)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    cfg = bench_config(args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    compare = args.compare_hf if args.compare_hf is not None else device.type == "cpu"

    result = {**provenance(["bench/train_throughput.py", *(sys.argv[1:] if argv is None else argv)]),
              **device_report(), "device": device_name(device),
              "precision": cfg.training.dtype, "config": {"num_layers": cfg.model.num_layers, "hidden_size": cfg.model.hidden_size,
                                                       "num_attention_heads": cfg.model.num_attention_heads,
                                                       "seq_length": cfg.model.seq_length,
                                                       "attention_type": cfg.model.attention.attention_type,
                                                       "attention_impl": cfg.model.attention.attention_impl,
                                                       "torch_compile": cfg.training.torch_compile,
                                                       "zero_stage": cfg.training.zero_optimization.stage}}
    result["engine"] = engine_throughput(cfg, args.steps, args.warmup, args.aha_mu_f)
    e = result["engine"]
    mfu = f"{100 * e['mfu']:.1f}%" if e["mfu"] is not None else "n/a (no peak FLOP/s for this device; set peak_flops)"
    print(f"{result['device']}: {e['tokens_per_sec']:,.0f} tokens/s, {e['tflops_per_device']:.3g} TFLOP/s, MFU {mfu}, "
          f"{e['step_time_s'] * 1e3:.1f} ms per step of {e['global_batch']} x {cfg.model.seq_length} tokens, loss "
          f"{e['loss_first_step']:.4f} at the first step, {e['loss_last_step']:.4f} at the last")
    if compare:
        result["vs_hf"] = c = compare_with_hf(cfg, device, args.steps, args.warmup)
        print(f"training step, batch {c['batch']} x {c['seq_length']}: ours {c['ours_step_s'] * 1e3:.1f} ms "
              f"({c['ours_attention_impl']}), transformers GPTNeoXForCausalLM {c['hf_step_s'] * 1e3:.1f} ms "
              f"(sdpa): HF/ours = {c['hf_over_ours']:.3f} ({c['clock']}, median)")
    tag = "cuda" if device.type == "cuda" else "cpu"
    out = args.out or ROOT / "bench" / "results" / f"train_throughput_{tag}.json"
    write_result(result, out)
    if not all(math.isfinite(e[k]) for k in ("loss_first_step", "loss_last_step")):
        print(f"error: the loss is not finite ({e['loss_first_step']}, {e['loss_last_step']}; {out}): the "
              "throughput of a step that computes nothing useful", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
