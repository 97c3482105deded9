"""Acceptance: a real one-node SLURM cluster on localhost runs a sweep of tiny CPU trainings.

`neox_dar.sweep submit` sends a three-run job array; one task gets SIGUSR1 mid-run (as SLURM sends it
before a time limit), checkpoints, requeues itself and finishes from its checkpoint while the others are left
alone; another is `scancel`led and stays stopped; then the runs are evaluated, their metrics checked and the
report built. The cluster (munged, slurmctld, slurmd) is
started by slurm/local_cluster.sh in a temporary directory and stopped by its pid files.

Needs Debian's slurm-wlm and munge (`apt-get install -y slurm-wlm munge`) and root; skipped only when
the SLURM binaries are not installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from neox_dar.report.__main__ import main as report_main
from neox_dar.sweep.__main__ import main as sweep_main
from neox_dar.rundir import job_ids, newest_checkpoint, read_metrics, read_status

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
    # three CPUs on this 2-core machine: the three tiny trainings of the sweep run at once (oversubscribed)
    proc = subprocess.run(["bash", str(CLUSTER), "start", str(state), "3"], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        subprocess.run(["bash", str(CLUSTER), "stop", str(state)], timeout=120)
        pytest.fail(f"local SLURM cluster did not start:\n{proc.stdout}\n{proc.stderr}")
    yield state / "slurm.conf"
    subprocess.run(["bash", str(CLUSTER), "stop", str(state)], check=True, timeout=120)


def _slurm(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30).stdout


def _wait(what: str, predicate, timeout: float, poll: float = 1.0, detail=None):
    """Poll ``predicate`` until it holds. The limits are generous: the test shares a loaded 2-core machine, and a
    limit reached is a failure (``detail()`` says what the cluster and the runs were doing then)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}" + (f"\n{detail()}" if detail else ""))


def _train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir) if "loss" in r]


def _watch(run_dir: Path):
    """A predicate helper: raises at once (with the run's job log) when the run failed, instead of waiting."""
    def failed() -> None:
        status = read_status(run_dir) or {}
        if status.get("state") == "failed":
            log = run_dir / "logs" / "job.log"
            raise AssertionError(f"{run_dir.name} failed: {status.get('reason')}\n"
                                 f"{log.read_text() if log.is_file() else ''}")
    return failed


def _describe(jobs: dict[str, str], runs: dict[str, Path]) -> str:
    """Each job's SLURM state and each run's status and last log lines (for a timed-out wait)."""
    lines = []
    for name, job in jobs.items():
        log = runs[name] / "logs" / "job.log"
        tail = log.read_text().splitlines()[-5:] if log.is_file() else []
        lines += [f"{name}: job {job} {_slurm('squeue', '-h', '-j', job, '-o', '%T %r').strip() or 'not queued'}; "
                  f"status {read_status(runs[name])}", *(f"  | {ln}" for ln in tail)]
    return "\n".join(lines)


def _job_field(job: str, field: str) -> str:
    text = _slurm("scontrol", "show", "job", job)
    return next((w.split("=", 1)[1] for w in text.split() if w.startswith(field + "=")), "")


def test_sweep_on_local_slurm(cluster, tmp_path, monkeypatch, capsys):
    """Issue 21, items 1 and 2 on a real cluster: a task that requeues itself on the time-limit USR1 leaves every
    other task of its array untouched, and `scancel` stops a running task for good (`sweep cancel` then cancels its
    resubmission while it waits)."""
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
        # DAR is the array's last task: its SLURM_JOB_ID is the array's own id, which names every task (requeueing
        # it requeued the whole array)
        "grid": {"attention": {"vanilla": {"configs": ["configs/attention/vanilla.yml"]},
                               "swa": {"configs": ["configs/attention/swa.yml"], "set": {"window_size": 8}},
                               "dar": {"configs": ["configs/attention/dar.yml"],
                                       "set": {"window_size": 8, "dar_d_down": 16}}}},
        "eval": {"source": "local", "corpora": ["c4"], "max_docs": 1},
        # a time limit far off: its USR1 (signal_seconds before it) must not come on a slow, loaded machine
        "slurm": {"gpus_per_node": 0, "nproc_per_node": 1, "cpus_per_task": 1, "time": "01:00:00",
                  "concurrency": 3},
        "report": {"baseline": {"attention_type": "vanilla"}},
    }
    sweep_file = tmp_path / "sweep.yml"
    sweep_file.write_text(yaml.safe_dump(sweep, sort_keys=False))  # grid order = array order
    out = tmp_path / "runs"
    assert sweep_main([str(sweep_file), "submit", "--out", str(out)]) == 0
    runs = {name: out / name for name in ("vanilla", "dar", "swa")}
    jobs = {name: job_ids(d)[-1] for name, d in runs.items()}
    assert all("_" in j for j in jobs.values())  # one job array, a task per run
    failed = {name: _watch(d) for name, d in runs.items()}

    def trained(name: str, n: int):
        failed[name]()
        return len(_train_steps(runs[name])) >= n

    # generous: a cold DeepSpeed op cache (~/.cache/torch_extensions) costs minutes before step 1
    _wait("the DAR and SWA runs to train a few steps", lambda: trained("dar", 3) and trained("swa", 3), 480, 0.5,
          detail=lambda: _describe(jobs, runs))
    # the DAR task gets the time-limit warning (USR1 to its batch script); the SWA task is scancel-led
    subprocess.run(["scancel", "--signal=USR1", "--batch", jobs["dar"]], check=True, timeout=30)
    subprocess.run(["scancel", jobs["swa"]], check=True, timeout=30)
    _wait("the DAR run to stop at a checkpoint",
          lambda: (read_status(runs["dar"]) or {}).get("state") == "interrupted", 300, 0.5,
          detail=lambda: _describe(jobs, runs))
    stopped_at = read_status(runs["dar"])["step"]
    assert stopped_at < STEPS

    # SLURM holds a requeued batch job ~120 s before it is eligible again; the test releases it early, but only
    # once the old batch script has exited: a job released while its previous instance is still finishing is
    # killed by slurmctld ("Job credential revoked") instead of restarting.
    dar_log = runs["dar"] / "logs" / "job.log"
    _wait("the DAR job to requeue itself", lambda: "requeueing" in dar_log.read_text(), 180, 0.5,
          detail=lambda: _describe(jobs, runs))
    _wait("the requeued DAR job to be pending",
          lambda: _slurm("squeue", "-h", "-j", jobs["dar"], "-o", "%T").strip() == "PENDING", 180, 0.5,
          detail=lambda: _describe(jobs, runs))
    capsys.readouterr()
    assert sweep_main([str(out), "status"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("dar "))
    assert line.split()[1] == "queued" and f"{jobs['dar']} PENDING" in line, line
    time.sleep(5)
    subprocess.run(["scontrol", "update", f"JobId={jobs['dar']}", "StartTime=now"], check=True, capture_output=True,
                   timeout=30)
    _wait("the DAR job to restart", lambda: "restart 1]" in dar_log.read_text(), 300, 0.5,
          detail=lambda: _describe(jobs, runs))

    def finished():
        failed["vanilla"](), failed["dar"]()
        return not any(_slurm("squeue", "-h", "-j", j, "-o", "%T").strip() for j in jobs.values())

    _wait("every job to finish", finished, 900, 0.5, detail=lambda: _describe(jobs, runs))

    for name in ("vanilla", "dar"):
        d = runs[name]
        status = read_status(d)
        log = (d / "logs" / "job.log").read_text()
        assert status == {**status, "state": "done", "step": STEPS}, (name, status, log)
        steps = _train_steps(d)
        assert sorted(set(steps)) == list(range(1, STEPS + 1)), (name, steps)
        assert (d / "eval" / "perplexity.json").is_file(), log
        assert any("valid_loss" in r for r in read_metrics(d))
    log = dar_log.read_text()
    assert "requeueing" in log and "restart 1" in log
    steps = _train_steps(runs["dar"])
    # resumed from the checkpoint: step 1 trained once, steps after the checkpoint continue, not restart
    assert steps.count(1) == 1 and steps.index(stopped_at) < len(steps) - 1
    assert _job_field(jobs["dar"], "Restarts") == "1"
    assert steps.count(stopped_at + 1) == 1
    # item 1: the other tasks of the array are untouched by the DAR task's requeue
    vanilla_log = (runs["vanilla"] / "logs" / "job.log").read_text()
    assert _job_field(jobs["vanilla"], "Restarts") == "0" and "restart 1" not in vanilla_log
    assert "requeue" not in vanilla_log and _train_steps(runs["vanilla"]) == list(range(1, STEPS + 1))
    # item 2: the scancel-led task ended for good, at a checkpoint
    swa = runs["swa"]
    assert _job_field(jobs["swa"], "JobState") == "CANCELLED" and _job_field(jobs["swa"], "Restarts") == "0"
    status = read_status(swa)
    assert status["state"] == "interrupted" and status["step"] < STEPS, status
    assert newest_checkpoint(swa) is not None and "requeueing" not in (swa / "logs" / "job.log").read_text()

    capsys.readouterr()
    assert sweep_main([str(out), "status"]) == 0
    text = capsys.readouterr().out
    assert "2 done" in text and "1 interrupted" in text
    # submitted again, only the SWA run goes (the others are done); `sweep cancel` stops it. The job is submitted
    # held (#SBATCH --hold), so it is still waiting when `cancel` looks: released, the steps left could finish
    # before `cancel` reached the job on a loaded machine
    assert sweep_main([str(out), "submit", "--extra-sbatch=--hold"]) == 0
    assert "swa: interrupted, resumes from step" in capsys.readouterr().out
    second = job_ids(swa)[-1]
    assert _slurm("squeue", "-h", "-j", second, "-o", "%T").strip() == "PENDING"
    assert sweep_main([str(out), "cancel"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert f"{second}: cancelled (it had not started)" in lines, lines
    assert lines[-1].startswith("cancel: 1 waiting job(s) cancelled"), lines
    assert "2 of 3 run(s) had no live job" in lines[-1], lines
    _wait("the cancelled SWA job to leave the queue",
          lambda: not _slurm("squeue", "-h", "-j", second, "-o", "%T").strip(), 180, 0.5)
    assert read_status(swa)["state"] == "interrupted" and _job_field(second, "Restarts") == "0"
    assert _job_field(second, "JobState") == "CANCELLED"

    assert report_main([str(out), "--out", str(tmp_path / "report")]) == 0
    table = json.loads((tmp_path / "report" / "table.json").read_text())
    c4 = table["columns"].index("C4")
    assert "FineWeb-Edu" not in table["columns"]  # no run evaluated it: no column (report since 9fcc456)
    for row in table["rows"]:
        if row[0] == "swa":
            assert row[c4] is None  # not evaluated: missing, not zero
            continue
        result = json.loads((out / row[0] / "eval" / "perplexity.json").read_text())
        assert row[c4] == pytest.approx(result["corpora"]["c4"]["token_perplexity"])
    assert (tmp_path / "report" / "loss_curves.png").is_file()
    assert (tmp_path / "report" / "relative_ppl_vs_step.png").is_file()


def test_cluster_settings_reach_the_job_and_the_evaluation_uses_its_ranks(cluster, tmp_path, monkeypatch, capsys,
                                                                          tokenized_sample):
    """Issue 37, item 4 on the real cluster: `exclusive: true` is an exclusive job (OverSubscribe=NO); the NCCL
    settings, the rendezvous port base and `env` are in the job's environment; the launcher's port is base + job id %
    20000; `checkpoint_minutes` saves by wall time between step checkpoints; and the evaluation after training runs
    on the job's 2 ranks (item 3) and writes the one-process results of the run."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("SLURM_CONF", str(cluster))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    steps = 3  # a checkpoint by wall time after each of the first two steps, then the last step's
    sweep = {
        "name": "slurm-settings",
        "configs": ["configs/tiny.yml", "configs/attention/vanilla.yml"],
        "set": {"data_path": tokenized_sample, "split": "100,0,0", "seq_length": 32, "train_iters": steps,
                "train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "log_interval": 1, "eval_interval": 0,
                "checkpoint_factor": 1000, "checkpoint_minutes": 0.001, "keep_last_n": 100, "precision": "fp32"},
        "runs": [{"name": "one"}],
        "eval": {"source": "local", "corpora": ["c4"], "max_docs": 2},
        "slurm": {"gpus_per_node": 0, "nproc_per_node": 2, "cpus_per_task": 2, "time": "01:00:00", "exclusive": True,
                  "nccl_debug": "INFO", "nccl_socket_ifname": "lo", "nccl_ib_disable": 1, "master_port_base": 15000,
                  "env": {"NEOX_DAR_MARK": "kept"},
                  "setup": ['mkdir -p "$RUN_DIR/logs" && env | grep -E "^(NCCL_|MASTER_PORT_BASE=|NEOX_DAR_MARK=)" '
                            '| sort > "$RUN_DIR/logs/job-env.txt"']},
    }
    sweep_file = tmp_path / "sweep.yml"
    sweep_file.write_text(yaml.safe_dump(sweep, sort_keys=False))
    out = tmp_path / "runs"
    assert sweep_main([str(sweep_file), "submit", "--out", str(out)]) == 0
    run = out / "one"
    job = job_ids(run)[-1]
    assert _job_field(job, "OverSubscribe") == "NO"  # --exclusive
    failed = _watch(run)

    def finished():
        failed()
        return not _slurm("squeue", "-h", "-j", job, "-o", "%T").strip()

    _wait("the job to finish", finished, 900, 0.5, detail=lambda: _describe({"one": job}, {"one": run}))
    log = (run / "logs" / "job.log").read_text()
    assert read_status(run)["state"] == "done", log
    env = (run / "logs" / "job-env.txt").read_text().splitlines()
    assert env == ["MASTER_PORT_BASE=15000", "NCCL_DEBUG=INFO", "NCCL_IB_DISABLE=1", "NCCL_SOCKET_IFNAME=lo",
                   "NEOX_DAR_MARK=kept"], env
    port = 15000 + int(job) % 20000
    train_log = next((run / "logs").glob("train-*-node0.log")).read_text()
    assert f":{port}, 2 process(es)" in train_log, train_log[-2000:]
    saved = sorted({int(m) for m in re.findall(r"saved checkpoint \S*step_(\d+)", train_log)})
    assert len(saved) >= 2 and saved[-1] == steps, saved  # by wall time before the last step, then the last
    eval_log = next((run / "logs").glob("eval-*-node0.log")).read_text()
    assert f":{port}, 2 process(es)" in eval_log, eval_log[-2000:]
    result = json.loads((run / "eval" / "perplexity.json").read_text())
    assert result["ranks"] == 2 and result["step"] == steps and result["corpora"]["c4"]["documents"] == 2

    from eval.perplexity import main as perplexity

    assert perplexity([str(run), "--source", "local", "--corpora", "c4", "--max-docs", "2", "--no-progress",
                       "--no-wandb", "--device", "cpu", "--out", str(tmp_path / "one.json")]) == 0
    one = json.loads((tmp_path / "one.json").read_text())["corpora"]["c4"]
    assert one["tokens"] == result["corpora"]["c4"]["tokens"]
    assert one["nll"] == pytest.approx(result["corpora"]["c4"]["nll"], rel=1e-6)  # this process's threads may differ
