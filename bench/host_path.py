"""The host's time to issue one forward+backward of each Triton attention kernel, its launches made no-ops: what a
call costs the CPU besides the launches themselves (input checks, head groups, tuned plans, allocations, autograd),
measured without a GPU.

    python bench/host_path.py [--kernels swa mswa dar aha] [--calls 600] [--out bench/results/host_path_cpu.json]

The kernels are imported under Triton's CPU interpreter (``TRITON_INTERPRET=1``, set here first) with its launch
(``GridExecutor.__call__``) replaced by a no-op, so a call runs every line of the project's host path and no kernel.
A step, as the model takes it: ``x.grad = None``; the heads split from one (B, T, n H d_h) tensor (n = 3, DAR 5);
the call; its output merged to (B, T, H d_h) and backward with a fixed gradient. B = 1, H = 12, T = 64, d_h = 64,
float16; SWA window 16, MSWA windows 4, 8, 16, 32 (three heads each), DAR window 16, AHA window 16 with 10% of the
rows routed. Reported per kernel: the median microseconds of ``--calls`` steps after 30 untimed ones, and of the
glue alone (the same step with the call replaced by ``q * 1``). On a GPU the launches add Triton's launcher's own
cost, which this does not measure: ``bench/attention.py --profile`` records the host's time there
(``host_fwd_bwd_ms``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before any import of the kernels (kernels.runtime reads it once)

import torch  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernels import aha_attention, dar_attention, mswa_attention  # noqa: E402
from neox_dar.provenance import device_name, provenance, write_result  # noqa: E402
from neox_dar.timing import host_ms  # noqa: E402

B, H, T, D = 1, 12, 64, 64
WINDOW = 16
MSWA_WINDOWS = [4] * 3 + [8] * 3 + [16] * 3 + [32] * 3


def calls(gate: torch.Tensor) -> dict:
    """Each kernel's call on the split heads, and the glue's stand-in."""
    return {"swa": lambda q, k, v: mswa_attention(q, k, v, WINDOW),
            "mswa": lambda q, k, v: mswa_attention(q, k, v, MSWA_WINDOWS),
            "dar": lambda q, k, v, kg, vg: dar_attention(q, k, v, kg, vg, WINDOW),
            "aha": lambda q, k, v: aha_attention(q, k, v, gate, WINDOW),
            "glue": lambda q, k, v: q * 1}


def step_us(fn, parts: int, repeats: int) -> float:
    """Median microseconds of one step (module docstring) through ``fn`` over ``repeats`` after 30 untimed."""
    x = torch.randn(B, T, parts * H * D, dtype=torch.float16, requires_grad=True)
    g = torch.randn(B, T, H * D, dtype=torch.float16)

    def step():
        x.grad = None
        heads = x.view(B, T, parts, H, D).permute(2, 0, 3, 1, 4)
        fn(*heads).transpose(1, 2).reshape(B, T, H * D).backward(g)

    for _ in range(30):
        step()
    return 1e3 * host_ms(step, torch.device("cpu"), calls=repeats)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", nargs="+", default=["swa", "mswa", "dar", "aha"], choices=["swa", "mswa", "dar", "aha"])
    ap.add_argument("--calls", type=int, default=600, help="timed steps per kernel (default 600)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "host_path_cpu.json")
    args = ap.parse_args(argv)
    if args.calls < 1:
        print("error: --calls must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    torch.manual_seed(0)
    interpreter.GridExecutor.__call__ = lambda self, *a, **k: None  # every launch a no-op: the host path alone
    fns = calls(torch.rand(B, H, T) < 0.1)
    glue = step_us(fns["glue"], 3, args.calls)
    rows = []
    for name in args.kernels:
        us = step_us(fns[name], 5 if name == "dar" else 3, args.calls)
        rows.append({"kernel": name, "host_us": round(us, 1), "beyond_glue_us": round(us - glue, 1)})
        print(f"{name:5s} {us:7.1f} us a forward+backward on the host ({us - glue:.1f} beyond the glue's {glue:.1f})",
              flush=True)
    write_result({"provenance": provenance(), "device": device_name(torch.device("cpu")), "torch": torch.__version__,
                  "shape": {"batch": B, "heads": H, "seq_len": T, "head_dim": D, "dtype": "float16"},
                  "calls": args.calls, "glue_us": round(glue, 1), "results": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
