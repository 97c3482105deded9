"""Conversion command line: checkpoint -> Hugging Face (weights, config, tokenizer) -> checkpoint, and its errors."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoTokenizer, GenerationConfig

from neox_dar.checkpoint import load_model, save_weights
from neox_dar.config import load_config
from neox_dar.convert import to_hf
from neox_dar.evaluation.corpora import load_local
from neox_dar.evaluation.loading import load_for_eval
from neox_dar.model import build_model

from builders import saved_model
from neox_dar.tokenizer import load_tokenizer, tokenizer_file

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, "-m", "neox_dar.convert", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT)


def test_cli_round_trip_keeps_every_weight(tmp_path):
    cfg = load_config(ROOT / "configs/tiny.yml").model
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
    assert r.returncode == 2 and str(tmp_path / "missing") in r.stderr and r.stderr.strip().count("\n") == 0


def test_to_hf_writes_the_runs_tokenizer(tmp_path):
    """The export is complete for transformers: AutoTokenizer loads it, with the run's own tokenizer.json (byte for
    byte) and bos = eos = unk = <|endoftext|>; config.json and generation_config.json name its id."""
    saved_model(tmp_path / "ckpt", seed=2)
    r = run("to-hf", tmp_path / "ckpt", tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    hf = tmp_path / "hf"
    assert (hf / "tokenizer.json").read_bytes() == (ROOT / "data/20B_tokenizer.json").read_bytes()
    tok = AutoTokenizer.from_pretrained(hf)
    assert tok.bos_token == tok.eos_token == tok.unk_token == "<|endoftext|>" and tok.eos_token_id == 0
    assert tok.model_max_length == 2048
    raw = Tokenizer.from_file(str(ROOT / "data/20B_tokenizer.json"))
    texts = [d.text for d in load_local("c4")[:5]] + ["  two  spaces\n\ttab", "ünïcödé 日本 🙂", "<|endoftext|>x"]
    for text in texts:
        ids = raw.encode(text, add_special_tokens=False).ids
        assert tok(text)["input_ids"] == ids
        assert tok.decode(ids) == raw.decode(ids, skip_special_tokens=False)
    assert json.loads((hf / "special_tokens_map.json").read_text()) == {
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    config = json.loads((hf / "config.json").read_text())
    assert config["bos_token_id"] == config["eos_token_id"] == 0
    generation = GenerationConfig.from_pretrained(hf)
    assert generation.eos_token_id == 0 and generation.bos_token_id == 0


def test_to_hf_tokenizer_follows_the_config_and_the_command_line(tmp_path):
    other = tmp_path / "other.json"
    raw = json.loads((ROOT / "data/20B_tokenizer.json").read_text())
    raw["added_tokens"] = [t for t in raw["added_tokens"] if t["content"] != "<|endoftext|>"]
    del raw["model"]["vocab"]["<|endoftext|>"]
    other.write_text(json.dumps(raw))
    saved_model(tmp_path / "ckpt", f"vocab_file={tmp_path / 'gone.json'}", seed=2)
    r = run("to-hf", tmp_path / "ckpt", tmp_path / "hf")
    assert r.returncode == 2 and "gone.json" in r.stderr and r.stderr.strip().count("\n") == 0
    r = run("to-hf", tmp_path / "ckpt", tmp_path / "hf", "--tokenizer", other)
    assert r.returncode == 2 and "'<|endoftext|>' is not in the vocabulary" in r.stderr
    r = run("to-hf", tmp_path / "ckpt", tmp_path / "hf", "--tokenizer", ROOT / "data/20B_tokenizer.json")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "hf/tokenizer.json").is_file()


def test_from_hf_keeps_the_folders_tokenizer(tmp_path):
    """from-hf copies the folder's tokenizer files beside the weights, where evaluation finds them first."""
    _, cfg = saved_model(tmp_path / "ckpt", seed=2)
    model, _ = load_model(tmp_path / "ckpt")
    hf = tmp_path / "hf"
    to_hf(model, cfg, hf)
    raw = json.loads((hf / "tokenizer.json").read_text())
    raw["model"]["vocab"]["<|marker|>"] = len(raw["model"]["vocab"])  # a tokenizer other than the bundled one
    (hf / "tokenizer.json").write_text(json.dumps(raw))
    r = run("from-hf", hf, tmp_path / "back")
    assert r.returncode == 0, r.stderr
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / "back" / name).read_bytes() == (hf / name).read_bytes(), name
    loaded = load_for_eval(tmp_path / "back")
    assert tokenizer_file(loaded.cfg, model_dir=loaded.model_dir) == tmp_path / "back" / "tokenizer.json"
    assert load_tokenizer(loaded.cfg, model_dir=loaded.model_dir).token_to_id("<|marker|>") is not None
