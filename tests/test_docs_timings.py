"""The timings in the README and the docs are the committed result files' (the quickstart from
``bench/quickstart.py``, the suite and its fast tier from ``RECORD=... bash scripts/test.sh``, docs/training.md's CPU
throughput from ``bench/train_throughput.py``, the comparisons with lm-eval and transformers in docs/evaluation.md and
docs/inference.md): no typed number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def minutes(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 60} min {s % 60:02d} s"


@pytest.mark.parametrize("result, key, sentence", [
    ("quickstart_cpu.json", "wall_s", "the quickstart took {} ("),
    ("test_suite_cpu.json", "wall_s", "the whole suite took {} ("),
    ("test_fast_tier_cpu.json", "wall_s", "the fast tier took {} ("),
])
def test_readme_timing_is_the_result_file(result, key, sentence):
    record = json.loads((ROOT / "bench" / "results" / result).read_text())
    assert record.get("pytest_exit", 0) == 0 and not record.get("git_dirty", record.get("provenance", {}).get(
        "git_dirty")), f"{result}: measured on a failing run or a tree with local changes"
    expected = sentence.format(minutes(record[key]))
    assert expected in " ".join(README.split()), f"README should say '{expected}' (bench/results/{result})"


@pytest.mark.parametrize("result", ["train_throughput_cpu.json", "train_throughput_cpu_d256_l4_t512.json"])
def test_training_docs_throughput_row_is_the_result_file(result):
    """docs/training.md's CPU throughput table: each row's command and numbers are its result file's."""
    record = json.loads((ROOT / "bench" / "results" / result).read_text())
    assert not record["git_dirty"], f"{result}: measured on a tree with local changes"
    rows = [r for r in (ROOT / "docs" / "training.md").read_text().splitlines() if f"`{record['command']}`" in r]
    assert len(rows) == 1, f"docs/training.md should have one table row for `{record['command']}`"
    e, hf = record["engine"], record["vs_hf"]
    cells = [c.strip() for c in rows[0].split("|")[-5:-1]]
    assert cells == [f"{e['tokens_per_sec']:,.0f}", f"{hf['ours_step_s']:.3f} s", f"{hf['hf_step_s']:.3f} s",
                     f"{hf['hf_over_ours']:.3f}"], f"docs/training.md's row for bench/results/{result}"


def test_evaluation_docs_cite_the_lm_eval_comparison():
    """docs/evaluation.md's speed against lm-eval is bench/results/eval_vs_lmeval_cpu.json's."""
    record = json.loads((ROOT / "bench" / "results" / "eval_vs_lmeval_cpu.json").read_text())
    origin = record["provenance"]
    assert not origin["git_dirty"]
    text = " ".join((ROOT / "docs" / "evaluation.md").read_text().split())
    assert f"**{record['ratio_ours_vs_lm_eval']:.2f}x lm-eval's tokens/s**" in text
    assert f"Ours scored {record['ours']['tokens_per_s']:,.0f} tokens per CPU-second" in text
    assert f"commit {origin['git_commit'][:7]}" in text


def test_inference_docs_table_is_the_transformers_comparison():
    """docs/inference.md's generation table against transformers is bench/results/generate_vs_hf_cpu.json's."""
    record = json.loads((ROOT / "bench" / "results" / "generate_vs_hf_cpu.json").read_text())
    assert not record["provenance"]["git_dirty"]
    docs = (ROOT / "docs" / "inference.md").read_text()
    for r in record["results"]:
        name = {"ours": "neox_dar vanilla", "transformers": "transformers vanilla"}.get(r["side"], f"neox_dar {r['side']}")
        name += f" (mu_f {r['mu_f']:.2f})" if "mu_f" in r else ""
        versus = f"{r['ratio_vs_hf']:.2f}" if r["side"] == "ours" else "1.00" if r["side"] == "transformers" else ""
        vanilla = "1.00" if r["side"] == "ours" else f"{r['vs_vanilla']:.2f}" if "vs_vanilla" in r else ""
        row = f"| {name} | {r['batch']} | {r['tokens_per_s']:.1f} | {versus} | {vanilla} |"
        assert row in docs, f"docs/inference.md lacks the row {row}"
    assert f"commit {record['provenance']['git_commit'][:7]}" in " ".join(docs.split())


def test_training_docs_loss_memory_table_is_the_result_file():
    """docs/training.md's chunked-loss table is bench/results/loss_memory_cpu.json's (medians, ratios)."""
    record = json.loads((ROOT / "bench" / "results" / "loss_memory_cpu.json").read_text())
    assert not record["provenance"]["git_dirty"]
    full, chunked = record["summary"]["full"], record["summary"]["chunked"]
    rows = [("training: memory peak above the resident set before the steps (`VmHWM`)", "train", "step_peak_mb"),
            ("training: CPU time", "train", "cpu_s"), ("validation forward: memory peak", "eval", "step_peak_mb"),
            ("validation forward: CPU time", "eval", "cpu_s")]
    docs = (ROOT / "docs" / "training.md").read_text()
    for label, phase, key in rows:
        a, b = full[phase][key], chunked[phase][key]
        cells = (f"{a:.0f} MB | {b:.0f} MB | {a / b:.1f}x" if key == "step_peak_mb"
                 else f"{a:.3f} s | {b:.3f} s | {b / a:.2f}x")
        assert f"| {label} | {cells} |" in docs, f"docs/training.md's row '{label}' should read {cells}"


def test_training_docs_startup_table_is_the_result_file():
    """docs/training.md's start-up table is bench/results/startup_cpu.json's medians."""
    record = json.loads((ROOT / "bench" / "results" / "startup_cpu.json").read_text())
    assert not record["provenance"]["git_dirty"]
    by = {(s["code"].split()[0], s["nproc"]): s for s in record["summary"]}
    docs = (ROOT / "docs" / "training.md").read_text()
    for label, nproc in [("`python train.py` (1 process)", 1), ("`torchrun --nproc_per_node 2`", 2)]:
        cells = " | ".join(f"{by[code, nproc][key]:.1f} s" for code in ("baseline", "current")
                           for key in ("launch_to_first_step_s", "cpu_s"))
        assert f"| {label} | {cells} |" in docs, f"docs/training.md's start-up row for {label} should read {cells}"


def test_data_docs_throughput_table_is_the_result_file():
    """docs/data.md's data preparation table is bench/results/data_prep_wiki_part00.json's."""
    record = json.loads((ROOT / "bench" / "results" / "data_prep_wiki_part00.json").read_text())
    assert not record["git_dirty"]
    base, two, one = (record["baseline_encode_batch_fast"], record["pipeline"]["workers_2"],
                      record["pipeline"]["workers_1"])
    best = " | ".join([f"{base['seconds']:.1f} s, {base['tokens_per_s']:,} tok/s",
                       f"{two['seconds']:.1f} s, {two['tokens_per_s']:,} tok/s (**{two['rate_vs_baseline_best']:.2f}x**)",
                       f"{one['seconds']:.1f} s, {one['tokens_per_s']:,} tok/s ({one['rate_vs_baseline_best']:.2f}x)"])
    docs = (ROOT / "docs" / "data.md").read_text()
    assert f"| best wall | {best} |" in docs
    assert (f"| median of side-by-side ratios | | {two['rate_vs_baseline_median_pairwise']:.2f}x | "
            f"{one['rate_vs_baseline_median_pairwise']:.2f}x |") in docs
    assert f"main {two['peak_rss_mb']['main']:.0f} MB, each worker {two['peak_rss_mb']['tokenizer_process']:.0f} MB" in docs
    assert f"commit {record['git_commit'][:7]}" in docs


def test_dimpo_docs_memory_table_is_the_result_file():
    """docs/dimpo.md's fit-memory table is bench/results/dimpo_memory_cpu.json's."""
    record = json.loads((ROOT / "bench" / "results" / "dimpo_memory_cpu.json").read_text())
    assert not record["git_dirty"]
    docs = (ROOT / "docs" / "dimpo.md").read_text()
    for r in record["runs"]:
        row = (f"| {r['docs_per_split']} | {r['layers']} | {r['model_mb']:.0f} | {r['fit_mb']:.0f} | "
               f"{r['fit_minus_model_mb']:.0f} | {r['train_copy_gb']:.1f} / {r['test_copy_gb']:.1f} |")
        assert row in docs, f"docs/dimpo.md lacks the row {row}"
    assert f"measured at commit {record['git_commit'][:7]}" in " ".join(docs.split())


GPU_RUN = ROOT / "bench" / "results" / "gpu-h200-2026-11-27-fused-loss"


def thousands(tokens_per_sec: float) -> str:
    return f"{tokens_per_sec / 1e3:.1f}k"


KIT_RUNS = ROOT / "bench" / "results"


def kit_engines(folder: str) -> dict[str, dict]:
    """A kit run's throughput engines (``<folder>/part2/train_throughput.json``), by the fused-loss run's names
    (``<variant>[_compile]``)."""
    runs = json.loads((KIT_RUNS / folder / "part2" / "train_throughput.json").read_text())["runs"]
    return {r["config"]["attention_type"] + ("_compile" if r["config"]["torch_compile"] else ""): r["engine"]
            for r in runs}


def test_training_docs_gpu_table_is_the_h200_result_files():
    """docs/training.md's GPU speed table: every tokens/s, MFU, routed share and ratio is one of its committed H200
    result files' (before the fused loss, with it, the first kit run of 2026-11-28 and the latest)."""
    docs = (ROOT / "docs" / "training.md").read_text()
    fused = {p.stem.removeprefix("tp_"): json.loads(p.read_text())["engine"] for p in GPU_RUN.glob("tp_*.json")}
    assert set(fused) == {"vanilla", "mswa", "dar", "aha", "vanilla_compile", "mswa_compile"}
    earlier, now = kit_engines("gpu-h200-2026-11-28"), kit_engines("gpu-h200-2026-11-28b")
    assert set(now) == set(earlier) == set(fused) | {"swa"}
    rows = {"vanilla": "| vanilla (sdpa) |", "mswa": "| MSWA (triton) |", "swa": "| SWA (triton) |",
            "dar": "| DAR (triton) |", "aha": "| AHA (triton) |",
            "vanilla_compile": "| vanilla (sdpa), `torch_compile: true` |",
            "mswa_compile": "| MSWA (triton), `torch_compile: true` |"}
    for name, label in rows.items():
        row = row_of(docs, label)
        cells = [c.strip() for c in row.strip("|").split("|")]
        baseline = now["vanilla_compile" if name.endswith("compile") else "vanilla"]["tokens_per_sec"]
        assert cells[4].startswith(thousands(now[name]["tokens_per_sec"])), (name, row)
        assert cells[3].startswith(thousands(earlier[name]["tokens_per_sec"])), (name, row)
        assert cells[5].startswith(f"{now[name]['tokens_per_sec'] / baseline:.3f}") or cells[5] == "1", (name, row)
        assert cells[2].startswith(thousands(fused[name]["tokens_per_sec"])) if name in fused else cells[2] == "not run"
        if name.startswith("vanilla"):
            for cell, engine in ((cells[4], now), (cells[3], earlier), (cells[2], fused)):
                assert f"MFU {100 * engine[name]['mfu']:.1f}%" in cell, (name, row)
    share = now["aha"]["aha_mu_f"]["measured"]
    assert f"{100 * share:.1f}% of rows routed" in row_of(docs, rows["aha"]) and "aha_mu_f" not in earlier["aha"]
    before = json.loads((ROOT / "bench/results/gpu-h200-2026-11-27/train_throughput.json").read_text())["runs"]
    for run in before:
        label = rows[run["config"]["attention_type"]]
        row = row_of(docs, label)
        assert f"| {thousands(run['engine']['tokens_per_sec'])}" in row, (label, row)


def row_of(docs: str, label: str) -> str:
    (row,) = [line for line in docs.splitlines() if line.startswith(label)]
    return row


def test_readme_gpu_sentence_is_the_h200_result_files():
    engine = kit_engines("gpu-h200-2026-11-28b")
    v, vc = engine["vanilla"], engine["vanilla_compile"]
    text = " ".join(README.split())
    assert (f"{thousands(v['tokens_per_sec'])} tokens/s (MFU {100 * v['mfu']:.1f}%) with vanilla attention, "
            f"{thousands(vc['tokens_per_sec'])} ({100 * vc['mfu']:.1f}%)") in text
    for name, label in [("mswa", "MSWA at"), ("swa", "SWA"), ("aha", "AHA"), ("dar", "DAR")]:
        assert f"{label} {engine[name]['tokens_per_sec'] / v['tokens_per_sec']:.3f}x" in text, name


def test_training_docs_loss_table_is_the_h200_loss_file():
    docs = (ROOT / "docs" / "training.md").read_text()
    ways = json.loads((GPU_RUN / "loss_speed.json").read_text())["ways"]
    for key, label in [("fused rows=5336", "| fused (the Triton kernel"), ("chunked rows=166", "| chunked by PyTorch"),
                       ("plain", "| full float32 logits")]:
        (row,) = [line for line in docs.splitlines() if line.startswith(label)]
        assert row.endswith(f"| {1e3 * ways[key]['seconds']:.1f} ms | {ways[key]['launches']:,} |"), (key, row)


def test_training_docs_dar_flops_after_the_fold_come_from_the_shapes():
    """docs/training.md's DAR FLOPs a token since dar_up is folded into the key/value weights: flops_per_token (the
    definition's) less, per layer, 6 x (dar_up's d x d_down + the key/value rows' 2 H_kv d_h x d - the folded
    2 H_kv d_h x d_down) multiply-adds."""
    import warnings

    from neox_dar.config import load_config
    from neox_dar.model import build_model, flops_per_token

    totals = {}
    for variant in ("vanilla", "dar"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = load_config(ROOT / "configs/pythia-160m.yml", ROOT / f"configs/attention/{variant}.yml").model
        with torch.device("meta"):
            totals[variant] = flops_per_token(build_model(cfg))["total"]
    d, d_down, kv = cfg.hidden_size, cfg.attention.dar_d_down, 2 * cfg.num_kv_heads * cfg.head_dim
    folded = totals["dar"] - cfg.num_layers * 6 * (d * d_down + kv * d - kv * d_down)
    docs = " ".join((ROOT / "docs" / "training.md").read_text().split())
    assert f"about {round(100 * (folded / totals['vanilla'] - 1))}% more FLOPs a token" in docs
    assert f"({folded / 1e6:.0f}M against {totals['vanilla'] / 1e6:.0f}M" in docs
