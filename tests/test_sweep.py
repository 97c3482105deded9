"""Sweep files: expansion, names, the papers' plans, written configs, status, and submit's skip rules."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from neox_dar.config import load_config
from neox_dar.sweep.__main__ import main as sweep_main
from neox_dar.sweep.rundir import run_state
from neox_dar.sweep.spec import SweepError, load_sweep, parse_sweep, plan, write_plan

from builders import published_checkpoint

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
    assert "vanilla" in m and len(m) == 11
    _, a = _plan("aha-window", tmp_path / "a")
    assert sorted(c.model.attention.window_size for n, c in a.items() if n != "vanilla") == [16, 32, 64, 128, 256]
    assert all(c.model.attention.aha_l1_coef == pytest.approx(3e-4) for n, c in a.items() if n != "vanilla")
    _, l1 = _plan("aha-l1", tmp_path / "l1")
    runs = [c.model.attention for n, c in l1.items() if n != "vanilla"]
    assert sorted(a.aha_l1_coef for a in runs) == pytest.approx([1e-4, 3e-4, 1e-3])
    assert all(a.window_size == 128 and a.attention_type == "aha" for a in runs)


def test_plan_writes_resolved_configs_and_is_deterministic(tmp_path, capsys):
    assert sweep_main([str(SWEEPS / "dar-table1.yml"), "plan", "--out", str(tmp_path / "a")]) == 0
    first = capsys.readouterr().out
    assert "19073" in first and "256 x 2048" in first and "7 runs" in first
    assert sweep_main([str(SWEEPS / "dar-table1.yml"), "plan", "--out", str(tmp_path / "a")]) == 0
    assert capsys.readouterr().out == first
    cfg = load_config(tmp_path / "a" / "dar-d64" / "config.yml")
    assert cfg.model.attention.dar_d_down == 64 and cfg.run.save == str((tmp_path / "a" / "dar-d64").resolve())
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
    with pytest.raises(SweepError, match="duplicate run names"):
        parse_sweep({**base, "grid": {"window_size": [4]}, "runs": [{"name": "w4"}]})
    with pytest.raises(SweepError, match="unknown key"):
        parse_sweep({**base, "grids": {}})
    with pytest.raises(SweepError, match="no runs"):
        parse_sweep(base)
    with pytest.raises(SweepError, match="window_sizes"):
        plan(parse_sweep({**base, "grid": {"window_sizes": [4]}}), tmp_path)
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
def four_runs(tmp_path):
    spec = {"name": "st", "configs": ["configs/tiny.yml"], "set": {"train_iters": 20},
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
    states = {d: run_state(out / d) for d in ("w1", "w2", "w3", "w4", "w5")}
    assert {d: s.state for d, s in states.items()} == {
        "w1": "done", "w2": "running", "w3": "interrupted", "w4": "failed", "w5": "pending"}
    assert states["w2"].step == 7 and states["w2"].loss == 3.25  # torn last line ignored
    assert states["w3"].checkpoint == 10
    capsys.readouterr()
    assert sweep_main([str(out), "status"]) == 0
    text = capsys.readouterr().out
    line = next(ln for ln in text.splitlines() if ln.startswith("w2 "))
    assert "running" in line and "7/20" in line and "3.2500" in line
    assert "1 done" in text and "1 pending" in text


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture()
def fake_queue(tmp_path, monkeypatch):
    """sbatch that answers job 77 (and logs its calls); squeue that knows only 77's array tasks, as pending."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "sbatch", f"#!/bin/bash\necho \"$@\" >> {tmp_path}/sbatch.log\necho 77\n")
    _executable(bin_dir / "squeue", "#!/bin/bash\n[[ $4 == 77_* ]] && echo \"$4 PENDING\"\nexit 0\n")
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
    assert sweep_main(args) == 0
    assert "wrote" in capsys.readouterr().out
    for run in ("w4", "w5"):
        script = (out / "slurm" / f"st.{run}.sbatch").read_text()
        assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=4" in script
        assert "#SBATCH --partition=gpu" in script and "--array" not in script
        assert not (out / run / "slurm_jobs.txt").exists()
