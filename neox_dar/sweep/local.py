"""Running a sweep's runs one after another on this machine (`run --local`).

SIGTERM or Ctrl-C (SIGINT) to `run --local` is handed to the running command's processes as SIGTERM (a trainer
writes a checkpoint and exits 3; an evaluation just stops); the sweep then stops too, exit code 3: run the same
command again to continue. The commands run in their own session, so a terminal's Ctrl-C reaches them only this
way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..rundir import CONFIG
from .rundir import needs_eval, run_state
from .slurm import TRAIN_SCRIPT, eval_args, extra_corpora


EXIT_STOPPED = 3  # the trainer's "stopped at a checkpoint"
_stop: list[int] = []  # the stop signals received while a child ran
ECHO_SECONDS = 0.2  # how often the command's new output is echoed from its log


def _run_logged(cmd: list[str], log: Path) -> int:
    """Run ``cmd`` here with its output appended to ``log``, echoed from there; a stop signal meanwhile is handed to
    it as SIGTERM, and the exit code is then :data:`EXIT_STOPPED`. The command writes to the file itself, in its own
    session, so it outlives this process (a lost terminal, SIGHUP, SIGKILL): it trains on and checkpoints as
    configured instead of dying on a broken pipe at its next line."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        start = out.tell()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def forward(signum, frame):
        _stop.append(signum)
        print(f"[sweep] {signal.Signals(signum).name}: stopping (SIGTERM to the running command's processes; a "
              "trainer checkpoints first)", flush=True)
        os.killpg(proc.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with open(log, errors="replace") as echo:
            echo.seek(start)
            while True:
                done = proc.poll() is not None
                sys.stdout.write(echo.read())
                sys.stdout.flush()
                if done:
                    break
                time.sleep(ECHO_SECONDS)
        rc = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return EXIT_STOPPED if _stop else rc


def launch(nproc: int, target: list[str], python: str = sys.executable) -> list[str]:
    """``python TARGET...`` (one process) or torchrun --standalone with ``nproc`` processes; ``target`` is a script
    and its arguments, or ``-m MODULE`` and its arguments."""
    if nproc <= 1:
        return [python, *target]
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *target]


def train_command(run_dir: Path, nproc: int, python: str = sys.executable) -> list[str]:
    """``python train.py CONFIG`` (one process) or torchrun --standalone with ``nproc`` processes."""
    return launch(nproc, [str(TRAIN_SCRIPT), str(run_dir / CONFIG)], python)


def eval_command(run_dir: Path, ev: dict | None, nproc: int, python: str = sys.executable) -> list[str]:
    """The run's evaluation (``neox_dar.sweep.evaluate``) on ``nproc`` processes, as its training."""
    return launch(nproc, ["-m", "neox_dar.sweep.evaluate", str(run_dir), *eval_args(ev)], python)


def run_local(run_dir: Path, ev: dict | None, nproc: int = 1) -> int:
    """Train (resume, or extend to a raised ``train_iters``) one run, then evaluate it when the sweep asks and its
    evaluation does not score its newest checkpoint, both on ``nproc`` processes; returns the exit code (3:
    interrupted)."""
    run_dir = Path(run_dir)
    want_eval = bool(eval_args(ev))
    st = run_state(run_dir, want_eval, extra=list(extra_corpora(ev)))
    if st.state == "done":
        print(f"[sweep] {run_dir.name}: done, skipped")
        return 0
    if st.holder is not None:
        print(f"[sweep] {run_dir.name}: held by another process ({st.holder}), skipped")
        return 0
    if not st.trained:
        print(f"[sweep] {run_dir.name}: training ({st.state}, checkpoint {st.checkpoint}, to step {st.train_iters})")
        rc = _run_logged(train_command(run_dir, nproc), run_dir / "logs" / "train-local.log")
        if rc not in (0, EXIT_STOPPED):
            # another process (a second `run --local`, a job, train.py by hand) may have taken the run between the
            # state read above and this trainer's start, which then refused it: that run is theirs, not a failure
            now = run_state(run_dir, want_eval, extra=list(extra_corpora(ev)))
            if now.holder is not None or now.trained:
                why = f"held by another process ({now.holder})" if now.holder else "trained by another process meanwhile"
                print(f"[sweep] {run_dir.name}: {why}, skipped")
                return 0
        if rc != 0:
            print(f"[sweep] {run_dir.name}: training exited with {rc}")
            return rc
    if want_eval and needs_eval(run_dir, list(extra_corpora(ev))):
        rc = _run_logged(eval_command(run_dir, ev, nproc), run_dir / "logs" / "eval-local.log")
        if rc != 0:
            print(f"[sweep] {run_dir.name}: evaluation exited with {rc}")
            return rc
    return 0
