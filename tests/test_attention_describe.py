"""``python -m neox_dar.describe`` (also reached as ``neox_dar.attention.describe``): windows, extra parameters,
FLOPs and KV-cache bytes per token."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from neox_dar.config import load_config
from neox_dar.describe import kv_cache_bytes_per_token, main

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(variant, *overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pythia-70m's 6 layers do not split into 4 MSWA groups
        return load_config(ROOT / "configs/pythia-70m.yml", ROOT / f"configs/attention/{variant}.yml",
                           overrides=overrides)


@pytest.mark.parametrize("variant,per_layer", [
    ("vanilla", 2 * 512),
    ("aha", 2 * 512),  # every key is kept
    ("swa", 2 * 512 * 128 / 2048),
    # d_down + the far keys' rotated dims (8 heads x 16 of 64: rotary_pct 0.25) per token, + w 2d for the window
    ("dar", 128 + 8 * 16 + 2 * 512 * 128 / 2048),
    ("uniform", 128 + 8 * 16),
])
def test_kv_cache_bytes_per_token(variant, per_layer):
    assert kv_cache_bytes_per_token(cfg(variant), 2048, "bf16") == [pytest.approx(2 * per_layer)] * 6


@pytest.mark.parametrize("variant,per_layer", [
    ("dar", 128 + 2 * 512 * 128 / 2048),  # DAR paper Sec. 5: T d_down + w 2d numbers per layer
    ("uniform", 128),
])
def test_latent_dar_cache_keeps_the_papers_d_down_per_token(variant, per_layer):
    c = cfg(variant, "dar_inference_cache=latent")
    assert kv_cache_bytes_per_token(c, 2048, "fp32") == [pytest.approx(4 * per_layer)] * 6


def test_kv_cache_mswa_sums_each_heads_window():
    c = cfg("mswa")
    windows = [8, 8, 16, 16, 32, 32, 64, 64]  # layer 0 of pythia-70m, base 128
    assert kv_cache_bytes_per_token(c, 2048, "fp32")[0] == pytest.approx(4 * sum(2 * 64 * w / 2048 for w in windows))
    short = kv_cache_bytes_per_token(c, 16, "fp32")[0] / 4  # a context shorter than a window keeps every token
    assert short == pytest.approx(sum(2 * 64 * min(w, 16) / 16 for w in windows))


def test_command_line_report(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = main([str(ROOT / "configs/pythia-70m.yml"), str(ROOT / "configs/attention/mswa.yml"), "window_size=64",
                   "--dtype", "fp32"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "layer  5:    32    32    64    64   128   128   256   256" in out
    assert "extra parameters: 0" in out and "fp32" in out
    assert main([str(ROOT / "configs/pythia-70m.yml"), str(ROOT / "configs/attention/dar.yml")]) == 0
    out = capsys.readouterr().out
    assert "extra parameters: 786,432 (131,072 per layer" in out
    assert "3,840.0 bytes per token" in out  # 6 layers x (128 + 128 + 64) numbers x 2 bytes
    assert main([str(ROOT / "configs/pythia-70m.yml"), "attention_type=bogus"]) == 2


def test_the_old_command_name_still_works():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "neox_dar.attention.describe", "configs/pythia-70m.yml",
                          "configs/attention/dar.yml"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and "3,840.0 bytes per token" in out.stdout, out.stderr


def test_per_layer_flops_use_the_attention_width(capsys):
    """Qwen3-0.6B's attention is 16 heads x 128 = 2048 wide on a 1024-wide model: each layer's line must sum to the
    attention total (it used d, half of it)."""
    import re

    assert main(["configs/qwen3-0.6b.yml", "--context", "4096"]) == 0
    out = capsys.readouterr().out
    total = float(re.search(r"attention \(scores \+ weighted sum \+ variant extras\): (\S+)", out).group(1))
    each = float(re.search(r"each layer: [\d.]+ keys per query, (\S+) FLOPs", out).group(1))
    assert each * 28 == pytest.approx(total, rel=1e-3), out
