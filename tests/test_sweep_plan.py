"""`sweep plan` at cluster scale (issue 37): presets that fit common GPU counts, the epochs a budget reads, and the
cost table (GPU-hours from a measured throughput, checkpoint size, peak memory per rank)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from neox_dar.config import load_config
from neox_dar.sweep.__main__ import main as sweep_main
from neox_dar.sweep.cost import (RESULTS, checkpoint_bytes, measurement_for, parameter_count, peak_memory)

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = ROOT / "configs" / "sweeps"
WORLD_SIZES = (1, 8, 16, 32, 64, 128)


def _write(tmp_path: Path, spec: dict, name: str = "s.yml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def _rows(out: str) -> dict[str, dict[str, str]]:
    """The plan table's rows by run name (columns split at two or more spaces)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("run "))
    keys = re.split(r"\s{2,}", lines[start].strip())
    rows = {}
    for line in lines[start + 1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(keys):
            break
        rows[cells[0]] = dict(zip(keys, cells))
    return rows


def test_the_presets_plan_at_common_cluster_sizes_with_the_papers_batches(tmp_path, capsys, tokenized_sample):
    """Every Pythia preset with its paper's global batch (DAR: 256 at 14M-70M, 896 at 160M and 410M) plans at 1, 8,
    16, 32, 64 and 128 ranks: where the preset's micro-batch does not divide the global batch over the ranks, the plan
    takes the largest one below it that does and says so; the global batch never changes. A micro-batch the user
    gives is kept, and then a misfit is the config error listing the micro-batches that fit."""
    sizes = ("14m", "31m", "70m", "160m", "410m")
    spec = {"name": "presets", "set": {"data_path": tokenized_sample},
            "runs": [{"name": s, "configs": [f"configs/pythia-{s}.yml"]} for s in sizes]}
    path = _write(tmp_path, spec)
    papers = {"14m": 256, "31m": 256, "70m": 256, "160m": 896, "410m": 896}
    for world in WORLD_SIZES:
        out = tmp_path / f"w{world}"
        assert sweep_main([str(path), "plan", "--out", str(out), "--world-size", str(world)]) == 0
        printed = capsys.readouterr()
        rows = _rows(printed.out)
        for size, batch in papers.items():
            cfg = load_config(out / size / "config.yml")
            micro = cfg.training.train_micro_batch_size_per_gpu
            preset = load_config(ROOT / f"configs/pythia-{size}.yml").training.train_micro_batch_size_per_gpu
            assert cfg.training.train_batch_size == batch and micro <= preset
            accum = cfg.training.gradient_accumulation_for(world)
            assert micro * accum * world == batch
            assert rows[size]["micro x accum x ranks"] == f"{micro} x {accum} x {world}"
            assert rows[size]["batch"] == f"{batch} x 2048"
            note = re.search(rf"note: ([\w, ]*\b{size}\b[\w, ]*): micro-batch {preset} \(from the config files\) "
                             rf"does not divide the global batch {batch} over {world} ranks: using {micro} ",
                             printed.err)
            assert bool(note) == (micro != preset), printed.err
    # pythia-160m on 16 ranks, the case: 896 / 16 = 56 sequences per rank, 14 x 4
    assert load_config(tmp_path / "w16" / "160m" / "config.yml").training.train_micro_batch_size_per_gpu == 14
    assert sweep_main([str(path), "plan", "--out", str(tmp_path / "given"), "--world-size", "16", "--only", "160m",
                       "train_micro_batch_size_per_gpu=16"]) == 2
    assert ("micro-batches that fit 16 ranks: 1, 2, 4, 7, 8, 14, 28" in capsys.readouterr().err)


PAPER_SWEEPS = ("dar-table1", "dar-table2", "dar-table3", "aha-l1", "aha-window", "mswa-vs-swa", "mswa-linear",
                "mswa-table6")


@pytest.mark.parametrize("world", [16, 128])
def test_the_paper_sweeps_plan_at_16_and_128_ranks(tmp_path, capsys, tokenized_sample, world):
    """The issue's setup, 2 nodes x 8 GPUs, and 128 GPUs: every paper sweep on the Pile plans as shipped (no
    micro-batch given). Not MSWA's enwik8 sweep: its paper's global batch of 24 sequences cannot be split over 16
    ranks, which its error says (a global batch of 48 x k would)."""
    for name in PAPER_SWEEPS:
        assert sweep_main([str(SWEEPS / f"{name}.yml"), "plan", "--out", str(tmp_path / name), "--world-size",
                           str(world), f"data_path={tokenized_sample}"]) == 0, name
        assert f"checked for {world} rank(s) each" in capsys.readouterr().out


def _budget_sweep(tmp_path: Path, data: str, steps: int, **extra) -> Path:
    """tiny (16 x 128 = 2,048 tokens a step) on the 20,000-token sample: 9 steps read it 0.92 times, 10 steps 1.02."""
    spec = {"name": "budget", "configs": ["configs/tiny.yml"], "set": {"train_iters": steps, **extra.pop("set", {})},
            "runs": [{"name": "a"}], **extra}
    return _write(tmp_path, {**spec, "overrides": [f"train_data_paths=[{data}]"] if data else []}, f"b{steps}.yml")


def test_a_budget_above_one_epoch_is_warned_unless_intended(tmp_path, capsys, tokenized_sample):
    def plan(path, *words):
        assert sweep_main([str(path), "plan", "--out", str(tmp_path / "out"), "--force", *words]) == 0
        return capsys.readouterr().err

    assert "more than max_epochs" not in plan(_budget_sweep(tmp_path, tokenized_sample, 9))
    err = plan(_budget_sweep(tmp_path, tokenized_sample, 10))
    assert ("warning: a: token budget: 20,480 tokens = 1.02 epochs of the training data, more than max_epochs = 1"
            in err)
    assert "more than max_epochs" not in plan(_budget_sweep(tmp_path, tokenized_sample, 10), "--max-epochs", "1.5")
    assert "more than max_epochs" not in plan(_budget_sweep(tmp_path, tokenized_sample, 10, max_epochs=2))
    assert sweep_main([str(_budget_sweep(tmp_path, tokenized_sample, 10, max_epochs=0)), "plan", "--out",
                       str(tmp_path / "x")]) == 2
    assert "'max_epochs' must be a number > 0" in capsys.readouterr().err
    assert sweep_main([str(_budget_sweep(tmp_path, tokenized_sample, 10)), "plan", "--out", str(tmp_path / "x"),
                       "--max-epochs", "0"]) == 2
    assert capsys.readouterr().err.strip() == "sweep error: --max-epochs must be > 0, got 0"
    for command, flag in (("plan", "--world-size"), ("run", "--nproc")):  # (before: 0 planned for one rank)
        assert sweep_main([str(_budget_sweep(tmp_path, tokenized_sample, 10)), command, "--out", str(tmp_path / "x"),
                           *(["--local"] if command == "run" else []), flag, "0"]) == 2
        assert capsys.readouterr().err.strip() == f"sweep error: {flag} must be >= 1, got 0"
    assert not (tmp_path / "x").exists()


def test_a_held_out_split_of_a_file_sized_to_the_budget_is_warned(tmp_path, capsys, tokenized_sample):
    """docs/data.md: do not combine a token budget with split 969,30,1. The sample was tokenized to a budget
    (--max-tokens 20000, in its manifest): its held-out split is warned about even within one epoch; split=100,0,0
    is not."""
    path = _budget_sweep(tmp_path, None, 9, set={"data_path": tokenized_sample, "split": "969,30,1"})
    assert sweep_main([str(path), "plan", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert (f"warning: a: split '969,30,1' holds 3.1% of {tokenized_sample} out of training (a file tokenized to a "
            "budget, --max-tokens): the budget reads the rest 0.951 times" in err)
    assert sweep_main([str(path), "plan", "--out", str(tmp_path / "out"), "split=100,0,0"]) == 0
    assert "split" not in capsys.readouterr().err


def test_the_cost_table_uses_the_measured_throughput_and_says_which(tmp_path, capsys, tokenized_sample):
    """GPU-hours = tokens / the tokens/s measured on one GPU with the same model config, precision and compile
    setting (bench/results), wall = GPU-hours / ranks; the file and the card are named; a run no measurement fits
    says "no measurement", never a number."""
    assert sweep_main([str(SWEEPS / "dar-table2.yml"), "plan", "--out", str(tmp_path / "t2"), "--world-size", "16",
                       f"data_path={tokenized_sample}"]) == 0
    out, err = capsys.readouterr()
    rows = _rows(out)
    measured = json.loads((RESULTS / "gpu-h200-2026-11-27-fused-loss" / "tp_vanilla.json").read_text())
    hours = 5450 * 896 * 2048 / measured["engine"]["tokens_per_sec"] / 3600
    assert rows["160m-vanilla"]["GPU-h"] == f"{hours:,.1f}"
    assert rows["160m-vanilla"]["wall"] == f"{hours * 60 / 16:.0f} min"
    assert ("note: GPU-h and wall of 160m-vanilla: tokens / the throughput measured in "
            "bench/results/gpu-h200-2026-11-27-fused-loss/tp_vanilla.json: NVIDIA H200, vanilla (sdpa), "
            "micro-batch 16, ZeRO-1, bf16: 367,558 tokens/s per GPU, peak memory 15.60 GB (estimated: 13.56 GB)") in err
    assert "tp_dar.json" in err and rows["160m-dar"]["GPU-h"] != "no measurement"
    for run in ("70m-vanilla", "70m-dar", "410m-vanilla", "410m-dar"):
        assert rows[run]["GPU-h"] == rows[run]["wall"] == "no measurement"
    assert "note: no measurement: 70m-vanilla, 70m-dar, 410m-vanilla, 410m-dar" in err
    assert all(line.startswith(("sweep ", "run ")) or line.split()[0] in rows for line in out.splitlines())
    cfg = load_config(tmp_path / "t2" / "160m-vanilla" / "config.yml")
    params = parameter_count(cfg)
    assert params == 162_322_944  # the README's count
    assert rows["160m-vanilla"]["checkpoint"] == f"{18 * params / 1e9:.2f} GB x 2 kept"
    assert rows["160m-vanilla"]["memory/rank"] == f"{peak_memory(cfg, params, 16).total / 1e9:.2f} GB"


def test_another_dar_bottleneck_or_compile_setting_has_no_measurement():
    """A measurement fits only the model it measured: DAR at d_down 384 (the measured run had d/4 = 192), or a run
    with torch_compile where only the eager run of that variant was measured, gets none."""
    base = ["configs/pythia-160m.yml", "configs/attention/dar.yml"]
    assert measurement_for(load_config(*base)).path.name == "tp_dar.json"
    assert measurement_for(load_config(*base, overrides=["dar_d_down=384"])) is None
    assert measurement_for(load_config(*base, overrides=["torch_compile=true"])) is None
    assert measurement_for(load_config("configs/pythia-160m.yml", "configs/attention/mswa.yml",
                                       overrides=["torch_compile=true"])).path.name == "tp_mswa_compile.json"


@pytest.mark.parametrize("precision, stage, per_param", [("bf16", 1, 18), ("fp32", 1, 20), ("fp32", 0, 16),
                                                         ("bf16", 3, 16)])
def test_checkpoint_bytes_per_parameter(precision, stage, per_param):
    """What a checkpoint stores per parameter: the module's weights in the training precision (none under ZeRO-3),
    12 bytes of fp32 master weights and Adam moments (8 in fp32 without ZeRO) and the fp32 safetensors (4)."""
    cfg = load_config("configs/tiny.yml", overrides=[f"precision={precision}", f"zero_optimization.stage={stage}"])
    assert checkpoint_bytes(cfg, 1000) == per_param * 1000


def test_peak_memory_follows_zero_stage_checkpointing_and_micro_batch():
    cfg = load_config("configs/pythia-160m.yml", overrides=["precision=bf16"])
    p = parameter_count(cfg)
    one, eight = peak_memory(cfg, p, 1), peak_memory(cfg, p, 8)
    assert one.states == 16 * p and eight.states == pytest.approx(4 * p + 12 * p / 8, abs=1)  # ZeRO-1
    stage3 = peak_memory(cfg.replace(**{"zero_optimization": {"stage": 3}}), p, 8)
    assert stage3.states == pytest.approx(16 * p / 8, abs=1)
    ckpt = peak_memory(cfg.replace(checkpoint_activations=True), p, 1)
    assert ckpt.activations < one.activations / 5
    half = peak_memory(cfg.replace(train_micro_batch_size_per_gpu=8), p, 1)
    assert half.activations == one.activations // 2


def test_a_mixed_sweep_of_sub_grids_plans_without_excludes(tmp_path, capsys, tokenized_sample):
    """The issue's sweep, vanilla + DAR over d_down + MSWA over windows (configs/sweeps/pythia-160m-mixed.yml): a grid
    of three sub-grids, each varying its own keys, plans as 7 runs named by the keys that matter, with no exclude and
    no warning of a key a variant ignores; an exclude applies to the sub-grids that have its axes."""
    assert sweep_main([str(SWEEPS / "pythia-160m-mixed.yml"), "plan", "--out", str(tmp_path / "m"),
                       f"train_data_paths=[{tokenized_sample}]"]) == 0
    out, err = capsys.readouterr()
    names = ["vanilla", "dar-d384", "dar-d192", "dar-d96", "mswa-w128", "mswa-w256", "mswa-w512"]
    assert list(_rows(out)) == names
    assert "dar_d_down" not in err and "exclude" not in yaml.safe_load((SWEEPS / "pythia-160m-mixed.yml").read_text())
    cfgs = {n: load_config(tmp_path / "m" / n / "config.yml").model.attention for n in names}
    assert [cfgs[f"dar-d{d}"].dar_d_down for d in (384, 192, 96)] == [384, 192, 96]
    assert all(cfgs[f"dar-d{d}"].window_size == 128 for d in (384, 192, 96))
    assert [(cfgs[f"mswa-w{w}"].attention_type, cfgs[f"mswa-w{w}"].window_size) for w in (128, 256, 512)] == [
        ("mswa", 128), ("mswa", 256), ("mswa", 512)]
    assert json.loads((tmp_path / "m" / "dar-d96" / "run.json").read_text())["axes"] == {
        "attention": "dar", "dar_d_down": "d96"}
    from neox_dar.sweep.errors import SweepError
    from neox_dar.sweep.spec import parse_sweep

    grid = [{"attention_type": ["vanilla"]}, {"attention_type": ["swa"], "window_size": [4, 8]}]
    base = {"name": "g", "configs": ["configs/tiny.yml"], "grid": grid}
    assert [r.name for r in parse_sweep({**base, "exclude": [{"window_size": 8}]}).runs] == ["vanilla", "swa-w4"]
    with pytest.raises(SweepError, match="exclude names 'dar_d_down', which is not a grid axis"):
        parse_sweep({**base, "exclude": [{"dar_d_down": 8}]})
    with pytest.raises(SweepError, match="or a list of such mappings"):
        parse_sweep({**base, "grid": [{"attention_type": ["vanilla"]}, []]})


def test_a_run_taken_by_a_second_run_local_is_one_line_not_a_failure(tmp_path, capsys, monkeypatch, tokenized_sample):
    """Two `run --local` started together both see a run free; the first trainer takes its lock and the second's
    trainer is refused (train.py exits 2). The second `run --local` then says in one line that another process holds
    the run (its pid, host and start) and goes on, exit 0, instead of `failed: vanilla`."""
    import subprocess
    import sys

    from neox_dar.sweep import local

    path = _write(tmp_path, {"name": "two", "configs": ["configs/tiny.yml"], "set": {"data_path": tokenized_sample},
                             "eval": False, "runs": [{"name": "vanilla"}]})
    out = tmp_path / "runs"
    holders = []

    def refused(cmd, log):  # the other process takes the run, then this trainer is refused as train.py refuses it
        holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from neox_dar.rundir import lock_run_dir; "
                                   "lock = lock_run_dir(sys.argv[1]); lock.record(); print('held', flush=True); "
                                   "time.sleep(120)", str(out / "vanilla")], stdout=subprocess.PIPE, text=True)
        holders.append(holder)
        assert holder.stdout.readline().strip() == "held"
        return 2

    monkeypatch.setattr(local, "_run_logged", refused)
    try:
        assert sweep_main([str(path), "run", "--local", "--out", str(out)]) == 0
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    printed = capsys.readouterr()
    line = f"[sweep] vanilla: held by another process (pid {holders[0].pid} on "
    assert line in printed.out and "), skipped" in printed.out and "failed" not in printed.out + printed.err


# ---------------------------------------------------------------------------------------------------------------
# docs/cluster.md: its numbers are the code's


CLUSTER_DOC = ROOT / "docs" / "cluster.md"


def test_the_cluster_docs_plan_table_is_the_codes(tmp_path, capsys, tokenized_sample):
    """The plan table in docs/cluster.md is what `plan` prints for configs/sweeps/pythia-160m-mixed.yml, cell by
    cell, but the epochs, which the doc gives for the 10,050,797,569-token Pile subset of docs/data.md."""
    assert sweep_main([str(SWEEPS / "pythia-160m-mixed.yml"), "plan", "--out", str(tmp_path / "m"),
                       f"train_data_paths=[{tokenized_sample}]"]) == 0
    out, err = capsys.readouterr()
    doc = CLUSTER_DOC.read_text()
    block = doc[doc.index("$ python -m neox_dar.sweep configs/sweeps/pythia-160m-mixed.yml plan"):]
    block = block[:block.index("```")]
    documented, printed = _rows(block), _rows(out)
    assert list(documented) == list(printed)
    epochs = f"{5450 * 896 * 2048 / 10_050_797_569:.3g}"
    for name, row in printed.items():
        assert documented[name] == {**row, "epochs": epochs}, name
    vanilla = next(line for line in err.splitlines() if line.startswith("note: GPU-h and wall of vanilla:"))
    assert vanilla in block


def test_the_cluster_docs_memory_table_is_the_codes():
    """Each row of the peak-memory table: the estimate of the measured run's config and the file's measured peak."""
    from neox_dar.sweep.cost import measurements

    doc = CLUSTER_DOC.read_text()
    rows = re.findall(r"^\| (tp_\w+\.json) \| ([\d.]+) GB \| ([\d.]+) GB \| ([\d.]+) \|$", doc, re.M)
    assert [r[0] for r in rows] == ["tp_vanilla.json", "tp_dar.json", "tp_mswa.json", "tp_aha.json"]
    found = {m.path.name: m for m in measurements()}
    ratios = []
    for name, estimate, peak, ratio in rows:
        m = found[name]
        total = peak_memory(m.cfg, parameter_count(m.cfg), 1).total
        assert (estimate, peak, ratio) == (f"{total / 1e9:.2f}", f"{m.peak_bytes / 1e9:.2f}",
                                           f"{total / m.peak_bytes:.2f}"), name
        ratios.append(m.peak_bytes / total)
    assert f"the peak was up to {max(ratios):.2f} times the estimate" in doc


def test_the_cluster_docs_data_check_example_is_the_commands(tmp_path, capsys):
    """The data check's example output in docs/cluster.md is what the command prints for the embedded sample
    tokenized as the doc's first command does (the tokenizer's path aside)."""
    from data_prep.tokenize import run

    from neox_dar.data.check import main as check_main

    prefix = tmp_path / "c4_sample"
    run(["data/sample/c4_sample.jsonl", "--tokenizer", "data/20B_tokenizer.json", "--out", str(prefix),
         "--workers", "1", "--no-progress"])
    capsys.readouterr()
    assert check_main([str(prefix)]) == 0
    printed = capsys.readouterr().out.replace(str(prefix), "runs/data/c4_sample")
    printed = re.sub(r"tokenizer \S+ \(", "tokenizer ... (", printed)
    doc = CLUSTER_DOC.read_text()
    assert printed.strip() in doc, printed


def test_checkpoint_bytes_are_what_a_trained_checkpoint_holds(tmp_path, tokenized_sample):
    """A real checkpoint of train.py (tiny, fp32, ZeRO-1 on the CPU): DeepSpeed's module and optimizer files and the
    fp32 model.safetensors hold checkpoint_bytes within 0.1% (pickle and safetensors headers); the rest (the
    tokenizer copy, config, RNG states, state.json) is a few MB whatever the model."""
    from trainrun import train

    save = tmp_path / "run"
    train(save, tokenized_sample, "train_iters=1", "checkpoint_factor=1", "eval_interval=1000",
          "zero_optimization.stage=1")
    step = next(d for d in (save / "checkpoints").iterdir() if d.name.startswith("step_"))
    sizes = {f.name: f.stat().st_size for f in step.iterdir()}
    stored = sum(n for name, n in sizes.items() if name.endswith((".pt", ".safetensors")) and "rng" not in name)
    cfg = load_config(step / "config.yml")
    expected = checkpoint_bytes(cfg.replace(precision="fp32"), parameter_count(cfg))
    assert abs(stored / expected - 1) < 1e-3, (stored, expected, sizes)
    assert sum(sizes.values()) - stored < 5e6
