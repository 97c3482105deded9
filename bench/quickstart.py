"""The README's first command, timed: ``bash scripts/quickstart.sh`` from launch to its table, by phase (issue 28,
item 6).

    python bench/quickstart.py --out bench/results/quickstart_cpu.json          # as the README runs it
    python bench/quickstart.py --steps 2 --docs 1 --no-setup --out /tmp/q.json  # one tiny step (tests)

Runs the script of this tree into a new scratch ``OUT`` (nothing reused: the tokenization, both trainings and both
evaluations happen) with ``STEPS``/``DOCS`` as given (the script's defaults otherwise) and reads its output as it
comes: the ``[quickstart] PHASE: N s`` lines give the phases (setup, tokenize, train and evaluate each variant),
its ``total`` line the script's own total, the process's wall time and CPU time (``RUSAGE_CHILDREN``) the whole.
``--no-setup`` passes ``SETUP=0`` (the packages are installed; the setup phase is then absent). The load average
before and after is recorded: a number measured beside other jobs says so.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neox_dar.provenance import provenance, write_result  # noqa: E402
from neox_dar.timing import run_child  # noqa: E402

PHASE = re.compile(r"^\[quickstart\] (?P<name>[^:]+): (?P<s>\d+) s$")


def run_quickstart(out: Path, steps: int | None, docs: int | None, setup: bool) -> dict:
    """One ``bash scripts/quickstart.sh`` into ``out``: its phases (seconds, from its own lines), wall and CPU time,
    and the table it printed."""
    env = {**os.environ, "OUT": str(out), "SETUP": "1" if setup else "0"}
    env.update({k: str(v) for k, v in (("STEPS", steps), ("DOCS", docs)) if v is not None})
    phases = {}

    def phase(text: str, _seconds: float) -> None:
        if m := PHASE.match(text.strip()):
            phases[m["name"]] = int(m["s"])
            print(text.strip(), flush=True)

    run = run_child(["bash", "scripts/quickstart.sh"], phase, cwd=ROOT, env=env)
    if run.returncode != 0:
        sys.exit(f"scripts/quickstart.sh failed (exit {run.returncode}):\n{run.tail()}")
    return {"wall_s": round(run.wall_s, 1), "cpu_s": round(run.cpu_s, 1),
            "script_total_s": phases.pop("total"), "phases_s": phases, "table": (out / "table.md").read_text()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, help="STEPS for the script (default: its own, 200)")
    p.add_argument("--docs", type=int, help="DOCS for the script (default: its own, 20)")
    p.add_argument("--no-setup", action="store_true", help="SETUP=0: skip scripts/setup.sh (packages installed)")
    p.add_argument("--out", default="bench/results/quickstart_cpu.json")
    args = p.parse_args()
    if (args.steps is not None and args.steps < 1) or (args.docs is not None and args.docs < 1):
        p.error("--steps and --docs must be >= 1")

    load_before = [round(x, 2) for x in os.getloadavg()]
    work = Path(tempfile.mkdtemp(prefix="quickstart-bench-"))
    try:
        result = run_quickstart(work / "out", args.steps, args.docs, not args.no_setup)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "provenance": provenance(),
        "device": f"CPU ({os.cpu_count()} cores)",
        "command": "bash scripts/quickstart.sh" + (" (SETUP=0)" if args.no_setup else ""),
        "steps": args.steps or 200, "docs": args.docs or 20,
        "load_average": {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]},
        "measure": "wall_s: launch to exit of the script; cpu_s: user+system CPU of it and its children; "
                   "phases_s: the script's own per-phase lines (whole seconds)",
        **result,
    }
    print(f"quickstart: {result['wall_s']} s wall, {result['cpu_s']} s CPU")
    write_result(report, ROOT / args.out if not Path(args.out).is_absolute() else args.out)


if __name__ == "__main__":
    main()
