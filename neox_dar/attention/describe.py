"""What a config's attention costs: windows, extra parameters, FLOPs per token, KV cache at inference.

    python -m neox_dar.attention.describe configs/pythia-70m.yml configs/attention/mswa.yml
    python -m neox_dar.attention.describe configs/pythia-160m.yml configs/attention/dar.yml dar_d_down=96 \\
        --context 4096 --dtype fp32

KV cache per layer, in numbers per cached token, averaged over a context of ``C`` tokens (``--context``,
default ``seq_length``): vanilla ``2d``; SWA ``2d min(w, C) / C`` (only the last ``w`` tokens are kept);
MSWA ``sum_h 2 d_h min(w_h, C) / C``; AHA ``2d`` (any token may route to full attention, so every key is
kept); DAR ``d_down + 2d min(w, C) / C`` (SPEC / DAR paper Sec. 5: every token keeps ``dar_down(h)``, the last
``w`` also ``k_loc, v_loc``; ``k_glob, v_glob`` are recomputed from ``dar_down(h)`` on demand); uniform
``d_down``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

import torch

from ..config import Config, ConfigError, load_config, split_args
from ..model import build_model, count_parameters, flops_per_token
from .mswa import mswa_window_table
from .windowed import mean_attended_keys

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def layer_windows(cfg: Config) -> list[list[int | None]]:
    """Window per layer and head (None = full causal); AHA lists its local window (the full path is extra)."""
    L, H = cfg.num_layers, cfg.num_attention_heads
    if cfg.attention_type == "mswa":
        return mswa_window_table(cfg)
    if cfg.attention_type in ("swa", "aha", "dar"):
        return [[cfg.window_size] * H for _ in range(L)]
    if cfg.attention_type == "uniform":
        return [[0] * H for _ in range(L)]
    return [[None] * H for _ in range(L)]


def kv_cache_numbers_per_token(cfg: Config, context: int) -> list[float]:
    """Cached numbers per token for each layer, averaged over a context of ``context`` tokens (see module doc)."""
    d, d_h = cfg.hidden_size, cfg.head_dim
    out = []
    for row in layer_windows(cfg):
        t = cfg.attention_type
        if t in ("vanilla", "aha"):
            out.append(2.0 * d)
        elif t in ("dar", "uniform"):
            out.append(cfg.d_down + 2.0 * d * min(row[0], context) / context)
        else:  # swa, mswa
            out.append(sum(2.0 * d_h * min(w, context) / context for w in row))
    return out


def describe(cfg: Config, context: int | None = None, dtype: str = "bf16") -> str:
    """The report printed by the command line, as text."""
    C = context or cfg.seq_length
    L, d, H = cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads
    with torch.device("meta"):
        model = build_model(cfg)
        vanilla = build_model(dataclasses.replace(cfg, attention_type="vanilla"))
    lines = [f"attention_type: {cfg.attention_type} (attention_impl: {cfg.attention_impl}); {L} layers, d={d}, "
             f"H={H}, d_h={cfg.head_dim}, seq_length={cfg.seq_length}"]
    t = cfg.attention_type
    if t in ("dar", "uniform"):
        lines.append(f"window w={0 if t == 'uniform' else cfg.window_size} (keys with i - j < w use full width), "
                     f"d_down={cfg.d_down}")
    elif t in ("swa", "aha"):
        router = f"; router threshold {cfg.aha_threshold}, L1 coefficient {cfg.aha_l1_coef}" if t == "aha" else ""
        lines.append(f"window w={cfg.window_size} (keys j with i - j < w, itself included){router}")
    elif t == "mswa":
        source = "explicit mswa_windows" if cfg.mswa_windows is not None else f"rule, variant '{cfg.mswa_variant}'"
        lines.append(f"windows per layer (rows) and head (columns), base w={cfg.window_size} ({source}):")
        for layer, row in enumerate(mswa_window_table(cfg)):
            lines.append(f"  layer {layer:>2}: " + " ".join(f"{w:>5}" for w in row))

    extra = count_parameters(model)["total"] - count_parameters(vanilla)["total"]
    n_vanilla = count_parameters(vanilla)["non_embedding"]
    lines.append(f"extra parameters: {extra:,} ({extra // L:,} per layer; {100.0 * extra / n_vanilla:.2f}% of "
                 f"vanilla's {n_vanilla:,} non-embedding)")

    f, fv = flops_per_token(model, C), flops_per_token(vanilla, C)
    mods = model.attention_modules()
    lines.append(f"training FLOPs per token at T={C} (forward + backward; forward is 1/3):")
    lines.append(f"  attention (scores + weighted sum + variant extras): {f['attention']:.4g} "
                 f"(vanilla {fv['attention']:.4g}, {100.0 * f['attention'] / fv['attention']:.1f}%)")
    per_layer_flops = [(m.attended_keys(C), 6 * 2 * d * m.attended_keys(C), m.extra_flops_per_token()) for m in mods]
    shown = per_layer_flops if len(set(per_layer_flops)) > 1 else per_layer_flops[:1]
    for layer, (keys, scores, extra_flops) in enumerate(shown):
        name = f"layer {layer:>2}" if len(shown) > 1 else "each layer"
        lines.append(f"    {name}: {keys:.1f} keys per query, {scores:.4g} FLOPs for scores and sums"
                     + (f" + {extra_flops:.4g} for the second key/value pass" if extra_flops else ""))
    if t == "aha":
        local = L * 6 * 2 * d * mean_attended_keys(C, cfg.window_size)
        lines.append(f"    AHA is counted as if every gate were open (upper bound); with every gate closed it is "
                     f"{local:.4g}; with a full-attention share mu_f: mu_f * upper + (1 - mu_f) * lower")
    lines.append(f"  6N (matrix products of the weights): {f['params']:.4g}; total {f['total']:.4g} "
                 f"(vanilla {fv['total']:.4g})")

    nbytes = DTYPE_BYTES[dtype]
    per_layer = kv_cache_numbers_per_token(cfg, C)
    per_token = sum(per_layer) * nbytes
    vanilla_token = 2 * d * L * nbytes
    lines.append(f"KV cache at inference, context {C} tokens, {dtype}: {per_token:,.1f} bytes per token "
                 f"({100.0 * per_token / vanilla_token:.1f}% of vanilla's {vanilla_token:,}); "
                 f"{per_token * C / 2**20:,.2f} MiB per sequence")
    if t in ("dar", "uniform"):
        lines.append(f"  per layer: d_down={cfg.d_down} numbers for every token"
                     + (f" + 2d={2 * d} for the last {min(cfg.window_size, C)}" if t == "dar" else ""))
    if t == "aha":
        lines.append("  (every key is kept: any token may route a head to full attention)")
    return "\n".join(lines)


def main(argv: typing.Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context", type=int, default=None, help="context length for FLOPs and KV cache")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bf16", help="KV cache dtype")
    args, rest = parser.parse_known_args(argv)
    paths, overrides = split_args(rest)
    if not paths:
        parser.error("give at least one CONFIG.yml")
    if args.context is not None and args.context < 1:
        parser.error("--context must be >= 1")
    try:
        cfg = load_config(*paths, overrides=overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    print(describe(cfg, args.context, args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
