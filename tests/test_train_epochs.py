"""train.py's token-budget line agrees with `sweep plan` (issue 37): the same threshold (more than one epoch of the
training data is a warning), the same wording, and the same way to say that more is intended (train.py
--max-epochs E; a sweep's run takes its sweep file's max_epochs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402

from neox_dar.sweep.cost import budget_warnings  # noqa: E402
from neox_dar.training.checks import MAX_EPOCHS, epochs_line  # noqa: E402

from builders import config  # noqa: E402

# tiny: 16 sequences x 128 tokens = 2,048 tokens a step; the 20,000-token sample: 9 steps read it 0.92 times, 10 steps
# 1.02 times (as tests/test_sweep_plan.py's budget sweeps)


def _started(monkeypatch, capsys, save: Path, data: str, *words: str) -> tuple[int, str]:
    """train.py's main up to the training loop (the process group and the loop stubbed): its exit code and stderr."""
    import neox_dar.training.distributed as distributed
    import neox_dar.training.loop as loop

    monkeypatch.setattr(distributed, "init_distributed", lambda: distributed.DistInfo(0, 1, 0, None))
    monkeypatch.setattr(loop, "train", lambda cfg, info: 0)
    code = train.main([str(ROOT / "configs" / "tiny.yml"), f"train_data_paths=[{data}]", f"save={save}", *words])
    return code, capsys.readouterr().err


def test_train_py_warns_above_one_epoch_as_plan_does_unless_told(tmp_path, monkeypatch, capsys, tokenized_sample):
    assert MAX_EPOCHS == 1.0
    save = tmp_path / "run"
    code, err = _started(monkeypatch, capsys, save, tokenized_sample, "train_iters=9")
    assert code == 0 and "token budget: 18,432 tokens = 0.922 epochs of the training data\n" in err
    assert "warning" not in err
    code, err = _started(monkeypatch, capsys, save, tokenized_sample, "train_iters=10")
    line = next(ln for ln in err.splitlines() if "token budget" in ln)
    assert code == 0 and line.startswith("warning: token budget: 20,480 tokens = 1.02 epochs of the training data, "
                                         "more than max_epochs = 1: use more data or fewer train_iters, or say that "
                                         "it is intended (train.py --max-epochs N")
    # the plan's warning is the same sentence but for how to say it is intended
    cfg = config("configs/tiny.yml", train_iters=10, train_data_paths=[tokenized_sample], save=str(save))
    planned = budget_warnings(cfg, 1, 1.0)[0]
    assert line.removeprefix("warning: ").split(" (")[0] == planned.split(" (")[0]
    for words in (["--max-epochs", "1.5"], ["--max-epochs=2"]):
        code, err = _started(monkeypatch, capsys, save, tokenized_sample, "train_iters=10", *words)
        assert code == 0 and "token budget: 20,480 tokens = 1.02 epochs" in err and "warning" not in err
    for bad in ("0", "-1", "x", "inf"):
        code, err = _started(monkeypatch, capsys, save, tokenized_sample, "train_iters=10", "--max-epochs", bad)
        assert code == 2 and err == (f"config error: --max-epochs wants a number > 0 (the epochs of the training data "
                                     f"this run may read without a warning), got '{bad}'\n")


def test_a_sweep_run_takes_its_sweep_files_max_epochs(tmp_path, tokenized_sample):
    """A run directory of a sweep (its run.json, the sweep's sweep.yml one folder up): the trainer's limit is the
    sweep file's max_epochs, so a budget the plan was told to accept is not warned about again at every start."""
    save = tmp_path / "sweep" / "a"
    save.mkdir(parents=True)
    (save / "run.json").write_text(json.dumps({"sweep": "s", "run": "a"}))
    cfg = config("configs/tiny.yml", train_iters=10, train_data_paths=[tokenized_sample], save=str(save))
    assert epochs_line(cfg, 1).startswith("warning: ")  # no sweep.yml: one epoch
    (tmp_path / "sweep" / "sweep.yml").write_text(yaml.safe_dump({"name": "s", "max_epochs": 2}))
    assert epochs_line(cfg, 1) == "token budget: 20,480 tokens = 1.02 epochs of the training data"
    assert epochs_line(cfg, 1, max_epochs=1.0).startswith("warning: ")  # --max-epochs wins


@pytest.mark.parametrize("value", ["true", "'2'", "0"])
def test_a_sweep_file_max_epochs_that_is_not_a_number_is_one_epoch(tmp_path, tokenized_sample, value):
    save = tmp_path / "sweep" / "a"
    save.mkdir(parents=True)
    (save / "run.json").write_text("{}")
    (tmp_path / "sweep" / "sweep.yml").write_text(f"max_epochs: {value}\n")
    cfg = config("configs/tiny.yml", train_iters=10, train_data_paths=[tokenized_sample], save=str(save))
    assert epochs_line(cfg, 1).startswith("warning: ")
