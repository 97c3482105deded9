"""What a config's attention costs: windows, extra parameters, FLOPs per token, KV cache at inference.

    python -m neox_dar.describe configs/pythia-70m.yml configs/attention/mswa.yml
    python -m neox_dar.describe configs/pythia-160m.yml configs/attention/dar.yml dar_d_down=96 --context 4096 \\
        --dtype fp32

(``python -m neox_dar.attention.describe`` is the same command.) Every figure comes from the variant's own module
(:class:`neox_dar.attention.Attention`): its description lines, each layer's windows, attended keys, extra FLOPs
and KV-cache numbers per token at a context of ``C`` tokens (``--context``, default ``seq_length``). A model with
per-layer types (``attention_config``, ``hybrid``) lists its layer pattern, each variant's lines, and its FLOPs and
cache per layer, each layer labelled with its variant.
"""

from __future__ import annotations

import argparse
import sys
import typing

from .config import Config, split_args
from .model import build_meta_model, count_parameters, flops_per_token
from .training.checks import load_checked
from .variants import variant
from .notices import one_line_notices

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def kv_cache_bytes_per_token(cfg: Config, context: int, dtype: str) -> list[float]:
    """Cached bytes per token for each layer of a model in ``dtype`` (a key of :data:`DTYPE_BYTES`), averaged over a
    context of ``context`` tokens."""
    return [m.kv_cache_bytes_per_token(context, DTYPE_BYTES[dtype])
            for m in build_meta_model(cfg.model).attention_modules()]


def _first_of_each_variant(modules: list) -> list:
    """The first module of each distinct variant, in layer order (for the notes each variant adds once)."""
    first: dict = {}
    for m in modules:
        first.setdefault(type(m), m)
    return list(first.values())


def describe(cfg: Config, context: int | None = None, dtype: str = "bf16") -> str:
    """The report printed by the command line, as text."""
    C = context or cfg.model.seq_length
    m = cfg.model
    L, d, H = m.num_layers, m.hidden_size, m.num_attention_heads
    model = build_meta_model(m)
    vanilla = build_meta_model(cfg.with_attention_type("vanilla").model)
    mods, vanilla_mods = model.attention_modules(), vanilla.attention_modules()
    mixed = len({type(a) for a in mods}) > 1
    lines = [f"attention_type: {m.attention.attention_type} (attention_impl: {m.attention.attention_impl}); "
             f"{L} layers, d={d}, H={H}, d_h={m.head_dim}, seq_length={m.seq_length}"]
    lines += variant(m.attention.attention_type).describe(m)

    def layer_name(layer: int) -> str:
        return f"layer {layer:>2}" + (f" ({mods[layer].name})" if mixed else "")

    extra = count_parameters(model)["total"] - count_parameters(vanilla)["total"]
    n_vanilla = count_parameters(vanilla)["non_embedding"]
    per_layer = {a.name: sum(p.numel() for p in a.parameters()) - sum(p.numel() for p in v.parameters())
                 for a, v in zip(mods, vanilla_mods)}
    each = (f"{next(iter(per_layer.values())):,} per layer" if len(per_layer) == 1 else
            "per layer: " + ", ".join(f"{name} {n:,}" for name, n in per_layer.items()))
    lines.append(f"extra parameters: {extra:,} ({each}; {100.0 * extra / n_vanilla:.2f}% of vanilla's "
                 f"{n_vanilla:,} non-embedding)")

    f, fv = flops_per_token(model, C), flops_per_token(vanilla, C)
    lines.append(f"training FLOPs per token at T={C} (forward + backward; forward is 1/3):")
    lines.append(f"  attention (scores + weighted sum + variant extras): {f['attention']:.4g} "
                 f"(vanilla {fv['attention']:.4g}, {100.0 * f['attention'] / fv['attention']:.1f}%)")
    width = H * m.head_dim  # the attention's width (d unless head_dim is set apart from d / H), as flops_per_token
    costs = [(a.attended_keys(C), 6 * 2 * width * a.attended_keys(C), a.extra_flops_per_token()) for a in mods]
    shown = range(L) if len(set(costs)) > 1 else range(1)
    for layer in shown:
        keys, scores, extra_flops = costs[layer]
        name = layer_name(layer) if len(shown) > 1 else "each layer"
        if keys == 0:
            lines.append(f"    {name}: no softmax over keys; {extra_flops:.4g} FLOPs of the variant's own products")
            continue
        lines.append(f"    {name}: {keys:.1f} keys per query, {scores:.4g} FLOPs for scores and sums"
                     + (f" + {extra_flops:.4g} for the variant's extra products" if extra_flops else ""))
    lines += [f"    {note}" for a in _first_of_each_variant(mods) for note in a.flop_notes(C)]
    lines.append(f"  6N (matrix products of the weights): {f['params']:.4g}; total {f['total']:.4g} "
                 f"(vanilla {fv['total']:.4g})")

    nbytes = DTYPE_BYTES[dtype]
    cached = [a.kv_cache_bytes_per_token(C, nbytes) for a in mods]
    per_token, vanilla_token = sum(cached), sum(a.kv_cache_bytes_per_token(C, nbytes) for a in vanilla_mods)
    lines.append(f"KV cache at inference, context {C} tokens, {dtype}: {per_token:,.1f} bytes per token "
                 f"({100.0 * per_token / vanilla_token:.1f}% of vanilla's {vanilla_token:,.0f}); "
                 f"{per_token * C / 2**20:,.2f} MiB per sequence")
    if mixed:
        lines += [f"    {layer_name(layer)}: {cached[layer]:,.1f} bytes per token" for layer in range(L)]
    lines += [f"  {note}" for a in _first_of_each_variant(mods) for note in a.cache_notes(C)]
    return "\n".join(lines)


def main(argv: typing.Sequence[str] | None = None) -> int:
    one_line_notices()  # this package's warnings as `warning: ...`, one line
    parser = argparse.ArgumentParser(prog="python -m neox_dar.describe", description=__doc__.split("\n")[0])
    parser.add_argument("--context", type=int, default=None, help="context length for FLOPs and KV cache")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bf16", help="KV cache dtype")
    args, rest = parser.parse_known_args(argv)
    paths, overrides = split_args(rest)
    if not paths:
        parser.error("give at least one CONFIG.yml")
    if args.context is not None and args.context < 1:
        parser.error("--context must be >= 1")
    cfg = load_checked(paths, overrides)
    if cfg is None:
        return 2
    print(describe(cfg, args.context, args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
