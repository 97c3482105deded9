"""The generated sbatch scripts: rendering, shell syntax, and the torchrun rendezvous under a fake srun."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neox_dar.sweep.slurm import (
    LAUNCHER,
    TRAIN_SCRIPT,
    SlurmSettings,
    eval_args,
    job_script,
    render,
)
from neox_dar.sweep.errors import SweepError
from neox_dar.sweep.planning import plan, write_plan
from neox_dar.sweep.spec import parse_sweep

from builders import ROOT, published_checkpoint

SWEEP = {"name": "tiny-sweep", "configs": ["configs/tiny.yml"], "set": {"train_iters": 20},
         "grid": {"window_size": [4, 8, 16]}, "eval": False}


def _settings(**kw) -> SlurmSettings:
    base = {"gpus_per_node": 0, "nproc_per_node": 2, "cpus_per_task": 1, "time": "00:05:00"}
    return SlurmSettings.from_dict({**base, **kw})


def _sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def test_render_drops_empty_sbatch_lines_and_rejects_unknown_fields():
    text = "#SBATCH --account={{ account }}\n#SBATCH --time={{ time }}\necho {{ time }}\n"
    assert render(text, {"account": None, "time": "1:00:00"}) == "#SBATCH --time=1:00:00\necho 1:00:00\n"
    with pytest.raises(SweepError, match="nodes"):
        render("#SBATCH --nodes={{ nodes }}\n", {})


def test_array_script_renders_and_parses(tmp_path):
    runs = [tmp_path / f"run{i}" for i in range(3)]
    script = job_script(_settings(concurrency=2, account="proj", qos="high", partition="cpu",
                                  mail_user="me@example.org", mail_type="END,FAIL", extra_sbatch=["--exclusive"],
                                  setup=["export FOO=1"]),
                        "tiny", runs, tmp_path / "logs", None, workdir=tmp_path)
    lines = _sbatch_lines(script)
    for want in ("--array=0-2%2", "--signal=B:USR1@120", "--requeue", "--nodes=1", "--ntasks-per-node=1",
                 "--cpus-per-task=1", "--time=00:05:00", "--account=proj", "--qos=high", "--partition=cpu",
                 "--mail-user=me@example.org", "--mail-type=END,FAIL", "--exclusive", "--job-name=tiny",
                 f"--output={tmp_path}/logs/%x-%A_%a.out"):
        assert f"#SBATCH {want}" in lines, want
    assert not any("gpus-per-node" in line or "constraint" in line or "--mem" in line for line in lines)
    assert "export FOO=1" in script and "{{" not in script
    assert all(str(r) in script for r in runs)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    subprocess.run(["bash", "-n", str(LAUNCHER)], check=True)


def test_single_run_gpu_script(tmp_path):
    script = job_script(SlurmSettings.from_dict({"nodes": 4, "gpus_per_node": 8, "constraint": "h100",
                                                 "mem": "0", "signal_seconds": 300}),
                        "one", [tmp_path / "run"], tmp_path / "logs", {"corpora": ["c4", "wikitext103"], "max_docs": 5},
                        workdir=tmp_path)
    lines = _sbatch_lines(script)
    assert "#SBATCH --gpus-per-node=8" in lines and "#SBATCH --nodes=4" in lines
    assert "#SBATCH --constraint=h100" in lines and "#SBATCH --signal=B:USR1@300" in lines
    assert not any(line.startswith("#SBATCH --array") for line in lines)
    assert "NPROC_PER_NODE=8" in script
    assert ("EVAL_ARGS=(--source hub --corpora c4,wikitext103 --sweep-manifest --max-docs=c4=5 "
            "--max-docs=wikitext103=5)") in script


def test_settings_errors():
    with pytest.raises(SweepError, match="nproc_per_node"):
        SlurmSettings.from_dict({"gpus_per_node": 0})
    with pytest.raises(SweepError, match="unknown slurm setting"):
        SlurmSettings.from_dict({"gpu": 1})
    with pytest.raises(SweepError, match="mode"):
        SlurmSettings.from_dict({"mode": "both"})
    for bad, message in (({"mem": "0", "mem_per_gpu": "80G"}, "exclude each other"),
                         ({"master_port_base": 50000}, "master_port_base must be in 1024..45535"),
                         ({"nccl_ib_disable": 2}, "nccl_ib_disable must be 0 or 1"),
                         ({"env": {"NCCL DEBUG": "INFO"}}, "env must be a mapping NAME: value"),
                         ({"gpus_per_node": 2, "nproc_per_node": 4}, "nproc_per_node 4 is more than gpus_per_node 2")):
        with pytest.raises(SweepError, match=message):
            SlurmSettings.from_dict(bad)
    # each setting checked against its type (a string for a list wrote a script line per character, "no" meant
    # --exclusive, 1.5 requeues broke the script's arithmetic, "2" nodes was a TypeError traceback)
    for bad, message in (({"setup": "module load cuda"}, "'slurm setup' .*expected list, got 'module load cuda'"),
                         ({"extra_sbatch": "--exclusive"}, "'slurm extra_sbatch' .*expected list"),
                         ({"exclusive": "no"}, "'slurm exclusive' .*expected bool"),
                         ({"max_requeues": 1.5}, "'slurm max_requeues' .*expected int, got 1.5"),
                         ({"nodes": "2"}, "'slurm nodes' .*expected int, got '2'"),
                         ({"python": 3}, "'slurm python' .*expected str")):
        with pytest.raises(SweepError, match=message):
            SlurmSettings.from_dict(bad)
    ok = SlurmSettings.from_dict({"mem": 0, "time": 90, "env": {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": 1200}})
    assert (ok.mem, ok.time, ok.env) == ("0", "90", {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "1200"})
    with pytest.raises(SweepError, match=r"eval args must be a list of eval.perplexity options"):
        eval_args({"source": "local", "args": "--batch-size 4"})


def test_a_squeue_that_fails_is_not_read_as_no_live_job(tmp_path, monkeypatch):
    """squeue answering with an error (slurmctld down): an error, not "no live job" (submit then sent the run a
    second time); a purged id ("Invalid job id") is a job that is gone."""
    from neox_dar.sweep.slurm import queued_jobs

    _executable(tmp_path / "squeue", "#!/bin/bash\necho \"slurm_load_jobs error: $FAKE_ERROR\" >&2\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ERROR", "Invalid job id specified")
    assert queued_jobs(["17"]) == {}
    monkeypatch.setenv("FAKE_ERROR", "Unable to contact slurm controller (connect failure)")
    with pytest.raises(SweepError, match="squeue -j 17 failed .*Unable to contact slurm controller"):
        queued_jobs(["17"])


def test_communication_exclusive_and_memory_settings_in_the_script(tmp_path):
    """NCCL's settings are exported from the slurm: settings (NCCL_DEBUG=WARN by default; the others only when set,
    so NCCL chooses by itself otherwise), `exclusive` and `mem_per_gpu` are #SBATCH lines, `env` adds variables,
    and the rendezvous port base, below Linux's ephemeral ports, reaches the launcher."""
    default = job_script(_settings(), "d", [tmp_path / "run"], tmp_path / "logs", None, workdir=tmp_path)
    exports = [line.split("#")[0].strip() for line in default.splitlines() if line.startswith("export ")]
    assert "export NCCL_DEBUG=WARN" in exports and "export MASTER_PORT_BASE=12000" in exports
    assert not any(e.startswith(("export NCCL_SOCKET_IFNAME", "export NCCL_IB")) for e in exports)
    assert not any("--exclusive" in line or "--mem" in line for line in _sbatch_lines(default))
    script = job_script(_settings(exclusive=True, mem_per_gpu="80G", nccl_debug="INFO",
                                  nccl_socket_ifname="^lo,docker0", nccl_ib_disable=0, nccl_ib_hca="mlx5",
                                  nccl_ib_timeout=22, master_port_base=15000,
                                  env={"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": 1200}),
                        "s", [tmp_path / "run"], tmp_path / "logs", None, workdir=tmp_path)
    assert {"#SBATCH --exclusive", "#SBATCH --mem-per-gpu=80G"} <= set(_sbatch_lines(script))
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    start = script.index("export NCCL_DEBUG")
    body = script[start:script.index("mkdir -p", start)]
    env = subprocess.run(["bash", "-c", body + "\nenv"], capture_output=True, text=True, check=True).stdout.splitlines()
    for want in ("NCCL_DEBUG=INFO", "NCCL_SOCKET_IFNAME=^lo,docker0", "NCCL_IB_DISABLE=0", "NCCL_IB_HCA=mlx5",
                 "NCCL_IB_TIMEOUT=22", "MASTER_PORT_BASE=15000", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=1200"):
        assert want in env, want


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture()
def fake_slurm(tmp_path):
    """A PATH with fake srun / scontrol and a fake torchrun that records what it was started with.

    The fake srun runs its command once per node (SLURM_NODEID = 0..N-1, as one task per node would),
    the fake scontrol expands a comma-separated node list and records `requeue`, and the fake torchrun
    records its arguments and rendezvous environment, then plays the trainer: it writes status.json with
    the state in FAKE_TRAIN_STATE and exits with FAKE_TRAIN_EXIT. An evaluation step (neox_dar.sweep.evaluate)
    is only recorded, and takes FAKE_EVAL_SECONDS (default 0).
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    rec = tmp_path / "records"
    rec.mkdir()
    _executable(bin_dir / "srun", f"""#!/bin/bash
trap '' USR1  # the real srun forwards signals to the step; the fake one just survives them
echo "srun $*" >> {rec}/srun.log
while [[ $1 == --* ]]; do shift; done
if [[ " $* " == *" neox_dar.sweep.evaluate "* ]]; then
    echo "$*" >> {rec}/eval.log
    sleep "${{FAKE_EVAL_SECONDS:-0}}" &
    trap 'kill $!; exit 143' TERM
    wait $!
    exit 0
fi
IFS=, read -r -a hosts <<<"$SLURM_JOB_NODELIST"
rc=0
for i in "${{!hosts[@]}}"; do
    SLURM_NODEID=$i SLURMD_NODENAME=${{hosts[$i]}} "$@" || rc=$?
done
exit $rc
""")
    _executable(bin_dir / "scontrol", f"""#!/bin/bash
if [[ $1 == show && $2 == hostnames ]]; then tr , '\\n' <<<"$3"; exit 0; fi
echo "$*" >> {rec}/scontrol.log
""")
    _executable(bin_dir / "fake_torchrun", f"""#!/bin/bash
python3 - "$@" <<'EOF'
import json, os, signal, sys, time
rec = {{"argv": sys.argv[1:], "MASTER_ADDR": os.environ["MASTER_ADDR"], "MASTER_PORT": os.environ["MASTER_PORT"],
       "node": os.environ["SLURM_NODEID"]}}
open("{rec}/torchrun-" + os.environ["SLURM_NODEID"] + ".json", "w").write(json.dumps(rec))
config = sys.argv[-1]
run_dir = os.path.dirname(config)
if os.environ.get("FAKE_USR1"):  # SLURM's time-limit warning reaches the batch script during training
    pid = os.getppid()
    while pid > 1 and "job.sbatch" not in open(f"/proc/{{pid}}/cmdline").read():
        pid = int(open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[1])
    os.kill(pid, signal.SIGUSR1)
    time.sleep(0.5)
    if os.environ.get("FAKE_TERM"):  # and then scancel's TERM (a cancel, a preemption)
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.5)
if os.environ["FAKE_TRAIN_STATE"] != "none":
    json.dump({{"state": os.environ["FAKE_TRAIN_STATE"], "step": int(os.environ.get("FAKE_STEP", 5)),
               "train_iters": 20}}, open(os.path.join(run_dir, "status.json"), "w"))
sys.exit(int(os.environ["FAKE_TRAIN_EXIT"]))
EOF
""")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TORCHRUN": str(bin_dir / "fake_torchrun"),
           "SLURM_JOB_ID": "12345", "SLURM_JOB_NODELIST": "gpu-a,gpu-b", "SLURM_JOB_NUM_NODES": "2"}
    return env, rec


def _planned_script(tmp_path: Path, nodes: int = 2, ev: dict | None = None) -> tuple[Path, Path]:
    sweep = parse_sweep({**SWEEP, "grid": {}, "runs": [{"name": "one"}]}, tmp_path / "s.yml")
    planned = plan(sweep, tmp_path / "runs")
    root = write_plan(sweep, planned)
    script = tmp_path / "job.sbatch"
    script.write_text(job_script(_settings(nodes=nodes, nproc_per_node=4), "t", [planned[0].run_dir],
                                 root / "logs", ev, workdir=Path.cwd()))
    return script, planned[0].run_dir


def test_rendezvous_from_slurm_variables(tmp_path, fake_slurm):
    env, rec = fake_slurm
    script, run_dir = _planned_script(tmp_path)
    proc = subprocess.run(["bash", str(script)], env={**env, "FAKE_TRAIN_STATE": "done", "FAKE_TRAIN_EXIT": "0",
                                                      "SLURM_CPUS_PER_TASK": "3", "SLURM_GPUS_PER_NODE": "8"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    srun = (rec / "srun.log").read_text()
    assert "--ntasks-per-node=1" in srun and "--cpus-per-task=3" in srun and "--gpus-per-node=8" in srun
    calls = [json.loads((rec / f"torchrun-{i}.json").read_text()) for i in range(2)]
    for i, call in enumerate(calls):
        assert call["MASTER_ADDR"] == "gpu-a"  # first host of the node list, on every node
        assert call["MASTER_PORT"] == str(12000 + 12345 % 20000)  # from the job id, same on every node
        args = call["argv"]
        assert "--nnodes=2" in args and f"--node_rank={i}" in args and "--nproc_per_node=4" in args
        assert "--master_addr=gpu-a" in args and f"--master_port={12000 + 12345 % 20000}" in args
        assert args[-2:] == [str(TRAIN_SCRIPT), str(run_dir / "config.yml")]
    assert not (rec / "scontrol.log").exists()  # done: no requeue
    assert "training done" in (run_dir / "logs" / "job.log").read_text()


def _one_node_job(script: Path, env: dict, state: str, exit_code: int, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script)],
                          env={**env, "SLURM_JOB_NODELIST": "gpu-a", "SLURM_JOB_NUM_NODES": "1",
                               "FAKE_TRAIN_STATE": state, "FAKE_TRAIN_EXIT": str(exit_code), **extra},
                          capture_output=True, text=True, timeout=60)


def _requeues(rec: Path) -> list[list[str]]:
    log = rec / "scontrol.log"
    return [line.split() for line in log.read_text().splitlines()] if log.is_file() else []


def test_time_limit_requeues_only_this_task(tmp_path, fake_slurm):
    """USR1 (the time-limit warning) and a checkpoint: requeue this array task, not the whole array (for the
    array's last task SLURM_JOB_ID is the array's own id, and requeueing it requeued every task)."""
    env, rec = fake_slurm
    script, run_dir = _planned_script(tmp_path, nodes=1)
    # torchrun reports a worker failure as exit 1; the run's status.json says it stopped at a checkpoint
    proc = _one_node_job(script, {**env, "SLURM_JOB_ID": "779", "SLURM_ARRAY_JOB_ID": "777",
                                  "SLURM_ARRAY_TASK_ID": "0"}, "interrupted", 1, FAKE_USR1="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _requeues(rec) == [["requeue", "777_0"]]
    proc = _one_node_job(script, env, "interrupted", 3, FAKE_USR1="1", FAKE_STEP="9")
    assert proc.returncode == 0 and _requeues(rec)[-1] == ["requeue", "12345"]


def test_a_stop_that_is_not_the_time_limit_is_not_requeued(tmp_path, fake_slurm):
    """scancel (TERM) or exit_interval: the trainer checkpoints and stops; the job ends instead of requeueing
    itself, so scancel stops a running job."""
    env, rec = fake_slurm
    script, run_dir = _planned_script(tmp_path, nodes=1)
    proc = _one_node_job(script, env, "interrupted", 3)
    assert proc.returncode == 0 and _requeues(rec) == []
    assert "not at the time limit: not requeued" in (run_dir / "logs" / "job.log").read_text()


def test_a_cancel_after_the_time_limit_warning_is_not_requeued(tmp_path, fake_slurm):
    """USR1 (the time limit) and then TERM (a cancel) during training: the run stops at a checkpoint and the job ends
    (before: the USR1 requeued it, so `sweep cancel` restarted the run)."""
    env, rec = fake_slurm
    script, run_dir = _planned_script(tmp_path, nodes=1)
    proc = _one_node_job(script, env, "interrupted", 3, FAKE_USR1="1", FAKE_TERM="1")
    assert proc.returncode == 0 and _requeues(rec) == [], proc.stdout + proc.stderr
    assert "TERM arrived (cancelled or preempted): not requeued" in (run_dir / "logs" / "job.log").read_text()


def test_a_run_file_the_job_cannot_read_fails_the_job(tmp_path, fake_slurm):
    """A status.json cut short: neox_dar.sweep.job cannot say whether the run needs training, and the job fails in
    one line without training (before: any failure of that helper read as "trained already": no training, no
    evaluation, the job COMPLETED with exit 0)."""
    env, rec = fake_slurm
    script, run_dir = _planned_script(tmp_path, nodes=1)
    (run_dir / "status.json").write_text('{"state": "runn')
    proc = _one_node_job(script, env, "done", 0)
    log = (run_dir / "logs" / "job.log").read_text()
    assert proc.returncode == 1 and not (rec / "srun.log").exists(), log
    assert "cannot tell whether the run needs training" in log and "status.json: not valid JSON" in proc.stderr



def test_the_jobs_run_file_questions_import_neither_torch_nor_the_planner():
    """`python -m neox_dar.sweep.job` answers every job step's question from the run's files: it imports none of
    torch or the sweep planner (the package once imported them all: 1.4 s a question instead of 0.2 s)."""
    code = ("import sys, neox_dar.sweep.job; "
            "print([m for m in ('torch', 'neox_dar.sweep.planning') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

def test_failed_training_fails_the_job(tmp_path, fake_slurm):
    env, rec = fake_slurm
    script, run_dir = _planned_script(tmp_path, nodes=1)
    proc = _one_node_job(script, env, "failed", 1, FAKE_USR1="1")
    assert proc.returncode == 1
    assert _requeues(rec) == []
    assert "training failed" in (run_dir / "logs" / "job.log").read_text()


def test_a_stale_interrupted_status_is_not_requeued(tmp_path, fake_slurm):
    """A run preempted once (status 'interrupted') whose next attempt dies before writing any status: the old
    status must not requeue it again (before: it requeued forever)."""
    env, rec = fake_slurm
    script, run_dir = _planned_script(tmp_path, nodes=1)
    (run_dir / "status.json").write_text(json.dumps({"state": "interrupted", "step": 5, "train_iters": 20}))
    proc = _one_node_job(script, env, "none", 1, FAKE_USR1="1")
    assert proc.returncode == 1 and _requeues(rec) == []
    assert "not updated by this attempt" in (run_dir / "logs" / "job.log").read_text()


def test_requeueing_stops_without_progress(tmp_path, fake_slurm):
    """Attempts that keep stopping at the same step: requeued max_requeues times, then the job gives up."""
    env, rec = fake_slurm
    script, run_dir = _planned_script(tmp_path, nodes=1)
    codes = [_one_node_job(script, env, "interrupted", 3, FAKE_USR1="1", FAKE_STEP="5").returncode
             for _ in range(4)]
    assert codes == [0, 0, 0, 1]  # the first stop made progress; the next three attempts did not
    assert len(_requeues(rec)) == 3
    assert "no progress past step 5 in 3 requeues" in (run_dir / "logs" / "job.log").read_text()


LOCAL_EVAL = {"source": "local", "corpora": ["c4"], "max_docs": 1}


def _status(run_dir: Path, state: str, step: int, train_iters: int = 20) -> None:
    (run_dir / "status.json").write_text(json.dumps({"state": state, "step": step, "train_iters": train_iters}))


def _evaluated_at(run_dir: Path, step: int) -> None:
    (run_dir / "eval").mkdir(exist_ok=True)
    (run_dir / "eval" / "perplexity.json").write_text(json.dumps({"step": step, "corpora": {"c4": {}}}))


def test_a_run_finished_short_of_train_iters_is_trained(tmp_path, fake_slurm):
    """A run that finished at step 10 while its config now asks for 20 (train_iters raised) trains again; a run
    trained to its train_iters and evaluated at its newest checkpoint does nothing (before: `done` in status.json
    skipped training whatever the step)."""
    env, rec = fake_slurm
    script, run_dir = _planned_script(tmp_path, nodes=1)
    published_checkpoint(run_dir / "checkpoints", 10)
    _status(run_dir, "done", 10, train_iters=10)
    proc = _one_node_job(script, env, "done", 0, FAKE_STEP="20")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (rec / "srun.log").read_text().count("srun ") == 1 and "training done" in (run_dir / "logs" / "job.log").read_text()
    (rec / "srun.log").unlink()
    proc = _one_node_job(script, env, "done", 0, FAKE_STEP="20")
    assert proc.returncode == 0 and not (rec / "srun.log").exists()  # trained to 20: nothing to do


def test_a_run_trained_past_its_evaluation_is_evaluated_again(tmp_path, fake_slurm):
    env, rec = fake_slurm
    script, run_dir = _planned_script(tmp_path, nodes=1, ev=LOCAL_EVAL)
    published_checkpoint(run_dir / "checkpoints", 20)
    _status(run_dir, "done", 20)
    _evaluated_at(run_dir, 10)  # scored an older checkpoint (the run was extended since)
    proc = _one_node_job(script, env, "none", 1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    evals = (rec / "eval.log").read_text().splitlines()
    assert len(evals) == 1 and f"neox_dar.sweep.evaluate {run_dir}" in evals[0] and "--sweep-manifest" in evals[0]
    assert str(TRAIN_SCRIPT) not in (rec / "srun.log").read_text()  # no training
    _evaluated_at(run_dir, 20)
    (rec / "eval.log").unlink()
    assert _one_node_job(script, env, "none", 1).returncode == 0 and not (rec / "eval.log").exists()


def test_term_during_the_evaluation_stops_the_job(tmp_path, fake_slurm):
    """`scancel` (or `sweep cancel`) while the job evaluates: the evaluation stops and the job ends (before: TERM
    was only logged, and the evaluation went on)."""
    env, rec = fake_slurm
    script, run_dir = _planned_script(tmp_path, nodes=1, ev=LOCAL_EVAL)
    published_checkpoint(run_dir / "checkpoints", 20)
    _status(run_dir, "done", 20)
    job = subprocess.Popen(["bash", str(script)], env={**env, "SLURM_JOB_NODELIST": "gpu-a", "SLURM_JOB_NUM_NODES": "1",
                                                      "FAKE_TRAIN_STATE": "none", "FAKE_TRAIN_EXIT": "1",
                                                      "FAKE_EVAL_SECONDS": "120"},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 60
    while not (rec / "eval.log").exists() and time.time() < deadline:
        time.sleep(0.2)
    job.send_signal(signal.SIGTERM)
    out, _ = job.communicate(timeout=30)
    assert job.returncode == 0, out
    log = (run_dir / "logs" / "job.log").read_text()
    assert "received TERM: stopping the evaluation" in log and "evaluation stopped (TERM)" in log
    assert _requeues(rec) == []


def _sbatch_arguments(line: str) -> list[str]:
    """The arguments sbatch reads from one ``#SBATCH`` line, by SLURM's rules (``get_argument`` in its
    ``src/sbatch/opt.c``): quotes group characters, a backslash escapes the next one (inside quotes too), an
    unquoted ``#`` starts a comment, whitespace separates."""
    args, arg, quote, escaped, started = [], "", "", False, False
    for ch in line.removeprefix("#SBATCH") + " ":
        if escaped:
            arg, escaped, started = arg + ch, False, True
        elif ch == "\\":
            escaped = True
        elif quote:
            quote, arg = ("", arg) if ch == quote else (quote, arg + ch)
        elif ch in "\"'":
            quote, started = ch, True
        elif ch == "#" or ch.isspace():
            if started:
                args.append(arg)
            arg, started = "", False
            if ch == "#":
                break
        else:
            arg, started = arg + ch, True
    return args


def test_submit_writes_a_log_folder_with_spaces_as_one_output_argument(tmp_path, tokenized_sample, capsys):
    """sweep submit into a folder whose name holds spaces, a '#' and quotes: the script's #SBATCH --output line is
    one argument, the log path, as sbatch reads it; a folder name with a line break is a one-line error."""
    import yaml

    from neox_dar.sweep.__main__ import main as sweep_main

    path = tmp_path / "s.yml"
    path.write_text(yaml.safe_dump({**SWEEP, "set": {"train_iters": 20, "data_path": tokenized_sample}}))
    out = tmp_path / "my runs #1 \"new\" it's"
    argv = [str(path), "submit", "--dry-run", "--gpus-per-node", "0", "--nproc-per-node", "1", "--out"]
    assert sweep_main([*argv, str(out)]) == 0
    script = out / "slurm" / "tiny-sweep.sbatch"
    line = next(x for x in _sbatch_lines(script.read_text()) if x.startswith("#SBATCH --output"))
    assert _sbatch_arguments(line) == [f"--output={out}/slurm/logs/%x-%A_%a.out"], line
    subprocess.run(["bash", "-n", str(script)], check=True)
    capsys.readouterr()
    assert sweep_main([*argv, str(tmp_path / "two\nlines")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweep error: ") and "line break" in err and err.count("\n") == 1, err


def test_submit_announces_the_overrides_an_earlier_run_local_recorded(tmp_path, tokenized_sample, capsys):
    """`run --local key=value` records its overrides in the sweep's folder; a later `submit` trains with them too,
    and says so in one line (the keys and values, and that key=value replaces one)."""
    import yaml

    from neox_dar.sweep.__main__ import main as sweep_main

    path = tmp_path / "s.yml"
    path.write_text(yaml.safe_dump({**SWEEP, "grid": {}, "runs": [{"name": "one"}]}))
    out = tmp_path / "runs"
    # plan records its key=value words as run --local does (both go through the same code; run would train here)
    assert sweep_main([str(path), "plan", "--out", str(out), f"data_path={tokenized_sample}", "train_iters=7"]) == 0
    capsys.readouterr()
    argv = [str(path), "submit", "--dry-run", "--gpus-per-node", "0", "--nproc-per-node", "1", "--out", str(out)]
    assert sweep_main(argv) == 0
    err = capsys.readouterr().err
    assert (f"submit: reusing the overrides recorded in {out / 'sweep.yml'} by an earlier command: "
            f"data_path={tokenized_sample} train_iters=7 (key=value replaces one)") in err
    assert yaml.safe_load((out / "one" / "config.yml").read_text())["train_iters"] == 7


def test_every_subcommands_help_prints(capsys):
    """`--help` of every sweep subcommand: submit's crashed in argparse on a '%' in a setting's help (a traceback,
    exit 1)."""
    from neox_dar.sweep.__main__ import main as sweep_main

    for command in ("plan", "run", "submit", "status", "cancel"):
        with pytest.raises(SystemExit) as done:
            sweep_main(["configs/sweeps/replicate-cpu.yml", command, "--help"])
        assert done.value.code == 0, command
    assert "job id % 20000" in " ".join(capsys.readouterr().out.split())


def test_slurm_settings_sbatch_would_refuse_are_plan_errors(tmp_path):
    """A --time sbatch cannot read and a --signal time past its range are refused when the settings are read (at
    plan), not at submit; concurrency with mode per-run is said to be unused. (Before: rendered into the script;
    sbatch refused it at submit; concurrency was dropped without a word.)"""
    from neox_dar.sweep.slurm import submit_runs

    for bad, message in ((dict(time="ten minutes"), "slurm time must be one of sbatch's --time forms"),
                         (dict(signal_seconds=100000), r"signal_seconds must be in 0\.\.65535"),
                         (dict(cpus_per_task=0), "slurm cpus_per_task must be >= 1, got 0")):
        with pytest.raises(SweepError, match=message):
            SlurmSettings.from_dict(bad)
    for good in ("90", "30:00", "2:30:00", "1-12", "1-12:00", "1-12:00:00", "UNLIMITED"):
        SlurmSettings.from_dict({"time": good})
    per_run = _settings(concurrency=2, mode="per-run")
    with pytest.warns(UserWarning, match="concurrency 2 is not applied with mode per-run"):
        submit_runs(per_run, "tiny", [tmp_path / "a"], tmp_path, None, dry_run=True, workdir=tmp_path)
