"""bench/decode.py's presets: MSWA Fig. 3 (32 layers, 16 heads, d 1,024, positions 500-2,000, batches 8-512) and
DimPO Table 4 (Llama-3.2-1B's shape, contexts 4k and 8k), window-suffixed variants and the median over contexts,
run on a tiny model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from neox_dar.config import load_config, split_args

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("decode_bench", ROOT / "bench" / "decode.py")
decode = importlib.util.module_from_spec(spec)
spec.loader.exec_module(decode)


def _model(config: list[str]):
    files, overrides = split_args(config)
    return load_config(*(ROOT / f for f in files), overrides=overrides).model


def test_mswa_fig3_preset_is_the_papers_configuration():
    full, cpu = decode.PRESETS["mswa-fig3"], decode.PRESETS["mswa-fig3-cpu"]
    m = _model(full["config"])
    assert (m.num_layers, m.num_attention_heads, m.hidden_size, m.head_dim) == (32, 16, 1024, 64)
    assert full["contexts"] == "500,1000,1500,2000" and full["batches"] == "8,16,64,128,256,512"
    assert full["variants"].split(",")[:3] == ["vanilla", "swa@128", "mswa@128"]
    small = _model(cpu["config"])
    assert (small.num_layers, small.hidden_size, small.num_attention_heads) == (4, 1024, 16)
    assert cpu["contexts"] == full["contexts"] and cpu["device"] == "cpu"


def test_dimpo_table4_preset_is_llama_1b_at_4k_and_8k():
    preset = decode.PRESETS["dimpo-table4"]
    m = _model(preset["config"])
    assert (m.num_layers, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (16, 32, 8, 64)
    assert preset["contexts"] == "4096,8192" and preset["variants"] == "vanilla,dimpo"


def test_a_preset_on_a_tiny_model_gives_windows_and_the_median_over_contexts(tmp_path):
    out = tmp_path / "r.json"
    assert decode.main(["--preset", "mswa-fig3-cpu", "configs/tiny.yml",
                        "--contexts", "24,40", "--batches", "2", "--steps", "1", "--warmup", "0",
                        "--variants", "vanilla,swa@8,mswa@8,dimpo", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["preset"] == "mswa-fig3-cpu" and r["device"].startswith("CPU") and r["dtype"] == "float32"
    rows = {(x["variant"], x["context"]): x for x in r["results"]}
    assert rows["swa@8", 40]["cache_bytes_per_sequence"] < rows["vanilla", 40]["cache_bytes_per_sequence"]
    assert rows["mswa@8", 40]["cache_bytes_per_sequence"] < rows["vanilla", 40]["cache_bytes_per_sequence"]
    over = {x["variant"]: x for x in r["over_contexts"]}
    for v in ("vanilla", "swa@8", "mswa@8", "dimpo"):
        steps = sorted(rows[v, c]["step_ms_median"] for c in (24, 40))
        assert over[v]["step_ms_median"] == pytest.approx(sum(steps) / 2) and over[v]["contexts"] == [24, 40]
    assert over["vanilla"]["speed_vs_vanilla"] == 1.0


def test_bad_variant_is_one_line(capsys):
    assert decode.main(["--variants", "vanilla,swa@x", "--contexts", "8"]) == 2
    assert capsys.readouterr().err.strip() == "error: unknown variants ['swa@x']"
