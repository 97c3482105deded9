"""`python -m neox_dar.data.check`: the start-up checks of train.py and `sweep plan` on prefixes a user names, with
what the files hold and what their manifest says."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from neox_dar.data.check import main

ROOT = Path(__file__).resolve().parents[1]


def _copy(prefix: str, to: Path, manifest: bool = True) -> str:
    """A copy of the ``prefix`` pair (and its manifest) as ``to``."""
    for ext in ("bin", "idx") + (("manifest.json",) if manifest else ()):
        shutil.copy(f"{prefix}.{ext}", f"{to}.{ext}")
    return str(to)


def test_check_a_prefix_as_a_user_runs_it(tokenized_sample, tmp_path):
    """Run as a command: a good prefix prints its counts, dtype, token ids and manifest (exit 0); a truncated
    `.bin` is one line naming the file (exit 2), no traceback."""
    run = [sys.executable, "-m", "neox_dar.data.check"]
    proc = subprocess.run([*run, tokenized_sample], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # nothing else: no warning about the module running as __main__
    first, manifest = proc.stdout.splitlines()
    assert first.startswith(f"{tokenized_sample}: ok: ") and "20,000 tokens, uint16, token ids 0.." in first
    assert "< vocab_size 50277 (full scan)" in first
    assert manifest.startswith(f"  manifest {tokenized_sample}.manifest.json: tokenizer ")
    assert "20B_tokenizer.json" in manifest
    bad = _copy(tokenized_sample, tmp_path / "bad")
    with open(f"{bad}.bin", "r+b") as f:
        f.truncate(100)
    proc = subprocess.run([*run, bad], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (f"data.check: error: {bad}.bin: 100 bytes but {bad}.idx describes 20000 tokens of "
                                   f"uint16 = 40000 bytes (truncated or mismatched .bin/.idx pair)")


def test_a_blend_against_a_config(tokenized_sample, tmp_path, capsys):
    """Several prefixes are a blend checked for the config given (token ids against its vocab_size); a missing
    prefix, a token id beyond vocab_size and weights that do not match the prefixes are one line each (exit 2)."""
    other = _copy(tokenized_sample, tmp_path / "other", manifest=False)
    assert main(["configs/tiny.yml", tokenized_sample, other, "--weights", "1", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{tokenized_sample}: ok: ") and out[2].startswith(f"{other}: ok: ")
    assert out[3:] == ["  no manifest (not written by python -m data_prep.tokenize)"]
    for words, message in (
            ([str(tmp_path / "nope")], f"data file not found: {tmp_path / 'nope'}.idx"),
            ([f"{tokenized_sample}.bin"], f"(name the prefix {tokenized_sample}, without .bin or .idx)"),
            ([tokenized_sample, "vocab_size=1000"], "is >= vocab_size 1000: tokenized with another tokenizer"),
            ([tokenized_sample, "--weights", "1", "2"], "--weights gives 2 weight(s) for 1 prefix(es)"),
            ([], "no data to check: name a PREFIX")):
        assert main(words) == 2
        err = capsys.readouterr().err
        assert err.startswith("data.check: error: ") and message in err and len(err.splitlines()) == 1, err


def test_the_manifest_is_compared_with_the_files_and_the_config_tokenizer(tokenized_sample, tmp_path, capsys):
    """Warnings, not errors: files replaced after tokenizing (the manifest's counts differ), and a config whose
    vocab_file is another tokenizer than the one the manifest records."""
    prefix = _copy(tokenized_sample, tmp_path / "c4")
    manifest = json.loads(Path(f"{prefix}.manifest.json").read_text())
    Path(f"{prefix}.manifest.json").write_text(json.dumps({**manifest, "tokens": 123}))
    assert main([prefix, "vocab_file=data/byte_tokenizer.json", "data_token_check=skip"]) == 0
    out, err = capsys.readouterr()
    assert "token ids not scanned (data_token_check: skip)" in out
    documents = manifest["documents"]
    assert f"warning: {prefix}: the manifest says {documents} documents and 123 tokens, the files hold " in err
    assert f"warning: {prefix} was tokenized with " in err
    assert "not the config's vocab_file data/byte_tokenizer.json" in err


def test_train_py_warns_when_the_data_has_another_tokenizer(tokenized_sample, tmp_path):
    """The data's manifest names the 20B tokenizer, the config the byte one: train.py's start prints the warning
    data.check gives (it trained without a word and recorded the byte tokenizer as the run's)."""
    from neox_dar.config import load_config
    from neox_dar.training.checks import tokenizer_warnings

    cfg = load_config("configs/tiny.yml", overrides=[f"data_path={tokenized_sample}", f"save={tmp_path / 'run'}"])
    assert tokenizer_warnings(cfg) == []
    (warning,) = tokenizer_warnings(cfg.replace(vocab_file="data/byte_tokenizer.json", vocab_size=257))
    assert warning.startswith(f"warning: {tokenized_sample} was tokenized with ") and "byte_tokenizer" in warning
