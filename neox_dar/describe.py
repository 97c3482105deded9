"""What a config's attention costs: windows, extra parameters, FLOPs per token, KV cache at inference.

    python -m neox_dar.describe configs/pythia-70m.yml configs/attention/mswa.yml
    python -m neox_dar.describe configs/pythia-160m.yml configs/attention/dar.yml dar_d_down=96 --context 4096 \\
        --dtype fp32

(``python -m neox_dar.attention.describe`` is the same command.) Every figure comes from the variant's own module
(:class:`neox_dar.attention.Attention`): its description lines, each layer's windows, attended keys, extra FLOPs
and KV-cache numbers per token at a context of ``C`` tokens (``--context``, default ``seq_length``).
"""

from __future__ import annotations

import argparse
import sys
import typing

import torch

from .attention import variant
from .config import Config, ConfigError, load_config, split_args
from .model import build_model, count_parameters, flops_per_token

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def kv_cache_numbers_per_token(cfg: Config, context: int) -> list[float]:
    """Cached numbers per token for each layer, averaged over a context of ``context`` tokens."""
    with torch.device("meta"):
        model = build_model(cfg.model)
    return [m.kv_cache_per_token(context) for m in model.attention_modules()]


def describe(cfg: Config, context: int | None = None, dtype: str = "bf16") -> str:
    """The report printed by the command line, as text."""
    C = context or cfg.model.seq_length
    m = cfg.model
    L, d, H = m.num_layers, m.hidden_size, m.num_attention_heads
    with torch.device("meta"):
        model = build_model(m)
        vanilla = build_model(cfg.with_attention_type("vanilla").model)
    lines = [f"attention_type: {m.attention.attention_type} (attention_impl: {m.attention.attention_impl}); "
             f"{L} layers, d={d}, H={H}, d_h={m.head_dim}, seq_length={m.seq_length}"]
    lines += variant(m.attention.attention_type).describe(m)

    extra = count_parameters(model)["total"] - count_parameters(vanilla)["total"]
    n_vanilla = count_parameters(vanilla)["non_embedding"]
    lines.append(f"extra parameters: {extra:,} ({extra // L:,} per layer; {100.0 * extra / n_vanilla:.2f}% of "
                 f"vanilla's {n_vanilla:,} non-embedding)")

    f, fv = flops_per_token(model, C), flops_per_token(vanilla, C)
    mods = model.attention_modules()
    lines.append(f"training FLOPs per token at T={C} (forward + backward; forward is 1/3):")
    lines.append(f"  attention (scores + weighted sum + variant extras): {f['attention']:.4g} "
                 f"(vanilla {fv['attention']:.4g}, {100.0 * f['attention'] / fv['attention']:.1f}%)")
    per_layer = [(a.attended_keys(C), 6 * 2 * d * a.attended_keys(C), a.extra_flops_per_token()) for a in mods]
    shown = per_layer if len(set(per_layer)) > 1 else per_layer[:1]
    for layer, (keys, scores, extra_flops) in enumerate(shown):
        name = f"layer {layer:>2}" if len(shown) > 1 else "each layer"
        lines.append(f"    {name}: {keys:.1f} keys per query, {scores:.4g} FLOPs for scores and sums"
                     + (f" + {extra_flops:.4g} for the variant's extra products" if extra_flops else ""))
    lines += [f"    {note}" for note in mods[0].flop_notes(C)]
    lines.append(f"  6N (matrix products of the weights): {f['params']:.4g}; total {f['total']:.4g} "
                 f"(vanilla {fv['total']:.4g})")

    nbytes = DTYPE_BYTES[dtype]
    per_token = sum(a.kv_cache_per_token(C) for a in mods) * nbytes
    vanilla_token = sum(a.kv_cache_per_token(C) for a in vanilla.attention_modules()) * nbytes
    lines.append(f"KV cache at inference, context {C} tokens, {dtype}: {per_token:,.1f} bytes per token "
                 f"({100.0 * per_token / vanilla_token:.1f}% of vanilla's {vanilla_token:,.0f}); "
                 f"{per_token * C / 2**20:,.2f} MiB per sequence")
    lines += [f"  {note}" for note in mods[0].cache_notes(C)]
    return "\n".join(lines)


def main(argv: typing.Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neox_dar.describe", description=__doc__.split("\n")[0])
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
