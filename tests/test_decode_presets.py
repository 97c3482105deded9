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


def test_pythia_160m_preset_is_the_kits_decode_check_with_enough_steps_for_a_spread(tmp_path):
    preset = decode.PRESETS["pythia-160m"]
    m = _model(preset["config"])
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.attention.window_size) == (12, 768, 12, 128)
    assert preset["contexts"] == "8192,32768" and preset["batches"] == "16" and m.max_position_embeddings >= 32768
    assert preset["steps"] >= 20 and preset["warmup"] >= 3
    out = tmp_path / "r.json"
    assert decode.main(["--preset", "pythia-160m", "configs/tiny.yml", "--device", "cpu", "--dtype", "float32",
                        "--contexts", "24", "--batches", "2", "--steps", "4", "--variants", "vanilla,aha",
                        "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["steps"] == 4 and r["warmup"] == 3  # the command line replaces the preset's steps, not its warm-up
    for row in r["results"]:
        spread = row["step_ms_spread"]
        assert len(row["step_ms_all"]) == 4 and spread["min"] <= spread["q1"] <= spread["q3"] <= spread["max"]


@pytest.mark.parametrize("name", ["pythia-160m", "mswa-fig3-cpu"])
def test_a_preset_without_a_config_on_the_command_line_builds_the_presets_model(name, monkeypatch):
    # the GPU kit's call, `bench/decode.py --preset pythia-160m`, once measured a 6-layer 512-wide model: argparse
    # gives [] for the absent config, which the preset must replace as it replaces an absent option
    seen = {}

    def run(args):
        seen["config"] = args.config
        raise SystemExit(0)

    monkeypatch.setattr(decode, "run", run)
    with pytest.raises(SystemExit):
        decode.main(["--preset", name, "--device", "cpu"])
    assert seen["config"] == decode.PRESETS[name]["config"]


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


@pytest.mark.parametrize("name, render", [("mswa-fig3-cpu", "over_contexts_markdown"),
                                          ("dimpo-table4-cpu", "markdown")])
def test_docs_tables_are_the_committed_results(name, render):
    report = json.loads((ROOT / "bench" / "results" / f"decode_{name.replace('-', '_')}.json").read_text())
    assert report["preset"] == name and report["device"].startswith("CPU")
    docs = (ROOT / "docs" / "inference.md").read_text()
    shown = docs.split(f"<!-- {name} -->\n", 1)[1].split(f"\n<!-- /{name} -->", 1)[0]
    assert shown == getattr(decode, render)(report)


def test_docs_statements_on_the_cpu_presets_hold():
    fig3 = json.loads((ROOT / "bench" / "results" / "decode_mswa_fig3_cpu.json").read_text())
    speed = {(r["variant"], r["batch"]): round(r["speed_vs_vanilla"], 2) for r in fig3["over_contexts"]}
    assert all(speed[v, 16] > speed[v, 8] > 1 for v in ("swa@128", "mswa@128", "swa@512", "mswa@512"))
    assert speed["mswa@512", 8] > speed["swa@512", 8] and speed["mswa@512", 16] > speed["swa@512", 16]
    assert (speed["swa@128", 8], speed["mswa@512", 8], speed["swa@512", 8]) == (1.28, 1.21, 1.2)
    assert (speed["mswa@512", 16], speed["swa@512", 16]) == (1.45, 1.39)
    t4 = json.loads((ROOT / "bench" / "results" / "decode_dimpo_table4_cpu.json").read_text())
    dimpo = [r for r in t4["results"] if r["variant"] == "dimpo"]
    assert [round(r["speed_vs_vanilla"], 2) for r in dimpo] == [1.05, 1.06]
    assert all(r["cache_vs_vanilla"] == 0.8125 for r in dimpo)
    assert all(round(x["load_average"]["before"][0], 1) == 1.6 for x in (fig3, t4))
