"""Start-up of train.py: the time from launch to the first optimizer step, by phase (issue 28, item 2).

    python bench/startup.py configs/tiny.yml configs/attention/vanilla.yml --repeats 3 --nproc 1 2 \
        --baseline 0123abc --out bench/results/startup_cpu.json

Tokenizes a slice of the shipped C4 sample (not timed), then launches ``python train.py CONFIGS data_path=...
save=NEW train_iters=1 log_interval=1 eval_interval=0`` (with ``--nproc 2``: ``torchrun --standalone
--nproc_per_node 2 train.py ...``) ``--repeats`` times and reads its output as it comes: the time from the launch
to the first step's log line (``step 1/1 | loss ...``) is the start-up as a user sees it, measured outside the process
(for torchrun, torchrun's own start included); the ``start-up:`` line that train.py prints after the first
optimizer step gives the phases (rank 0, from its own process's creation). With ``--baseline REV`` the same runs
are made, alternating, with the code of git revision REV (``git archive`` into a temporary folder), so a
before/after comparison shares the machine's load; a revision before the ``start-up:`` line has no phases.
Reported: every run, and per code and process count the median launch-to-first-step time, process CPU time
(``RUSAGE_CHILDREN``: the launched processes and their children) and phases.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neox_dar.provenance import machine_cpu, provenance, write_result  # noqa: E402
from neox_dar.timing import run_child  # noqa: E402
from neox_dar.training import startup  # noqa: E402

STEP_LINE = re.compile(r"step 1/\d+ \| loss")


def launch(code: Path, nproc: int, configs: list[str], data: str, save: Path, threads: int) -> dict:
    """One train.py run from the code in ``code``: launch-to-first-step (seen in its output), total wall, CPU time."""
    train = [str(code / "train.py"), *configs, f"data_path={data}", f"save={save}", "train_iters=1", "log_interval=1",
             "eval_interval=0"]
    cmd = ([sys.executable, *train] if nproc == 1 else
           [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *train])
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(code)}
    first_step = []

    def step(text: str, seconds: float) -> None:
        if not first_step and STEP_LINE.search(text):
            first_step.append(seconds)

    run = run_child(cmd, step, cwd=code, env=env)
    if run.returncode != 0 or not first_step:
        sys.exit(f"{' '.join(cmd)} failed (exit {run.returncode}):\n{run.tail()}")
    return {"launch_to_first_step_s": round(first_step[0], 2), "process_wall_s": round(run.wall_s, 2),
            "cpu_s": round(run.cpu_s, 2),
            "startup_line": startup.parse("".join(run.lines))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="+", help="config files and key=value overrides for train.py")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nproc", type=int, nargs="+", default=[1], help="process counts (2: torchrun, gloo)")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every process")
    p.add_argument("--baseline", help="a git revision whose train.py is timed too, alternating with this tree's")
    p.add_argument("--tokens", type=int, default=100_000, help="tokens of the C4 sample to train on")
    p.add_argument("--out", default="bench/results/startup_cpu.json")
    args = p.parse_args()
    if args.repeats < 1 or min(args.nproc) < 1:
        p.error("--repeats and --nproc must be >= 1")
    load_before = [round(x, 2) for x in os.getloadavg()]

    import torch

    from data_prep.tokenize import run as tokenize

    work = Path(tempfile.mkdtemp(prefix="startup-bench-"))
    try:
        data = str(work / "c4")
        tokenize(["data/sample/c4_sample.jsonl", "--tokenizer", "data/20B_tokenizer.json", "--out", data,
                  "--max-tokens", str(args.tokens), "--workers", "1", "--no-progress"])
        codes = {"current": ROOT}
        if args.baseline:
            base = work / "baseline"
            base.mkdir()
            archive = subprocess.run(["git", "archive", args.baseline], cwd=ROOT, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
            codes = {f"baseline {args.baseline}": base, **codes}
        configs = [c if "=" in c else str((ROOT / c).resolve()) for c in args.configs]
        runs = []
        for i in range(args.repeats):
            for nproc in args.nproc:
                for name, code in codes.items():
                    r = launch(code, nproc, configs, data, work / f"run-{len(runs)}", args.threads)
                    runs.append({"code": name, "nproc": nproc, "repeat": i, **r})
                    phases = (r["startup_line"] or {}).get("phases")
                    print(f"{name}, {nproc} process(es): first step after {r['launch_to_first_step_s']} s "
                          f"({r['cpu_s']} s CPU) {phases or ''}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    summary = []
    for name in codes:
        for nproc in args.nproc:
            rows = [r for r in runs if r["code"] == name and r["nproc"] == nproc]
            lined = [r["startup_line"] for r in rows if r["startup_line"]]
            phases = ({k: round(statistics.median(x["phases"][k] for x in lined), 2) for k in lined[0]["phases"]}
                      if lined else None)
            summary.append({"code": name, "nproc": nproc,
                            "launch_to_first_step_s":
                                round(statistics.median(r["launch_to_first_step_s"] for r in rows), 2),
                            "cpu_s": round(statistics.median(r["cpu_s"] for r in rows), 2), "phases_median_s": phases})
    report = {
        "provenance": provenance(),
        "device": machine_cpu(),
        "torch": torch.__version__, "threads_per_process": args.threads, "repeats": args.repeats,
        "load_average": {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]},
        "measure": "launch_to_first_step_s: wall time from starting the command to the first step's log line "
                   "(median over repeats); cpu_s: user+system CPU of the launched processes; phases: "
                   "train.py's start-up line (rank 0, wall seconds from its process's creation)",
        "summary": summary, "runs": runs,
    }
    for row in summary:
        print(f"{row['code']}, {row['nproc']} process(es): median {row['launch_to_first_step_s']} s to the first "
              f"step, {row['cpu_s']} s CPU")
    write_result(report, ROOT / args.out if not Path(args.out).is_absolute() else args.out)


if __name__ == "__main__":
    main()
