"""The commands around training as a user runs them (issue 36, items 8-10): evaluation and export of a run while its
trainer prunes, interrupts and hostile input that end in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from builders import ROOT, saved_model

from neox_dar.rundir import TMP_PREFIX, prune, publish, step_dir_name, write_manifest


def _run_being_pruned(run: Path, monkeypatch) -> Path:
    """A run directory with one checkpoint (step 7: a tiny model and its tokenizer), and the trainer simulated at the
    worst moment: just as a command starts reading the weights, step 8 is published and the run prunes to one
    checkpoint (keep_last_n=1). Returns step 7's directory."""
    import neox_dar.checkpoint as checkpoint

    root = run / "checkpoints"
    step7 = root / step_dir_name(7)
    step7.mkdir(parents=True)
    shutil.copy(ROOT / "data" / "20B_tokenizer.json", step7 / "tokenizer.json")
    saved_model(step7, "seq_length=32")
    write_manifest(step7, {"step": 7})
    real_load = checkpoint.load_file

    def load_while_training(path, device="cpu"):
        if not (root / step_dir_name(8)).exists():
            tmp = root / (TMP_PREFIX + step_dir_name(8))
            shutil.copytree(step7, tmp)
            write_manifest(tmp, {"step": 8})
            publish(tmp, root / step_dir_name(8))
            prune(root, 1)
        return real_load(path, device=device)

    monkeypatch.setattr(checkpoint, "load_file", load_while_training)
    return step7


@pytest.mark.parametrize("command", ["eval.perplexity", "convert to-hf"])
def test_a_checkpoint_pruned_while_it_is_read_is_read_whole(command, tmp_path, monkeypatch, capsys):
    """eval.perplexity and convert to-hf of a run whose trainer publishes a newer checkpoint and prunes the one being
    read: the command reads its checkpoint whole (weights and tokenizer) and completes; the prune leaves the held
    checkpoint for the next one. (Before: "not a readable safetensors file" or "tokenizer file not found".)"""
    run = tmp_path / "run"
    step7 = _run_being_pruned(run, monkeypatch)
    if command == "eval.perplexity":
        from eval.perplexity import main

        out = tmp_path / "ppl.json"
        assert main([str(run), "--corpora", "c4", "--max-docs", "1", "--no-progress", "--no-wandb",
                     "--out", str(out)]) == 0, capsys.readouterr().err
        assert json.loads(out.read_text())["step"] == 7
    else:
        from neox_dar.convert import main

        assert main(["to-hf", str(run), str(tmp_path / "hf")]) == 0, capsys.readouterr().err
        assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (ROOT / "data" / "20B_tokenizer.json").read_bytes()
    assert step7.is_dir() and (run / "checkpoints" / step_dir_name(8)).is_dir()
    assert prune(run / "checkpoints", 1) == [step7]
