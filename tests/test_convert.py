"""Conversion command line: checkpoint -> Hugging Face -> checkpoint, and its errors."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from neox_dar.checkpoint import load_model, save_weights
from neox_dar.config import load_config
from neox_dar.model import build_model

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, "-m", "neox_dar.convert", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT)


def test_cli_round_trip_keeps_every_weight(tmp_path):
    cfg = load_config(ROOT / "configs/tiny.yml")
    torch.manual_seed(1)
    model = build_model(cfg)
    save_weights(model, cfg, tmp_path / "ckpt")
    r = run("to-hf", tmp_path / "ckpt", tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    hf_config = json.loads((tmp_path / "hf/config.json").read_text())
    assert hf_config["vocab_size"] == 50304 and hf_config["rotary_pct"] == 0.25
    assert "embed_out.weight" in load_file(str(tmp_path / "hf/model.safetensors"))
    r = run("from-hf", tmp_path / "hf", tmp_path / "back")
    assert r.returncode == 0, r.stderr
    back, back_cfg = load_model(tmp_path / "back")
    assert back_cfg == cfg
    for (name, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), name


def test_cli_errors_are_one_line(tmp_path):
    r = run("from-hf", tmp_path, tmp_path / "out")
    assert r.returncode == 2 and "no config.json" in r.stderr and r.stderr.strip().count("\n") == 0
    r = run("to-hf", tmp_path / "missing", tmp_path / "out")
    assert r.returncode == 2 and "no checkpoint" in r.stderr
