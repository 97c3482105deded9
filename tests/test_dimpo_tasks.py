"""Projection files (the model shape they belong to, one-line refusals), the KV-cache saving against the paper's
tables, and the Table 2/3 grid: its cells, an lm-eval run through the project's lm-eval model on a local task, and
the table read back from lm-eval's results file."""

from __future__ import annotations

import json

import lm_eval
import pytest
import torch
from safetensors.torch import save_file

from builders import saved_run
from neox_dar.dimpo import DimPOError, Projections, check_projections, kv_cache_saving, load_projections
from neox_dar.dimpo.__main__ import main
from neox_dar.dimpo.projections import model_shape
from neox_dar.dimpo.tables import table2, task_tables
from neox_dar.dimpo.tasks import PAPER_TASKS, cell_lm_eval_version, default_layers


@pytest.mark.parametrize("layers,num_layers,d,head_dim,percent", [
    (2, 16, 32, 64, 3.12), (16, 16, 1, 64, 49.22), (8, 16, 4, 64, 23.44),     # Table 12, Llama-3.2-1B
    (7, 28, 16, 128, 10.94), (2, 28, 4, 128, 3.46), (28, 28, 64, 128, 25.00),  # Table 13, Llama-3.2-3B
    (12, 32, 64, 128, 9.38), (32, 32, 16, 128, 43.75), (20, 32, 1, 128, 31.01),  # Table 14, Llama-3.1-8B
    (0, 32, 1, 128, 0.0),
])
def test_kv_cache_saving_is_the_papers(layers, num_layers, d, head_dim, percent):
    assert round(100 * kv_cache_saving(layers, num_layers, d, head_dim), 2) == pytest.approx(percent, abs=0.006)


def test_default_layers_are_the_papers_grids():
    """The l columns of the paper's tables for the depths it reports; other depths scale Table 2's."""
    assert default_layers(32) == [0, 2, 4, 8, 12, 16, 20, 24, 28, 30, 32]  # Tables 2 and 14, Llama-3.1-8B
    assert default_layers(16) == [0, 2, 4, 6, 8, 10, 12, 14, 16]  # Table 12, Llama-3.2-1B
    assert default_layers(28) == [0, 2, 4, 7, 10, 12, 14, 16, 18, 21, 24, 26, 28]  # Tables 13, 16: Llama-3B, Qwen2.5-7B
    assert default_layers(36) == [0, 2, 4, 6, 9, 12, 15, 18, 21, 24, 27, 30, 32, 34, 36]  # Tables 3, 15: Qwen3-4B
    assert default_layers(2) == [0, 1, 2] and default_layers(64)[-3:] == [56, 60, 64]


def test_projection_file_round_trip_and_refusals(tmp_path):
    _, cfg = saved_run(tmp_path / "run")
    shape = model_shape(cfg)
    weights = {l: torch.randn(4, cfg.head_dim) for l in range(cfg.num_layers)}
    path = Projections("dimpo", 4, shape, weights, {"checkpoint": "x"}).save(tmp_path / "p.safetensors")
    proj = load_projections(path)
    assert proj.method == "dimpo" and proj.d_proj == 4 and proj.shape == shape and proj.source == {"checkpoint": "x"}
    assert all(torch.equal(proj.weights[l], weights[l]) for l in weights)
    assert check_projections(proj, cfg, 1) == [cfg.num_layers - 1] and check_projections(proj, cfg, 0) == []

    other = Projections("dimpo", 4, {**shape, "head_dim": 32, "num_layers": 6}, {})
    with pytest.raises(DimPOError, match=r"projections for a model of 6 layers, 4 heads \(4 key/value\), head dim "
                                         r"32; this model has 2 layers, 4 heads \(4 key/value\), head dim 16"):
        check_projections(other, cfg, 1)
    with pytest.raises(DimPOError, match="cannot project the last 3 layers of a model with 2 layers"):
        check_projections(proj, cfg, 3)
    partial = Projections("dimpo", 4, shape, {1: weights[1]})
    assert check_projections(partial, cfg, 1) == [1]
    with pytest.raises(DimPOError, match=r"no projection for layer\(s\) 0 \(the file holds 1 of 2 layers"):
        check_projections(partial, cfg, 2)
    too_wide = tmp_path / "wide.safetensors"
    save_file({"layers.0.weight": torch.zeros(32, 16)}, str(too_wide),
              metadata={"format": "neox_dar.dimpo.projections", "version": "1", "method": "pca", "d_proj": "32",
                        **{k: str(v) for k, v in shape.items()}})
    with pytest.raises(DimPOError, match="d' = 32 exceeds the head dim 16"):
        load_projections(too_wide)
    save_file({"w": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(DimPOError, match="is not a DimPO projection file"):
        load_projections(tmp_path / "plain.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(DimPOError, match="is not a readable projection file"):
        load_projections(tmp_path / "junk.safetensors")
    with pytest.raises(DimPOError, match="d' must be in 1..16"):
        kv_cache_saving(1, 2, 17, 16)


def local_task(folder):
    """A two-choice lm-eval task read from a local JSON-lines file (no network)."""
    rows = [{"question": f"Is {i} smaller than {i + 3}?", "choices": ["no", "yes"], "label": 1} for i in range(4)]
    (folder / "dimpo_smoke.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "dimpo_smoke.yaml").write_text(
        "task: dimpo_smoke\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {folder / 'dimpo_smoke.jsonl'}\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{label}}"\nmetric_list:\n  - metric: acc\n')


def test_task_grid_runs_lm_eval_and_reads_its_results(tmp_path, capsys):
    run = tmp_path / "run"
    _, cfg = saved_run(run)
    shape = model_shape(cfg)
    files = []
    for d in (8, 4):
        files.append(str(Projections("dimpo", d, shape, {l: torch.randn(d, 16) for l in range(2)}).save(
            tmp_path / f"dimpo-d{d}.safetensors")))
    local_task(tmp_path)
    out = tmp_path / "grid"
    lm_eval_args = f"--include_path {tmp_path} --batch_size 2 --device cpu"
    args = ["tasks", str(run), "--projections", *files, "--out", str(out), "--tasks", "dimpo_smoke:acc",
            "--lm-eval-args", lm_eval_args]
    assert main(args + ["--layers", "0,1,2"]) == 0
    listing = capsys.readouterr().out
    assert "l=1 d'=4 saving 18.75%" in listing and "l=2 d'=4 saving 37.50%" in listing and "dimpo_layers=2" in listing
    assert listing.count("--num_fewshot 0") == 6
    assert main(args + ["--layers", "0", "--run"]) == 0  # one lm-eval run: l = 0 is the same model for every d'
    grid = json.loads((out / "grid.json").read_text())  # the lm-eval versions: installed, the paper's, each cell's
    assert grid["lm_eval_version"] == lm_eval.__version__ and grid["paper_lm_eval_version"] == "0.4.9.1"
    assert {cell_lm_eval_version(c) for c in grid["cells"]} == {lm_eval.__version__}
    table = table2(str(out))
    assert table.columns == ["d' / l", "0"] and [r[0] for r in table.rows] == ["8", "4"]
    score = float(table.rows[0][1].split(" / ")[0])
    assert 0 <= score <= 100 and table.rows[0][1] == table.rows[1][1] and table.rows[0][1].endswith(" / 0.00%")
    one = ["tasks", str(run), "--projections", files[1], "--out", str(out), "--tasks", "dimpo_smoke:acc",
           "--lm-eval-args", lm_eval_args, "--layers", "0,1", "--run"]
    capsys.readouterr()
    assert main(one) == 0  # the last layer attends with the d' = 4 projections; l = 0 is not run again
    ran = capsys.readouterr().err
    assert "dimpo: l=1 d'=4" in ran and "dimpo: l=0" not in ran
    table = table2(str(out))
    assert table.columns == ["d' / l", "0", "1"] and table.rows[0][0] == "4"
    assert float(table.rows[0][1].split(" / ")[0]) == score and table.rows[0][2].endswith(" / 18.75%")
    (per_task,) = task_tables(str(out))
    assert per_task.title == "dimpo_smoke (acc)" and float(per_task.rows[0][1]) == pytest.approx(score, abs=0.051)
    assert main(["tasks", str(run), "--projections", files[0], "--out", str(out), "--layers", "3"]) == 2
    assert "cannot project the last 3 layers of a model with 2 layers" in capsys.readouterr().err
    swa = tmp_path / "swa"  # a grid over layers DimPO does not project (laid out before; apply refused each cell)
    saved_run(swa, "attention_type=swa", "window_size=8")
    assert main(["tasks", str(swa), "--projections", files[0], "--out", str(tmp_path / "g2"), "--layers", "1"]) == 2
    assert "layer(s) 1 (swa) are not" in capsys.readouterr().err and not (tmp_path / "g2").exists()


def test_paper_tasks_are_registered_in_the_installed_lm_eval():
    """DimPO's Table 2 tasks by lm-eval's own names: indexed by lm-eval's TaskManager from the installed task
    folders that define them (the whole index takes ~15 s to build; its folders are read locally)."""
    from pathlib import Path

    import lm_eval
    from lm_eval.tasks import TaskManager

    tasks = Path(lm_eval.__file__).parent / "tasks"
    folders = [str(tasks / f) for f in ("arc", "hellaswag", "truthfulqa", "mmlu", "winogrande")]
    assert set(PAPER_TASKS) <= set(TaskManager(include_path=folders, include_defaults=False).all_tasks)
