"""What one attention layer's eager forward+backward moves through memory outside the attention kernel, by variant:
the aten operators it runs and the bytes they read and write, counted on the CPU.

    python bench/layer_traffic.py [configs/pythia-160m.yml] [--variants vanilla swa dar aha] [--seq-len 2048]
        [--top 12] [--out bench/results/layer_traffic_cpu.json]

One attention layer (``attention.*`` of the config's first layer: projections, rotary, the variant's extra modules
and the attention call, then the output projection), float16, batch 1, runs forward and backward (output gradient
all ones) under a ``TorchDispatchMode`` that records each aten operator with the bytes of its tensor inputs and
outputs; operators that only make views (``view``, ``transpose``, ``slice``, ``split``, ...) count nothing. Without
a fusing compiler each of these operators is one kernel on a GPU that reads its inputs from memory and writes its
outputs, so the sum is the eager layer's memory traffic besides the attention itself: the measure by which the
glue around the attention (rotary, straight-through rules, DAR's second key set) costs time on the GPU, where such
passes are bound by memory bandwidth. The Triton kernels run under the CPU interpreter with their launches made
no-ops (``bench/host_path.py``'s stub), so their outputs are uninitialized and their own traffic is not counted
(nor is that of vanilla's SDPA: ``sdpa`` rows show its inputs and outputs only). ``TRITON_INTERPRET=1`` is set
here before any import of the kernels. Reported per variant: the operator count, the bytes in all and in units of
one (B, T, d) half-precision tensor (so a number reads as "so many passes over the hidden states"), and the
``--top`` operators by bytes. The second of two identical forward+backward passes is counted (the first builds
cached tables).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before any import of the kernels (kernels.runtime reads it once)

import torch  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neox_dar.config import load_config  # noqa: E402
from neox_dar.model import build_model  # noqa: E402
from neox_dar.provenance import device_name, provenance, write_result  # noqa: E402

VIEWS = {"view", "_unsafe_view", "detach", "t", "transpose", "expand", "split", "chunk", "split_with_sizes", "slice",
         "unbind", "alias", "permute", "select", "as_strided", "unsqueeze", "squeeze", "reshape"}
"""Operators counted as views (no memory traffic) besides those whose schema says they return a view."""


def tensor_bytes(tree) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))


class Traffic(TorchDispatchMode):
    """Records ``(operator, bytes read, bytes written)`` for every aten call that is not a view."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not (func.is_view or name in VIEWS):
            self.ops.append((name, tensor_bytes((args, kwargs)), tensor_bytes(out)))
        return out


def layer_traffic(config: str, variant: str, seq_len: int) -> tuple[list[tuple[str, int, int]], int]:
    """The operators of one forward+backward of ``variant``'s attention layer and the bytes of one (B, T, d) tensor."""
    impl = "sdpa" if variant == "vanilla" else "triton"
    cfg = load_config(ROOT / config, ROOT / f"configs/attention/{variant}.yml",
                      overrides=["num_layers=1", f"seq_length={seq_len}", f"attention_impl={impl}"]).model
    torch.manual_seed(0)
    model = build_model(cfg).half()
    attention = model.attention_modules()[0]
    cos, sin = model.decoder.rotary_emb(seq_len, torch.float16, torch.device("cpu"))
    a = torch.randn(1, seq_len, cfg.hidden_size, dtype=torch.float16, requires_grad=True)
    for _ in range(2):
        counter = Traffic()
        with counter:
            out = attention(a, cos, sin)
            out.backward(torch.ones_like(out))
    return counter.ops, seq_len * cfg.hidden_size * 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", nargs="?", default="configs/pythia-160m.yml")
    ap.add_argument("--variants", nargs="+", default=["vanilla", "swa", "mswa", "dar", "aha"])
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "layer_traffic_cpu.json")
    args = ap.parse_args(argv)
    for v in args.variants:
        if not (ROOT / f"configs/attention/{v}.yml").is_file():
            print(f"error: no configs/attention/{v}.yml for --variants {v}", file=sys.stderr)
            return 2
    if args.seq_len < 1:
        print("error: --seq-len must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    interpreter.GridExecutor.__call__ = lambda self, *a, **k: None  # the kernels' launches: no-ops
    rows = []
    for variant in args.variants:
        ops, unit = layer_traffic(args.config, variant, args.seq_len)
        per_op: Counter = Counter()
        calls: Counter = Counter()
        for name, read, written in ops:
            per_op[name] += read + written
            calls[name] += 1
        total = sum(per_op.values())
        rows.append({"variant": variant, "ops": len(ops), "bytes": total, "hidden_state_units": round(total / unit, 2),
                     "top": [{"op": n, "calls": calls[n], "hidden_state_units": round(b / unit, 2)}
                             for n, b in per_op.most_common(args.top)]})
        print(f"{variant:8s} {len(ops):4d} operators, {total / 2**20:8.1f} MiB = {total / unit:6.1f} x (B, T, d)",
              flush=True)
    write_result({"provenance": provenance(),
                  "device": device_name(torch.device("cpu")), "torch": torch.__version__,
                  "config": args.config, "shape": {"batch": 1, "seq_len": args.seq_len, "dtype": "float16"},
                  "results": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
