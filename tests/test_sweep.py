"""Sweep files: expansion, names, the papers' plans, written configs, status, and submit's skip rules."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from neox_dar.config import load_config
from neox_dar.rundir import lock_run_dir
from neox_dar.sweep.__main__ import main as sweep_main
from neox_dar.sweep.rundir import run_state
from neox_dar.sweep.errors import SweepError
from neox_dar.sweep.planning import plan, write_plan
from neox_dar.sweep.spec import load_sweep, parse_sweep

from builders import published_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = Path("configs/sweeps")


def _plan(name: str, tmp_path: Path):
    sweep = load_sweep(SWEEPS / f"{name}.yml")
    return sweep, {p.spec.name: p.cfg for p in plan(sweep, tmp_path)}


def test_dar_table1_plan_is_the_papers_runs(tmp_path):
    sweep, cfgs = _plan("dar-table1", tmp_path)
    assert sorted(cfgs) == sorted(["vanilla", "dar-d256", "dar-d128", "dar-d64",
                                   "uniform-d256", "uniform-d128", "uniform-d64"])
    for name, c in cfgs.items():
        assert (c.model.num_layers, c.model.hidden_size, c.model.num_attention_heads) == (6, 512, 8)  # Pythia-70M
        assert c.training.train_iters == 19073 and c.training.train_batch_size == 256 and c.model.seq_length == 2048
        assert c.training.lr_decay_iters == 19073
        assert c.run.wandb_group == "dar-table1" and c.run.wandb_run_name == name
        assert c.run.save == str(tmp_path.resolve() / name)
    assert cfgs["vanilla"].model.attention.attention_type == "vanilla"
    for d in (256, 128, 64):
        assert cfgs[f"dar-d{d}"].model.attention.attention_type == "dar" and cfgs[f"dar-d{d}"].model.attention.dar_d_down == d
        assert cfgs[f"dar-d{d}"].model.attention.window_size == 128
        assert cfgs[f"uniform-d{d}"].model.attention.attention_type == "uniform" and cfgs[f"uniform-d{d}"].model.attention.dar_d_down == d


def test_dar_table2_and_table3_plans(tmp_path):
    _, t2 = _plan("dar-table2", tmp_path / "t2")
    assert sorted(t2) == sorted(f"{s}-{a}" for s in ("70m", "160m", "410m") for a in ("vanilla", "dar"))
    for scale, width, steps, batch in (("70m", 512, 19073, 256), ("160m", 768, 5450, 896), ("410m", 1024, 5450, 896)):
        for att in ("vanilla", "dar"):
            c = t2[f"{scale}-{att}"]
            assert (c.model.hidden_size, c.training.train_iters, c.training.train_batch_size, c.model.attention.attention_type) == (width, steps, batch, att)
        assert t2[f"{scale}-dar"].model.attention.dar_d_down == width // 4 and t2[f"{scale}-dar"].model.attention.window_size == 128
    _, t3 = _plan("dar-table3", tmp_path / "t3")
    windows = [0, 1, 4, 16, 64, 128, 256]
    assert sorted(t3) == sorted([f"dar-d128-w{w}" for w in windows] + ["vanilla"])
    for w in windows:
        c = t3[f"dar-d128-w{w}"]
        assert (c.model.attention.attention_type, c.model.attention.dar_d_down, c.model.attention.window_size, c.training.train_iters) == ("dar", 128, w, 19073)


def test_mswa_and_aha_plans(tmp_path):
    _, m = _plan("mswa-vs-swa", tmp_path / "m")
    for w in (64, 128, 256, 512):
        assert (m[f"swa-w{w}"].model.attention.attention_type, m[f"swa-w{w}"].model.attention.window_size) == ("swa", w)
        assert (m[f"mswa-w{w}"].model.attention.attention_type, m[f"mswa-w{w}"].model.attention.mswa_variant) == ("mswa", "full")
    assert m["mswa-h-w128"].model.attention.mswa_variant == "heads" and m["mswa-l-w128"].model.attention.mswa_variant == "layers"
    assert "vanilla" in m and "vanilla-n1024" in m and len(m) == 12
    _, a = _plan("aha-window", tmp_path / "a")
    assert sorted(c.model.attention.window_size for n, c in a.items() if n != "vanilla") == [16, 32, 64, 128, 256]
    assert all(c.model.attention.aha_l1_coef == pytest.approx(3e-4) for n, c in a.items() if n != "vanilla")
    _, l1 = _plan("aha-l1", tmp_path / "l1")
    runs = [c.model.attention for n, c in l1.items() if n != "vanilla"]
    assert sorted(a.aha_l1_coef for a in runs) == pytest.approx([1e-4, 3e-4, 1e-3])
    assert all(a.window_size == 128 and a.attention_type == "aha" for a in runs)


def test_plan_writes_resolved_configs_and_is_deterministic(tmp_path, capsys, tokenized_sample):
    args = [str(SWEEPS / "dar-table1.yml"), "plan", "--out", str(tmp_path / "a")]
    assert sweep_main([*args, f"data_path={tokenized_sample}"]) == 0
    first = capsys.readouterr().out
    assert "19073" in first and "256 x 2048" in first and "7 runs" in first and "checked for 8 rank(s)" in first
    assert sweep_main(args) == 0  # the recorded data_path is reused
    assert capsys.readouterr().out == first
    cfg = load_config(tmp_path / "a" / "dar-d64" / "config.yml")
    assert cfg.model.attention.dar_d_down == 64 and cfg.run.save == str((tmp_path / "a" / "dar-d64").resolve())
    assert cfg.data.data_path == tokenized_sample
    meta = json.loads((tmp_path / "a" / "dar-d64" / "run.json").read_text())
    assert meta["axes"] == {"attention": "dar", "dar_d_down": "d64"} and meta["sweep"] == "dar-table1"
    assert load_sweep(tmp_path / "a").name == "dar-table1"  # the output dir holds the sweep


def test_spec_rules(tmp_path):
    base = {"name": "s", "configs": ["configs/tiny.yml"]}
    sw = parse_sweep({**base, "grid": {"window_size": [4, 8], "dar_d_down": [16, 32]},
                      "set": {"attention_type": "dar"}, "exclude": [{"window_size": 8, "dar_d_down": 32}]})
    assert [r.name for r in sw.runs] == ["w4-d16", "w4-d32", "w8-d16"]
    sw = parse_sweep({**base, "grid": {"window_size": [4]}, "name_template": "x{window_size}"})
    assert [r.name for r in sw.runs] == ["x4"]
    # a grid axis replaces a `set:` key for its runs; a `runs:` entry keeps it unless its own `set` gives the key
    sw = parse_sweep({**base, "set": {"window_size": 128, "seed": 3}, "grid": {"window_size": [4]},
                      "runs": [{"name": "a"}, {"name": "b", "set": {"window_size": 9}}]})
    assert [(r.name, r.overrides) for r in sw.runs] == [("w4", {"window_size": 4, "seed": 3}),
                                                        ("a", {"window_size": 128, "seed": 3}),
                                                        ("b", {"window_size": 9, "seed": 3})]
    with pytest.raises(SweepError, match="duplicate run names"):
        parse_sweep({**base, "grid": {"window_size": [4]}, "runs": [{"name": "w4"}]})
    # a name the sweep writes beside its runs, or too long for a directory (before: a traceback after sweep.yml
    # was written, or a run sharing slurm/ or report/ with the sweep's own files)
    for name in ("sweep.yml", "slurm", "report", "eval_manifest.json"):
        with pytest.raises(SweepError, match="is what the sweep writes beside its runs"):
            parse_sweep({**base, "runs": [{"name": name}]})
    with pytest.raises(SweepError, match="has 300 characters, more than 100"):
        parse_sweep({**base, "runs": [{"name": "x" * 300}]})
    from neox_dar.evaluation.perplexity import SWEEP_MANIFEST
    from neox_dar.sweep.spec import RESERVED_NAMES

    assert SWEEP_MANIFEST in RESERVED_NAMES
    with pytest.raises(SweepError, match="unknown key"):
        parse_sweep({**base, "grids": {}})
    with pytest.raises(SweepError, match="no runs"):
        parse_sweep(base)
    with pytest.raises(SweepError, match="window_sizes"):
        plan(parse_sweep({**base, "grid": {"window_sizes": [4]}}), tmp_path)
    # a bad value of the sweep file's grid names the file, not the command line
    with pytest.raises(SweepError, match=r"run 'i0': invalid value for 'train_iters' in .*s\.yml \(set/grid\): 0"):
        plan(parse_sweep({**base, "grid": {"train_iters": [0]}, "name_template": "i{train_iters}"},
                         tmp_path / "s.yml"), tmp_path)
    with pytest.raises(SweepError, match="not found"):
        plan(parse_sweep({**base, "runs": [{"name": "a", "configs": ["configs/attention/nope.yml"]}]}), tmp_path)


def test_changed_config_of_a_started_run_is_refused(tmp_path):
    spec = {"name": "s", "configs": ["configs/tiny.yml"], "runs": [{"name": "a"}]}
    sweep = parse_sweep(spec)
    write_plan(sweep, plan(sweep, tmp_path))
    (tmp_path / "a" / "checkpoints").mkdir()
    changed = parse_sweep({**spec, "set": {"train_iters": 7}})
    with pytest.raises(SweepError, match="train_iters"):
        write_plan(changed, plan(changed, tmp_path))
    write_plan(changed, plan(changed, tmp_path), force=True)
    assert yaml.safe_load((tmp_path / "a" / "config.yml").read_text())["train_iters"] == 7


def _fake_run(run_dir: Path, state: str | None, step: int, loss: float, ckpt: int | None = None) -> None:
    if state:
        (run_dir / "status.json").write_text(json.dumps({"state": state, "step": step, "train_iters": 20}))
    rows = [{"step": s, "loss": loss + (step - s)} for s in range(1, step + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 99, "lo')
    if ckpt is not None:
        published_checkpoint(run_dir / "checkpoints", ckpt)


@pytest.fixture()
def four_runs(tmp_path, tokenized_sample):
    spec = {"name": "st", "configs": ["configs/tiny.yml"], "set": {"train_iters": 20, "data_path": tokenized_sample},
            "grid": {"window_size": [1, 2, 3, 4, 5]}, "eval": False}
    path = tmp_path / "st.yml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "runs"
    assert sweep_main([str(path), "plan", "--out", str(out)]) == 0
    _fake_run(out / "w1", "done", 20, 2.5)
    _fake_run(out / "w2", "running", 7, 3.25)
    _fake_run(out / "w3", "interrupted", 10, 3.0, ckpt=10)
    _fake_run(out / "w4", "failed", 3, 4.0)
    return path, out


def test_status_from_run_directories(four_runs, capsys):
    _, out = four_runs
    lock = lock_run_dir(out / "w2")  # a trainer holds w2
    try:
        states = {d: run_state(out / d) for d in ("w1", "w2", "w3", "w4", "w5")}
        assert {d: s.state for d, s in states.items()} == {
            "w1": "done", "w2": "running", "w3": "interrupted", "w4": "failed", "w5": "pending"}
        assert states["w2"].step == 7 and states["w2"].loss == 3.25  # torn last line ignored
        assert states["w3"].checkpoint == 10
        capsys.readouterr()
        assert sweep_main([str(out), "status"]) == 0
        text = capsys.readouterr().out
    finally:
        lock.release()
    line = next(ln for ln in text.splitlines() if ln.startswith("w2 "))
    assert "running" in line and "7/20" in line and "3.2500" in line
    assert "1 done" in text and "1 pending" in text
    assert run_state(out / "w2").state == "stale"  # status.json says running, but nothing holds the run


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture()
def fake_queue(tmp_path, monkeypatch):
    """sbatch that answers job 77 (and logs its calls); squeue that knows 77's array tasks as pending, and the jobs
    listed in ``queue.txt`` ("ID STATE" lines) in their state; scancel that logs its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    queue = tmp_path / "queue.txt"
    queue.write_text("")
    _executable(bin_dir / "sbatch", f"#!/bin/bash\necho \"$@\" >> {tmp_path}/sbatch.log\necho 77\n")
    _executable(bin_dir / "squeue", f"#!/bin/bash\ngrep \"^$4 \" {queue} && exit 0\n"
                                    "[[ $4 == 77_* ]] && echo \"$4 PENDING\"\nexit 0\n")
    _executable(bin_dir / "scancel", f"#!/bin/bash\necho \"$@\" >> {tmp_path}/scancel.log\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path / "sbatch.log"


def test_status_marks_running_runs_without_a_live_job_stale(four_runs, fake_queue, capsys):
    _, out = four_runs
    (out / "w2" / "slurm_jobs.txt").write_text("55\n")
    capsys.readouterr()
    assert sweep_main([str(out), "status"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("w2 "))
    assert line.split()[1] == "stale"


def test_submit_skips_done_and_queued_runs(four_runs, fake_queue, capsys):
    path, out = four_runs
    args = [str(path), "submit", "--out", str(out), "--gpus-per-node", "0", "--nproc-per-node", "1",
            "--cpus-per-task", "1", "--concurrency", "2"]
    assert sweep_main(args) == 0
    text = capsys.readouterr().out
    assert "w1: done, skipped" in text and "w3: interrupted, resumes from step 10" in text
    script = (out / "slurm" / "st.sbatch").read_text()
    assert "#SBATCH --array=0-3%2" in script
    assert [ln.strip() for ln in (out / "w3" / "slurm_jobs.txt").read_text().splitlines()] == ["77_1"]
    assert sweep_main(args) == 0  # again: everything left is queued
    text = capsys.readouterr().out
    assert "already queued" in text and "nothing to submit" in text
    assert len(fake_queue.read_text().splitlines()) == 1


def test_run_local_skips_done_runs_and_builds_launch_commands(four_runs, capsys):
    from neox_dar.sweep.local import train_command
    from neox_dar.sweep.slurm import TRAIN_SCRIPT

    path, out = four_runs
    capsys.readouterr()
    assert sweep_main([str(path), "run", "--local", "--out", str(out), "--only", "w1"]) == 0
    assert "w1: done, skipped" in capsys.readouterr().out
    assert train_command(out / "w3", 1)[1:] == [str(TRAIN_SCRIPT), str(out / "w3" / "config.yml")]
    cmd = train_command(out / "w3", 4)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]


def test_submit_dry_run_writes_per_run_scripts_and_records_nothing(four_runs, capsys):
    path, out = four_runs
    args = [str(path), "submit", "--out", str(out), "--dry-run", "--mode", "per-run", "--gpus-per-node", "4",
            "--nodes", "2", "--partition", "gpu", "--only", "w4", "w5"]
    # a micro-batch given on the command line is kept: 8 ranks x 4 do not divide the global batch of 16
    assert sweep_main([*args, "train_micro_batch_size_per_gpu=4"]) == 2
    err = capsys.readouterr().err
    assert "run 'w4' on 8 rank(s)" in err and "micro-batches that fit 8 ranks: 1, 2" in err
    assert not (out / "slurm").exists()
    assert sweep_main(args) == 0  # tiny.yml's micro-batch 8 does not fit 8 ranks either: the plan takes 2 and says so
    printed = capsys.readouterr()
    assert "wrote" in printed.out and "micro-batch 8 (from the config files) does not divide the global batch 16 over " \
                                      "8 ranks: using 2 (accumulation 1)" in printed.err
    for run in ("w4", "w5"):
        script = (out / "slurm" / f"st.{run}.sbatch").read_text()
        assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=4" in script
        assert "#SBATCH --partition=gpu" in script and "--array" not in script
        assert not (out / run / "slurm_jobs.txt").exists()


def test_status_and_cancel_import_no_torch(tmp_path, tokenized_sample):
    """`status` and `cancel` read configs and run files only: they import no torch (status took 2 s, most of it
    torch's import through the planner's checks, for a question a user on a login node asks often). Without live
    jobs, cancel needs no SLURM commands."""
    spec = {"name": "q", "configs": ["configs/tiny.yml"], "set": {"data_path": tokenized_sample},
            "runs": [{"name": "vanilla"}, {"name": "mswa", "set": {"attention_type": "mswa"}}]}
    sweep, out = _write(tmp_path, spec), tmp_path / "runs"
    assert sweep_main([str(sweep), "plan", "--out", str(out)]) == 0
    code = ("import sys; from neox_dar.sweep.__main__ import main; "
            f"codes = [main([{str(out)!r}, c]) for c in ('status', 'cancel')]; "
            "print(codes, sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    env = {**os.environ, "PATH": str(tmp_path)}  # no squeue, no scancel
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "[0, 0] []", proc.stdout + proc.stderr
    assert lines[-2] == "cancel: 0 waiting job(s) cancelled, 0 running job(s) stopping; 2 of 2 run(s) had no live job"


# ---------------------------------------------------------------------------------------------------------------
# mistakes surface at plan/submit time (issue 21, item 3)


def _write(tmp_path: Path, spec: dict, name: str = "s.yml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("mistake, message", [
    ({"eval": {"source": "local", "max_doc": 3}}, "unknown eval setting(s) max_doc"),
    ({"eval": {"source": "local", "corpora": ["fineweb"]}}, "eval corpora must be a list drawn from"),
    ({"slurm": {"gpus_per_nod": 1}}, "unknown slurm setting(s) gpus_per_nod"),
    ({"report": {"basline": {"attention_type": "vanilla"}}}, "unknown report setting 'basline'; did you mean "
                                                             "'baseline'?"),
    ({"report": {"baseline": {"run": "vanila"}}}, "the baseline {'run': 'vanila'} matches no run"),
    ({"report": {"metric": "ppl"}}, "report metric must be one of"),
])
def test_sweep_mistakes_are_one_line_errors_at_plan(tmp_path, capsys, tokenized_sample, mistake, message):
    spec = {"name": "m", "configs": ["configs/tiny.yml"], "set": {"data_path": tokenized_sample},
            "runs": [{"name": "vanilla"}, {"name": "dar", "set": {"attention_type": "dar"}}], **mistake}
    assert sweep_main([str(_write(tmp_path, spec)), "plan", "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()  # nothing written


def test_grid_mistakes_name_the_sweep_file_and_a_dotted_axis_names_runs(tmp_path):
    """A key given twice in a sweep file (the first `set:` was dropped), a file that is not YAML, an exclude whose
    value matches no grid point (it excluded nothing), an empty axis (the message did not name the file) and two runs
    with one config (an option's `set` replacing the earlier axis's key: `w8-swa2` and `w16-swa2` both trained
    window 32) are one line naming the file; a name_template may name a dotted axis (it failed as "not a grid
    axis")."""
    base = "name: g\nconfigs: [configs/tiny.yml, configs/attention/swa.yml]\n"
    cases = {"set: {train_iters: 2}\nset: {train_iters: 3}\ngrid: {window_size: [8, 16]}\n":
             "'set' is given twice in {f}:4 (the mapping repeats it)",
             "grid: {window_size: [8, 16]}\nexclude: [{window_size: 32}]\n":
             "{f}: exclude {{'window_size': 32}} matches no grid point",
             "grid: {window_size: []}\n": "{f}: grid axis 'window_size' must be a non-empty list",
             "grid:\n  window_size: [8, 16]\n  attention: {swa2: {set: {window_size: 32}}}\n":
             "{f}: runs 'w8-swa2' and 'w16-swa2' have the same config",
             # two spellings of one key in a set: the last won silently
             "set: {train-iters: 2, train_iters: 3}\ngrid: {window_size: [8, 16]}\n":
             "'train_iters' is given twice in {f} (set) (as 'train-iters' and 'train_iters')",
             "grid: {window_size: {a: {train-iters: 2, train_iters: 3}}}\n":
             "'train_iters' is given twice in grid axis 'window_size' option 'a'",
             # not YAML: PyYAML's four-line message
             "grid:\n  window_size: [8\n  b: 2\n": "malformed YAML in {f}:5:4: expected ',' or ']', but got ':'"}
    for i, (body, said) in enumerate(cases.items()):
        f = tmp_path / f"g{i}.yml"
        f.write_text(base + body)
        with pytest.raises(SweepError) as e:
            plan(load_sweep(f), tmp_path / "runs")
        assert said.format(f=f) in str(e.value) and "\n" not in str(e.value), str(e.value)
    f = tmp_path / "lr.yml"
    f.write_text(base + "grid: {optimizer.params.lr: [0.001, 0.002]}\nname_template: 'lr{optimizer.params.lr}'\n")
    planned = plan(load_sweep(f), tmp_path / "runs")
    assert [(p.spec.name, p.cfg.training.optimizer.params.lr) for p in planned] == [("lr0.001", 1e-3), ("lr0.002", 2e-3)]


def test_runs_are_checked_for_their_world_size_and_data(tmp_path, capsys, fake_queue, tokenized_sample):
    """The shipped paper sweeps leave data_path unset: plan and submit refuse them (every job would fail with "no
    training data"); a global batch that does not divide over the ranks `submit` asks for fails before queueing."""
    for command in (["plan"], ["submit", "--dry-run"]):
        assert sweep_main([str(SWEEPS / "dar-table1.yml"), *command, "--out", str(tmp_path / "t1")]) == 2
        assert "no training data" in capsys.readouterr().err
    spec = {"name": "b", "configs": ["configs/tiny.yml"], "set": {"data_path": tokenized_sample},
            "runs": [{"name": "a"}]}  # tiny: global batch 16, micro-batch 8
    path = _write(tmp_path, spec)
    args = [str(path), "submit", "--out", str(tmp_path / "b"), "--gpus-per-node", "0", "--cpus-per-task", "1"]
    assert sweep_main([*args, "--nproc-per-node", "3"]) == 2
    assert "run 'a' on 3 rank(s): train_batch_size=16 is not divisible" in capsys.readouterr().err
    assert not fake_queue.exists()
    assert sweep_main([*args, "--nproc-per-node", "2"]) == 0 and fake_queue.exists()
    assert sweep_main([str(path), "plan", "--out", str(tmp_path / "c"), "--world-size", "3"]) == 2
    assert sweep_main([str(path), "run", "--local", "--out", str(tmp_path / "c"), "--nproc", "3"]) == 2
    assert not (tmp_path / "c").exists()


def test_key_value_overrides_apply_to_every_run_and_are_recorded(tmp_path, capsys, tokenized_sample):
    spec = {"name": "o", "configs": ["configs/tiny.yml"], "grid": {"attention_type": ["vanilla", "swa"]}}
    path = _write(tmp_path, spec)
    out = tmp_path / "runs"
    assert sweep_main([str(path), "plan", "--out", str(out), f"data_path={tokenized_sample}", "train_iters=7"]) == 0
    for run in ("vanilla", "swa"):
        cfg = load_config(out / run / "config.yml")
        assert (cfg.data.data_path, cfg.training.train_iters) == (tokenized_sample, 7)
    copy = load_sweep(out)
    assert copy.overrides == [f"data_path={tokenized_sample}", "train_iters=7"]
    # later commands reuse them (and say so); a key given again replaces its value
    capsys.readouterr()
    assert sweep_main([str(path), "plan", "--out", str(out), "train_iters=9"]) == 0
    assert (f"plan: reusing the overrides recorded in {out / 'sweep.yml'} by an earlier command: "
            f"data_path={tokenized_sample} (key=value replaces one)") in capsys.readouterr().err  # not train_iters=7
    assert load_config(out / "swa" / "config.yml").training.train_iters == 9
    assert load_config(out / "swa" / "config.yml").data.data_path == tokenized_sample
    assert sweep_main([str(path), "plan", "--out", str(out)]) == 0
    assert f"data_path={tokenized_sample} train_iters=9 (key=value" in capsys.readouterr().err
    assert load_sweep(out).overrides == [f"data_path={tokenized_sample}", "train_iters=9"]
    assert sweep_main([str(path), "plan", "--out", str(out), "train_iters"]) == 2
    assert "must look like key=value" in capsys.readouterr().err


def test_a_directory_never_planned_is_named_by_status_cancel_and_run(tmp_path, capsys, monkeypatch,
                                                                         tokenized_sample):
    """Planned with --out elsewhere, then `status`, `cancel` and `run --local` without --out: status said every
    run was pending and cancel that none had jobs (in runs/NAME, never planned), and run failed on the missing
    data_path the plan had recorded; now status and cancel name the folder, and run's error says where the
    overrides are."""
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, {"name": "far", "configs": [str(ROOT / "configs/tiny.yml")], "runs": [{"name": "x"}]})
    assert sweep_main([str(path), "plan", "--out", str(tmp_path / "elsewhere"), f"data_path={tokenized_sample}"]) == 0
    default = tmp_path / "runs" / "far"
    capsys.readouterr()
    for command in ("status", "cancel"):
        assert sweep_main([str(path), command]) == 2
        err = capsys.readouterr().err
        assert err == (f"sweep error: {default} holds no plan of sweep 'far' (no sweep.yml there): plan, run or submit "
                       "it first, or pass the output directory it was planned in (--out DIR, or DIR as SWEEP)\n")
    assert sweep_main([str(path), "run", "--local"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweep error: run 'x' on 1 rank(s): no training data") and err.count("\n") == 1
    assert err.endswith(f"({default}, the default output directory, holds no plan of this sweep: the key=value "
                        "overrides an earlier `plan --out DIR` recorded are reused with that --out DIR)\n")
    assert not default.exists()


# ---------------------------------------------------------------------------------------------------------------
# one sweep per directory, one trainer per run (item 6)


def test_a_directory_holds_one_sweep(tmp_path, capsys, tokenized_sample):
    out = tmp_path / "runs"
    a = _write(tmp_path, {"name": "a", "configs": ["configs/tiny.yml"], "runs": [{"name": "x"}]}, "a.yml")
    b = _write(tmp_path, {"name": "b", "configs": ["configs/tiny.yml"], "runs": [{"name": "y"}]}, "b.yml")
    assert sweep_main([str(a), "plan", "--out", str(out), f"data_path={tokenized_sample}"]) == 0
    for command in (["plan"], ["status"], ["run", "--local"], ["submit", "--dry-run"], ["cancel"]):
        assert sweep_main([str(b), *command, "--out", str(out)]) == 2
        assert "holds the sweep 'a', not 'b'" in capsys.readouterr().err
    assert load_sweep(out).name == "a" and not (out / "y").exists()
    assert sweep_main([str(b), "plan", "--out", str(out), "--force", f"data_path={tokenized_sample}"]) == 0
    assert load_sweep(out).name == "b"
    # a run directory, or a file, as --out: one line, nothing written (the sweep was planned into the run; a
    # traceback)
    (tmp_path / "a-file").write_text("x")
    for where, said in ((out / "y", "is a run directory (it holds config.yml)"), (tmp_path / "a-file", "is a file")):
        assert sweep_main([str(a), "plan", "--out", str(where), f"data_path={tokenized_sample}"]) == 2
        err = capsys.readouterr().err.splitlines()[-1]  # after the plan's warnings
        assert err.startswith("sweep error: ") and said in err, err
    assert not (out / "y" / "x").exists()


def test_a_second_trainer_on_a_run_directory_exits_with_one_line(tmp_path, tokenized_sample):
    """While a trainer holds a run directory, another train.py on the same save stops at once (exit 2, one line),
    leaving the run's status alone; `run --local` skips a run another trainer holds."""
    from trainrun import train_command, train_env

    save = tmp_path / "run"
    save.mkdir()
    (save / "status.json").write_text(json.dumps({"state": "running", "step": 3, "train_iters": 6}))
    lock = lock_run_dir(save)
    lock.record()
    try:
        proc = subprocess.run(train_command(save, tokenized_sample), cwd=ROOT, env=train_env(), capture_output=True,
                              text=True, timeout=300)
    finally:
        lock.release()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {save} is in use by another trainer (pid ")
    assert "Traceback" not in proc.stderr
    assert json.loads((save / "status.json").read_text())["state"] == "running"  # the holder's, untouched


# ---------------------------------------------------------------------------------------------------------------
# status: progress from the metrics, the queue from SLURM (item 4)


def test_status_reads_progress_from_metrics_and_the_queue_from_slurm(four_runs, fake_queue, capsys):
    _, out = four_runs
    queue = fake_queue.parent / "queue.txt"
    # w2: its SLURM job runs; the trainer wrote status.json (step 0) when it started and metrics up to step 7
    (out / "w2" / "status.json").write_text(json.dumps({"state": "running", "step": 0, "train_iters": 20}))
    (out / "w2" / "slurm_jobs.txt").write_text("80_1\n")
    # w3: trained here now (it holds its lock) although old SLURM jobs of it are recorded
    (out / "w3" / "status.json").write_text(json.dumps({"state": "running", "step": 10, "train_iters": 20}))
    (out / "w3" / "slurm_jobs.txt").write_text("55\n")
    _fake_run(out / "w3", None, 15, 2.75)
    # w1: trained, not evaluated (the sweep evaluates), its requeued job waits in the queue
    (out / "w1" / "slurm_jobs.txt").write_text("81_0\n")
    queue.write_text("80_1 RUNNING\n81_0 PENDING\n")
    lock = lock_run_dir(out / "w3")
    try:
        capsys.readouterr()
        assert sweep_main([str(out), "status"]) == 0
        lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[1:-1]}
    finally:
        lock.release()
    assert lines["w2"].split()[1:3] == ["running", "7/20"]  # not 0/20
    assert "80_1 RUNNING" in lines["w2"]
    assert lines["w3"].split()[1:3] == ["running", "15/20"]  # not stale at 10
    assert lines["w1"].split()[1] == "queued"
    assert run_state(out / "w3").state == "stale"  # lock released, job 55 gone: nothing runs it
    capsys.readouterr()
    assert sweep_main([str(out), "cancel"]) == 0
    text = capsys.readouterr().out
    assert "cancel: 1 waiting job(s) cancelled, 1 running job(s) stopping; 3 of 5 run(s) had no live job" in text
    calls = sorted((fake_queue.parent / "scancel.log").read_text().splitlines())
    assert calls == ["--batch --signal=TERM 80_1", "81_0"]


# ---------------------------------------------------------------------------------------------------------------
# windows that cover the sequence (item 11)


def test_a_window_covering_the_sequence_is_reported(tmp_path, capsys, tokenized_sample):
    """configs/attention/dar.yml sets window_size 128 over tiny's 16: at seq_length 128 that is vanilla attention."""
    spec = {"name": "w", "configs": ["configs/tiny.yml"], "set": {"data_path": tokenized_sample},
            "runs": [{"name": f"{a}-w{w}", "configs": [f"configs/attention/{a}.yml"], "set": {"window_size": w}}
                     for a in ("dar", "swa", "aha") for w in (128, 16)]}
    assert sweep_main([str(_write(tmp_path, spec)), "plan", "--out", str(tmp_path / "runs")]) == 0
    err = capsys.readouterr().err
    for a in ("dar", "swa", "aha"):
        assert f"warning: {a}-w128: window_size=128 >= seq_length=128" in err and "vanilla attention" in err
        assert f"warning: {a}-w16: window_size" not in err


# ---------------------------------------------------------------------------------------------------------------
# a local sweep end to end: extension, evaluation freshness, per-run TensorBoard, W&B (items 5 and 7)


def _wandb_log(run_dir: Path) -> bytes:
    """The bytes of every offline W&B run file of a run (the records hold each logged key and its JSON value)."""
    return b"".join(f.read_bytes() for f in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")))


def test_local_sweep_extends_runs_and_evaluates_newer_checkpoints(tmp_path, capsys, monkeypatch,
                                                                  byte_tokenized_sample):
    """A raised train_iters re-opens finished runs (before: `run --local` said "done, skipped"); a run trained past
    its evaluation is evaluated again (before: the table kept the old step's numbers, silently); every run gets its
    own TensorBoard directory under a shared tensorboard_dir; the evaluation reaches the run's W&B run. (On the
    byte-tokenized sample: the sweep's bookkeeping is what is checked.)"""
    from neox_dar.report.__main__ import main as report_main
    from trainrun import BYTE_TOKENIZER, train_env

    spec = {"name": "ext", "configs": ["configs/tiny.yml", "configs/attention/vanilla.yml"],
            "set": {"data_path": byte_tokenized_sample, "vocab_file": str(BYTE_TOKENIZER), "vocab_size": 257,
                    "seq_length": 32, "train_iters": 2, "train_batch_size": 8,
                    "train_micro_batch_size_per_gpu": 4, "log_interval": 1, "eval_interval": 0,
                    "checkpoint_factor": 2, "precision": "fp32", "use_wandb": True, "wandb_project": "tests",
                    "tensorboard_dir": str(tmp_path / "tb")},
            "runs": [{"name": "a"}, {"name": "b", "set": {"seed": 2}}],
            "eval": {"source": "local", "corpora": ["c4"], "max_docs": 1, "extra": {"notes": str(tmp_path / "n.jsonl")}}}
    notes = ["A held-out note about attention windows.", "Another note, about sweeps and their reports."]
    (tmp_path / "n.jsonl").write_text("".join(json.dumps({"title": f"n{i}", "text": t}) + "\n"
                                              for i, t in enumerate(notes)))
    path, out = _write(tmp_path, spec), tmp_path / "runs"
    for key, value in train_env().items():
        monkeypatch.setenv(key, value)  # the sweep's train.py and eval.perplexity inherit this environment
    assert sweep_main([str(path), "run", "--local", "--out", str(out)]) == 0
    for run in ("a", "b"):  # one TensorBoard directory per run, each with its own steps
        assert list((tmp_path / "tb" / run).glob("events.out.tfevents.*")), run
        result = json.loads((out / run / "eval" / "perplexity.json").read_text())
        assert result["step"] == 2 and result["corpora"]["notes"]["documents"] == 2  # the extra corpus beside c4
        log = _wandb_log(out / run)  # the evaluation reached the run's W&B run
        assert b"eval/c4/token_perplexity" in log and json.dumps(result["corpora"]["c4"]["token_perplexity"]).encode() in log
    assert not list((tmp_path / "tb").glob("events.out.tfevents.*"))
    capsys.readouterr()
    assert sweep_main([str(out), "run", "--local"]) == 0
    assert capsys.readouterr().out.count("done, skipped") == 2

    # raise train_iters: the finished runs re-open; `run` trains `a` from its step-2 checkpoint to 3, evaluates step 3
    assert sweep_main([str(path), "plan", "--out", str(out), "train_iters=3"]) == 2  # checkpoints: needs --force
    assert sweep_main([str(path), "plan", "--out", str(out), "train_iters=3", "--force"]) == 0
    assert run_state(out / "a", want_eval=True).state == "extend"
    assert sweep_main([str(path), "run", "--local", "--out", str(out), "--only", "a"]) == 0
    assert [json.loads(line)["step"] for line in (out / "a" / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert json.loads((out / "a" / "eval" / "perplexity.json").read_text())["step"] == 3

    # `b` extended outside the sweep (train.py on its config): its step-2 evaluation is out of date
    proc = subprocess.run([sys.executable, "train.py", str(out / "b" / "config.yml")], cwd=ROOT, env=train_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    st = run_state(out / "b", want_eval=True)
    assert (st.state, st.checkpoint, st.eval_step) == ("trained", 3, 2)
    assert report_main([str(out), "--no-figures"]) == 0
    assert "b: evaluated at step 2 but trained to step 3" in capsys.readouterr().out
    assert sweep_main([str(out), "run", "--local"]) == 0
    text = capsys.readouterr().out
    assert "a: done, skipped" in text and "b: training" not in text
    result = json.loads((out / "b" / "eval" / "perplexity.json").read_text())
    assert result["step"] == 3 and set(result["corpora"]) == {"c4", "notes"}
    assert sweep_main([str(out), "status"]) == 0
    assert "2 done" in capsys.readouterr().out
    assert report_main([str(out), "--no-figures"]) == 0
    header = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| Run "))
    assert "| C4 |" in header and "| notes |" in header


# ---------------------------------------------------------------------------------------------------------------
# the README's walkthrough, as written


def _readme_experiments() -> tuple[dict[str, str], list[list[str]]]:
    """The README's "Experiments" section: its sweep files (a yaml block after a line naming the file) and the
    commands of each bash block, in order (comments cut)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Experiments\n") + 1:]
    section = section[:section.index("\n## ")]
    files, blocks = {}, []
    for name, lang, body in re.findall(r"(?:`([\w.-]+)`:\n\n)?```(\w+)\n(.*?)```", section, re.S):
        if lang == "yaml":
            files[name] = body
        else:
            blocks.append([line.split("  #")[0].strip() for line in body.splitlines() if line.strip()])
    return files, blocks


def _shell(commands: list[str], cwd: Path, env: dict) -> list[str]:
    outputs = []
    for command in commands:
        proc = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        outputs.append(proc.stdout)
    return outputs


def test_readme_experiments_walkthrough(tmp_path):
    """Every command of the README's Experiments section, as written, in fresh directories (the repository's
    configs and data linked in): tokenize, plan, run, status, report in one; the SLURM commands, which the README
    gives in place of `run --local`, after the same `plan` in another, with fake sbatch/squeue/scancel."""
    from trainrun import train_env

    files, blocks = _readme_experiments()
    slurm = [b for b in blocks if any(" submit" in c for c in b)]
    local = [c for b in blocks if b not in slurm for c in b]
    assert list(files) == ["my-sweep.yml"] and len(slurm) == 1 and len(local) >= 5
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # `python` runs this interpreter through a script, not a symlink: a symlink to a virtual environment's python,
    # outside that environment's bin/, starts the base interpreter without the environment's packages
    _executable(bin_dir / "python", f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    _executable(bin_dir / "sbatch", f"#!/bin/bash\necho \"$@\" >> {tmp_path}/sbatch.log\necho 42\n")
    _executable(bin_dir / "squeue", "#!/bin/bash\n[[ $4 == 42_* ]] && echo \"$4 PENDING\"\nexit 0\n")
    _executable(bin_dir / "scancel", f"#!/bin/bash\necho \"$@\" >> {tmp_path}/scancel.log\n")
    env = train_env(PATH=f"{bin_dir}:{os.environ['PATH']}")
    here, cluster = tmp_path / "here", tmp_path / "cluster"
    for d in (here, cluster):
        d.mkdir()
        for name, body in files.items():
            (d / name).write_text(body)
        for link in ("configs", "data"):
            (d / link).symlink_to(ROOT / link)

    outputs = dict(zip(local, _shell(local, here, env)))
    out = here / "runs" / "my-sweep"
    table = json.loads((out / "report" / "table.json").read_text())
    assert [row[0] for row in table["rows"]] == ["vanilla", "dar", "swa"]
    rel = table["columns"].index("Rel. (%)")
    assert all(isinstance(row[rel], float) for row in table["rows"]) and table["rows"][0][rel] == 100.0
    for figure in ("relative_ppl_vs_step.png", "loss_curves.png", "cost_vs_perplexity.png"):
        assert (out / "report" / figure).is_file()
    assert "3 done" in next(o for c, o in outputs.items() if c.endswith(" status"))

    (cluster / "runs").mkdir()
    (cluster / "runs" / "data").symlink_to(here / "runs" / "data")
    plan_command = next(c for c in local if " plan " in c)
    outputs = _shell([plan_command, *slurm[0]], cluster, env)
    script = cluster / "runs" / "my-sweep" / "slurm" / "my-sweep.sbatch"
    assert script.is_file() and "#SBATCH --array=0-2" in script.read_text()
    assert (tmp_path / "sbatch.log").read_text().split()[-1] == str(script)  # submitted once, after the dry run
    assert sorted((tmp_path / "scancel.log").read_text().splitlines()) == ["42_0", "42_1", "42_2"]
    assert "3 queued" in next(o for c, o in zip(slurm[0], outputs[1:]) if c.endswith(" status"))
    assert outputs[-1].strip().splitlines()[-1].startswith("cancel: 3 waiting job(s) cancelled")


def test_plan_never_writes_through_a_symbolic_link(tmp_path):
    """plan's files (the sweep copy, each run's config.yml and run.json) are written aside and renamed into place:
    a link planted where one of them goes is replaced, and the file it pointed to is left as it was."""
    spec = {"name": "links", "configs": ["configs/tiny.yml"], "runs": [{"name": "a"}]}
    sweep = parse_sweep(spec, tmp_path / "links.yml")
    root = write_plan(sweep, plan(sweep, tmp_path / "out"))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    for path in (root / "sweep.yml", root / "a" / "config.yml", root / "a" / "run.json"):
        path.unlink()
        path.symlink_to(victim)
    write_plan(sweep, plan(sweep, tmp_path / "out"))
    assert victim.read_text() == "keep me\n"
    assert not any(p.is_symlink() for p in (root / "sweep.yml", root / "a" / "config.yml", root / "a" / "run.json"))
    assert load_config(root / "a" / "config.yml").model.num_layers == 2


def test_run_local_commands_outlive_a_killed_sweep(tmp_path):
    """`run --local` killed (SIGKILL, or SIGHUP from a lost terminal) while a command runs: the command writes its
    own output to the run's log, so it goes on to its end (a trainer to its next checkpoint and beyond) instead of
    dying on a broken pipe at its next line (a trainer then marked the run failed and lost its steps since the last
    checkpoint)."""
    import signal
    import subprocess
    import time

    marker, log = tmp_path / "finished", tmp_path / "logs" / "train.log"
    child = (f"import time\nfor i in range(6):\n    print('line', i, flush=True)\n    time.sleep(0.3)\n"
             f"open({str(marker)!r}, 'w').write('done')\n")
    parent = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; from neox_dar.sweep.local "
                               f"import _run_logged; sys.exit(_run_logged([sys.executable, '-c', {child!r}], "
                               f"Path({str(log)!r})))"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert parent.stdout.readline() == "line 0\n"  # echoed from the log
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 30
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert marker.read_text() == "done"
    assert log.read_text().splitlines()[-6:] == [f"line {i}" for i in range(6)]


def test_device_checks_apply_where_the_runs_train(tmp_path, tokenized_sample, monkeypatch):
    """fp16 and attention_impl triton need CUDA where a run trains: `run --local` on this CPU refuses them, while
    `plan` and `submit` (checked on a login node without GPUs, for GPU nodes) accept them (they were refused)."""
    from neox_dar.sweep.planning import check_runs

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    f = tmp_path / "gpu.yml"
    f.write_text(f"name: gpu\nconfigs: [configs/tiny.yml, configs/attention/swa.yml]\nset: {{data_path: "
                 f"{tokenized_sample}, attention_impl: triton}}\ngrid: {{precision: [fp16, fp32]}}\n")
    planned = plan(load_sweep(f), tmp_path / "runs")
    check_runs(planned, 1)  # plan, submit
    with pytest.raises(SweepError, match="run 'fp16' on 1 rank\\(s\\): precision fp16 needs a CUDA GPU"):
        check_runs(planned, 1, here=True)
    with pytest.raises(SweepError, match="run 'fp32' on 1 rank\\(s\\): attention_impl=triton needs a CUDA GPU"):
        check_runs(planned[1:], 1, here=True)
