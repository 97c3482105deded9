"""Acceptance: a real one-node SLURM cluster on localhost runs a sweep of tiny CPU trainings.

`neox_dar.sweep submit` sends a two-run job array; one job gets SIGUSR1 mid-run (as SLURM sends it
before a time limit), checkpoints, requeues itself and finishes from its checkpoint; then the runs are
evaluated, their metrics checked and the report built. The cluster (munged, slurmctld, slurmd) is
started by slurm/local_cluster.sh in a temporary directory and stopped by its pid files.

Needs Debian's slurm-wlm and munge (`apt-get install -y slurm-wlm munge`) and root; skipped only when
the SLURM binaries are not installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from neox_dar.report.__main__ import main as report_main
from neox_dar.sweep.__main__ import main as sweep_main
from neox_dar.sweep.rundir import job_ids, read_metrics, read_status

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "slurm" / "local_cluster.sh"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")
MISSING = [b for b in BINARIES if shutil.which(b) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"SLURM not installed (no {', '.join(MISSING)}): "
                                "apt-get install -y slurm-wlm munge")
STEPS = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("slurm")
    proc = subprocess.run(["bash", str(CLUSTER), "start", str(state), "2"], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        subprocess.run(["bash", str(CLUSTER), "stop", str(state)], timeout=120)
        pytest.fail(f"local SLURM cluster did not start:\n{proc.stdout}\n{proc.stderr}")
    yield state / "slurm.conf"
    subprocess.run(["bash", str(CLUSTER), "stop", str(state)], check=True, timeout=120)


def _slurm(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30).stdout


def _wait(what: str, predicate, timeout: float, poll: float = 1.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir) if "loss" in r]


def test_sweep_on_local_slurm(cluster, tmp_path, monkeypatch, capsys):
    from data_prep.tokenize import run as tokenize

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("SLURM_CONF", str(cluster))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    tokenize(["data/sample/c4_sample.jsonl", "--tokenizer", "data/20B_tokenizer.json", "--out",
              str(tmp_path / "c4"), "--max-tokens", "20000", "--workers", "1", "--no-progress"])
    sweep = {
        "name": "slurm-accept",
        "configs": ["configs/tiny.yml"],
        "set": {"data_path": str(tmp_path / "c4"), "seq_length": 32, "train_iters": STEPS, "train_batch_size": 8,
                "train_micro_batch_size_per_gpu": 4, "log_interval": 1, "eval_interval": 10, "eval_iters": 2,
                "checkpoint_factor": 10, "precision": "fp32"},
        "grid": {"attention": {"vanilla": {"configs": ["configs/attention/vanilla.yml"]},
                               "dar": {"configs": ["configs/attention/dar.yml"],
                                       "set": {"window_size": 8, "dar_d_down": 16}}}},
        "eval": {"source": "local", "corpora": ["c4"], "max_docs": 1},
        "slurm": {"gpus_per_node": 0, "nproc_per_node": 1, "cpus_per_task": 1, "time": "00:10:00",
                  "concurrency": 2},
        "report": {"baseline": {"attention_type": "vanilla"}},
    }
    sweep_file = tmp_path / "sweep.yml"
    sweep_file.write_text(yaml.safe_dump(sweep))
    out = tmp_path / "runs"
    assert sweep_main([str(sweep_file), "submit", "--out", str(out)]) == 0
    runs = {name: out / name for name in ("vanilla", "dar")}
    jobs = {name: job_ids(d)[-1] for name, d in runs.items()}
    assert all("_" in j for j in jobs.values())  # one job array, a task per run

    # SIGUSR1 to the DAR job's batch script once it is training; it must checkpoint and requeue
    target = runs["dar"]
    # generous: a cold DeepSpeed op cache (~/.cache/torch_extensions) costs minutes before step 1
    _wait("the DAR run to train a few steps", lambda: len(_train_steps(target)) >= 3, 480, 0.5)
    subprocess.run(["scancel", "--signal=USR1", "--batch", jobs["dar"]], check=True, timeout=30)
    _wait("the DAR run to stop at a checkpoint",
          lambda: (read_status(target) or {}).get("state") == "interrupted", 90, 0.5)
    stopped_at = read_status(target)["step"]
    assert stopped_at < STEPS

    # SLURM holds a requeued batch job ~120 s before it is eligible again; the test releases it early, but only
    # once the old batch script has exited: a job released while its previous instance is still finishing is
    # killed by slurmctld ("Job credential revoked") instead of restarting.
    _wait("the DAR job to requeue itself", lambda: "requeueing" in (target / "logs" / "job.log").read_text(), 60, 0.5)
    _wait("the requeued DAR job to be pending",
          lambda: _slurm("squeue", "-h", "-j", jobs["dar"], "-o", "%T").strip() == "PENDING", 60, 0.5)
    time.sleep(5)
    subprocess.run(["scontrol", "update", f"JobId={jobs['dar']}", "StartTime=now"], check=True, capture_output=True,
                   timeout=30)
    _wait("the DAR job to restart", lambda: "restart 1]" in (target / "logs" / "job.log").read_text(), 120, 1.0)

    def finished():
        pending = [j for j in jobs.values() if _slurm("squeue", "-h", "-j", j, "-o", "%T").strip()]
        return not pending

    _wait("both jobs to finish", finished, 180, 2.0)

    for name, d in runs.items():
        status = read_status(d)
        log = (d / "logs" / "job.log").read_text()
        assert status == {**status, "state": "done", "step": STEPS}, (name, status, log)
        steps = _train_steps(d)
        assert sorted(set(steps)) == list(range(1, STEPS + 1)), (name, steps)
        assert (d / "eval" / "perplexity.json").is_file(), log
        assert any("valid_loss" in r for r in read_metrics(d))
    log = (target / "logs" / "job.log").read_text()
    assert "requeueing" in log and "restart 1" in log
    steps = _train_steps(target)
    # resumed from the checkpoint: step 1 trained once, steps after the checkpoint continue, not restart
    assert steps.count(1) == 1 and steps.index(stopped_at) < len(steps) - 1
    assert "Restarts=1" in _slurm("scontrol", "show", "job", jobs["dar"])
    assert steps.count(stopped_at + 1) == 1

    capsys.readouterr()
    assert sweep_main([str(out), "status"]) == 0
    assert "2 done" in capsys.readouterr().out
    assert report_main([str(out), "--out", str(tmp_path / "report")]) == 0
    table = json.loads((tmp_path / "report" / "table.json").read_text())
    c4 = table["columns"].index("C4")
    for row in table["rows"]:
        result = json.loads((out / row[0] / "eval" / "perplexity.json").read_text())
        assert row[c4] == pytest.approx(result["corpora"]["c4"]["token_perplexity"])
        assert row[table["columns"].index("FineWeb-Edu")] is None  # not evaluated: missing, not zero
    assert (tmp_path / "report" / "loss_curves.png").is_file()
    assert (tmp_path / "report" / "relative_ppl_vs_step.png").is_file()
