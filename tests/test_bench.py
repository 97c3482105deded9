"""Every benchmark script under bench/ runs on the CPU at its smallest arguments (one tiny step) and writes a
well-formed result, so that none can rot between the rare hours a GPU is lent (scripts/gpu_check.sh runs them).
The scripts are found by glob: a new one fails here until it has its smallest arguments below."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py"))


def check_attention(r: dict) -> None:
    assert r["label"].startswith("Triton CPU interpreter smoke timings")
    methods = {x["method"]: x for x in r["results"] if x["kernel"] == "dar"}
    # flex: minutes to compile on a CPU; triton_dq_*: the backward's two dq passes, each fixed
    assert set(methods) == {"triton", "triton_dq_atomic", "triton_dq_rows", "reference", "sdpa_path", "sdpa_causal"}
    assert all(x["fwd_ms"] > 0 and x["fwd_bwd_ms"] > 0 and "error" not in x for x in methods.values()), methods
    assert all(methods[m]["rel_err_vs_reference"] < 1e-3 for m in ("triton", "triton_dq_atomic", "triton_dq_rows"))
    assert "dq_choices" not in methods["triton"]  # the pass is chosen by timing on CUDA only
    for m in ("triton", "sdpa_causal"):  # --profile: the aten ops of one more forward+backward, on this CPU
        assert methods[m]["host_fwd_bwd_ms"] > 0
        prof = methods[m]["profile"]
        assert prof["what"] == "aten ops (CPU)" and prof["wall_us"] > 0
        assert prof["launches"] >= len(prof["kernels"]) > 0
        assert 0 < prof["kernel_us"] and all(k["launches"] > 0 and k["us"] >= 0 for k in prof["kernels"])
    assert not [m for m in methods
                if m not in ("triton", "sdpa_causal") and {"profile", "host_fwd_bwd_ms"} & set(methods[m])]
    assert not [m for m in methods if {"graph_fwd_bwd_ms", "graph_error"} & set(methods[m])]  # CUDA graphs: GPU only
    assert methods["sdpa_causal"]["rel_err_vs_reference"] is None  # another mask: the targets' speed baseline
    assert [t["target"] for t in r["targets"]] == ["dar T=32: triton / sdpa_causal fwd+bwd <= 1.1"]
    assert all(t["value"] > 0 and t["met"] is None for t in r["targets"])  # computed, not judged off a GPU


def check_data_prep(r: dict) -> None:
    assert r["tokens"] > 0 and r["baseline_encode_batch_fast"]["tokens_per_s"] > 0
    assert r["pipeline"]["workers_1"]["rate_vs_baseline_best"] > 0


def check_decode(r: dict) -> None:
    rows = r["results"]
    assert {x["variant"] for x in rows} >= {"vanilla", "dar", "mswa", "aha", "linear"}
    assert all(x["context"] == 64 and x["decode_tokens_per_s"] > 0 and x["cache_bytes_per_sequence"] > 0
               for x in rows)
    assert all(x["speed_vs_vanilla"] > 0 for x in rows)
    # AHA's open pairs read their whole context once (the window was counted twice: 1.125 of vanilla's bytes here)
    assert 0 < next(x for x in rows if x["variant"] == "aha")["read_vs_vanilla"] <= 1
    # every variant's decode was checked against a float32 forward before it was timed (float32 here: rounding only)
    assert r["checks"].keys() == {x["variant"] for x in rows} and all(x["check_ok"] for x in rows)
    assert all(c["ok"] and c["decode_rel_err"] < 1e-5 and c["max_abs_logit"] > 0 for c in r["checks"].values())
    # --profile: one more step at context 64 (the cache one column larger, so it holds what describe says)
    assert all(x["cache_bytes_per_sequence"] == x["describe_bytes_per_sequence"] for x in rows)
    for x in rows:
        prof = x["profile"]
        assert prof["what"] == "aten ops (CPU)" and prof["wall_us"] > 0 and prof["launches"] >= len(prof["kernels"]) > 0
        # the host's own longest events: on a GPU the CUDA runtime's calls among them (a sync, a library's plan)
        assert prof["host"] and all(h["calls"] > 0 and h["us"] >= 0 for h in prof["host"])
        assert [h["us"] for h in prof["host"]] == sorted((h["us"] for h in prof["host"]), reverse=True)


def check_host_path(r: dict) -> None:
    (row,) = r["results"]
    assert r["calls"] == 3 and row["kernel"] == "swa" and row["host_us"] > r["glue_us"] > 0
    assert row["beyond_glue_us"] == pytest.approx(row["host_us"] - r["glue_us"], abs=0.11)


def check_layer_traffic(r: dict) -> None:
    rows = {x["variant"]: x for x in r["results"]}
    assert set(rows) == {"vanilla", "aha"} and r["shape"]["seq_len"] == 16
    for x in rows.values():
        assert x["ops"] > 0 and x["bytes"] > 0 and x["hidden_state_units"] > 0
        units = [t["hidden_state_units"] for t in x["top"]]
        assert units == sorted(units, reverse=True) and sum(units) <= x["hidden_state_units"] + 0.1
    # every operator listed (--top 50): rotary's backward makes no full-width slice gradients
    assert "slice_backward" not in {t["op"] for t in rows["vanilla"]["top"]}
    assert "sort" in {t["op"] for t in rows["aha"]["top"]}  # the routed rows' compaction


def check_dimpo_memory(r: dict) -> None:
    (run,) = r["runs"]
    assert run["docs_per_split"] == 1 and run["layers"] == 1 and run["peak_mb"] >= run["peak_before_fit_mb"] > 0


def check_dimpo_small(r: dict) -> None:
    assert r["train_steps"] == 1 and "DimPO" in r["table_markdown"] and r["results"]["layers"]
    text = re.sub(r'"command": "[^"]*"', "", json.dumps(r))  # its work folder named as such, not by its path
    assert "<temporary folder>/ckpt" in text and tempfile.gettempdir() not in text


def check_dimpo_pairs(r: dict) -> None:
    assert r["device"].startswith("CPU")
    assert list(r["study"]) == ["distance"] and sorted(r["study"]["distance"]) == ["cpo", "orpo", "simpo", "triplet"]
    assert all(list(by_k) == ["1"] for by_k in r["study"]["distance"].values())


def check_eval_vs_lmeval(r: dict) -> None:
    assert r["device"].startswith("CPU") and r["max_length"] == 64 and r["windows"] >= 2 and r["tokens"] > 64
    assert r["max_rel_loglikelihood_diff"] < 1e-4  # the same windows: the same log-likelihoods
    assert r["ours"]["tokens_per_s"] > 0 and r["lm_eval"]["tokens_per_s"] > 0 and r["ratio_ours_vs_lm_eval"] > 0
    assert len(r["load_average"]["before"]) == 3


def check_generate_vs_hf(r: dict) -> None:
    sides = {x["side"]: x for x in r["results"]}
    assert r["device"].startswith("CPU") and r["new_tokens"] == 4 and len(r["load_average"]["after"]) == 3
    assert set(sides) == {"ours", "transformers", "dar", "dar-latent", "swa", "mswa", "aha"}
    assert all(x["tokens_per_s"] > 0 and x["batch"] == 2 for x in sides.values())
    assert sides["ours"]["ratio_vs_hf"] > 0 and sides["dar"]["vs_vanilla"] > 0 and 0 <= sides["aha"]["mu_f"] <= 1


def check_loss_memory(r: dict) -> None:
    assert r["device"].startswith("CPU") and r["config"]["seq_length"] == 16 and r["max_loss_diff"] < 1e-4
    assert [len(r["load_average"][k]) for k in ("before", "after")] == [3, 3]  # measured, not a typed note
    for mode in ("full", "chunked"):
        for phase in ("train", "eval"):
            row = r["summary"][mode][phase]
            assert row["peak_rss_mb"] > 0 and row["step_peak_mb"] >= 0 and row["cpu_s"] > 0, (mode, phase, row)


def check_loss_speed(r: dict) -> None:
    ways = r["ways"]
    assert r["device"].startswith("CPU") and list(ways) == ["plain", "chunked rows=7", "chunked rows=64"]
    assert all(w["seconds"] > 0 and w["launches"] > 0 and w["loss_diff"] < 1e-3 and w["grad_weight_max_diff"] < 1e-4
               for w in ways.values()), ways
    assert ways["chunked rows=7"]["launches"] > ways["chunked rows=64"]["launches"]  # more chunks, more launches


def check_profile_step(r: dict) -> None:
    p = r["profile"]
    assert r["device"].startswith("CPU") and r["config"]["seq_length"] == 16
    assert p["step_wall_ms"] > 0 and p["kernel_ms"] > 0 and p["launches"] > 0 and p["top"]
    assert sum(p["categories_ms"].values()) == pytest.approx(p["kernel_ms"]) and "matmul" in p["categories_ms"]


def check_quickstart(r: dict) -> None:
    """The README's first command ran whole (tokenize, train and evaluate both variants, the table) and timed."""
    assert list(r["phases_s"]) == ["tokenize", "train vanilla", "evaluate vanilla", "train dar", "evaluate dar"]
    # whole seconds each: their sum may pass the wall time by up to one per phase
    assert r["steps"] == 2 and r["wall_s"] + len(r["phases_s"]) >= sum(r["phases_s"].values()) and r["cpu_s"] > 0
    assert "Rel. (%)" in r["table"] and "DAR w=16 d_down=16" in r["table"]


def check_startup(r: dict) -> None:
    (row,) = r["summary"]
    assert [len(r["load_average"][k]) for k in ("before", "after")] == [3, 3]  # measured, not a typed note
    assert row["code"] == "current" and row["nproc"] == 1 and row["launch_to_first_step_s"] > 0 and row["cpu_s"] > 0
    assert list(row["phases_median_s"]) == ["imports", "config", "process group", "run directory", "data index",
                                            "engine", "checkpoint and logs", "first step"]


def gpu_targets_args(tmp_path: Path) -> list[str]:
    """A kit output folder holding only a decode result (bench/decode.py's shape, CPU numbers)."""
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"variant": v, "context": 64, "batch": 1, "speed_vs_vanilla": s} for v, s in [("vanilla", 1.0), ("dar", 1.5)]]
    model = {"hidden_size": 128, "num_layers": 4}
    (run / "decode.json").write_text(json.dumps({"device": "CPU x86_64 (2 threads)", "model": model, "results": rows}))
    return [str(run)]


def check_gpu_targets(r: dict) -> None:
    assert r["missing"] == ["attention.json", "train_throughput.json"]
    assert [(t["value"], t["met"], t["judged"]) for t in r["targets"]] == [(1.5, None, False)]


def check_train_throughput(r: dict) -> None:
    e, hf = r["engine"], r["vs_hf"]
    assert r["device"].startswith("CPU") and r["config"]["seq_length"] == 16
    assert e["tokens_per_sec"] > 0 and e["global_batch"] == 2 and e["mfu"] is None  # no peak FLOP/s for a CPU
    assert 5 < e["loss_first_step"] < 15 and 5 < e["loss_last_step"] < 15  # random tokens over ~50k: ~ln(50k)
    assert hf["ours_step_s"] > 0 and hf["hf_step_s"] > 0 and hf["ours_attention_impl"] == "sdpa"


# script: (its smallest arguments, without --out, or a function of tmp_path making them; the check of its JSON result)
SMALLEST = {
    "attention.py": (["--interpret", "--kernels", "dar", "--warmup-ms", "0", "--rep-ms", "0", "--profile"],
                     check_attention),
    "data_prep.py": (["--corpus", "data/sample/pile_text.jsonl", "--workers", "1", "--repeats", "1"], check_data_prep),
    "decode.py": (["--contexts", "64", "--batches", "1", "--steps", "1", "--warmup", "0", "--profile"], check_decode),
    "eval_vs_lmeval.py": (["--quick"], check_eval_vs_lmeval),
    "host_path.py": (["--kernels", "swa", "--calls", "3"], check_host_path),
    "layer_traffic.py": (["configs/tiny.yml", "--variants", "vanilla", "aha", "--seq-len", "16", "--top", "50"],
                         check_layer_traffic),
    "generate_vs_hf.py": (["--quick"], check_generate_vs_hf),
    "gpu_targets.py": (gpu_targets_args, check_gpu_targets),
    "dimpo_memory.py": (["--docs", "1", "--layers", "1", "--seq-len", "16", "--max-steps", "1"], check_dimpo_memory),
    "dimpo_small.py": (["--train-steps", "1", "--epochs", "1", "--lr-scale", "1", "--seq-len", "16", "--docs", "1",
                        "1", "1"], check_dimpo_small),
    "dimpo_pairs.py": (["--train-steps", "1", "--epochs", "1", "--lr-scale", "1", "--seq-len", "16", "--docs", "1",
                        "1", "1", "--panels", "distance", "--ks", "1", "--dims", "4"], check_dimpo_pairs),
    # the --compare-hf part (the default on CPU) included
    "loss_memory.py": (["configs/tiny.yml", "seq_length=16", "train_micro_batch_size_per_gpu=1", "train_batch_size=1",
                        "--steps", "1", "--warmup", "0", "--repeats", "1"], check_loss_memory),
    "loss_speed.py": (["--positions", "64", "--hidden", "8", "--vocab", "300", "--rows", "7", "64", "--repeats", "1"],
                      check_loss_speed),
    "profile_step.py": (["configs/tiny.yml", "configs/attention/vanilla.yml", "seq_length=16", "train_batch_size=2",
                         "train_micro_batch_size_per_gpu=1", "--steps", "1", "--warmup", "1", "--top", "5"],
                        check_profile_step),
    # the README's quickstart itself, at 2 steps and 1 document per corpus
    "quickstart.py": (["--steps", "2", "--docs", "1", "--no-setup"], check_quickstart),
    "startup.py": (["configs/tiny.yml", "configs/attention/vanilla.yml", "seq_length=16", "train_batch_size=1",
                    "train_micro_batch_size_per_gpu=1", "--repeats", "1", "--tokens", "5000"], check_startup),
    "train_throughput.py": (["configs/tiny.yml", "configs/attention/vanilla.yml", "seq_length=16", "train_batch_size=2",
                             "train_micro_batch_size_per_gpu=1", "--steps", "1", "--warmup", "0"],
                            check_train_throughput),
}


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_runs_one_tiny_step_on_cpu(script, tmp_path):
    assert script in SMALLEST, f"bench/{script} has no smoke run: give it its smallest arguments in {__file__}"
    args, check = SMALLEST[script]
    args = args(tmp_path) if callable(args) else args
    out = tmp_path / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run([sys.executable, f"bench/{script}", *args, "--out", str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads(out.read_text())
    origin = report.get("provenance", report)  # decode.py nests it
    assert origin["git_commit"] and origin["date_utc"] and f"bench/{script}" in origin["command"], origin
    if script != "gpu_targets.py":  # it judges other results' numbers and measures none itself
        assert report.get("device"), f"bench/{script}'s result records no device"
    check(report)


def test_a_decode_step_off_by_a_fifth_fails_the_decode_benchmarks_check(tmp_path, monkeypatch, capsys):
    """bench/decode.py checks each variant's decode step against a float32 full forward before timing it: a DAR
    step whose attention output is 0.8x the right one is caught (its times still written, the exit status 1, the
    row marked); in bfloat16 too, against the forward's own rounding, at the Pythia-160M width (2 layers here:
    4.5x the bfloat16 forward's distance; 0.9x gives 2.3x, under the check's 3x slack)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import decode
    from neox_dar.standalone.dar import DARCache

    attend = DARCache.attend
    monkeypatch.setattr(DARCache, "attend", lambda self, *a, **k: 0.8 * attend(self, *a, **k))
    out = tmp_path / "decode.json"
    assert decode.main(["--variants", "vanilla,dar", "--contexts", "64", "--batches", "1", "--steps", "1",
                        "--warmup", "0", "--out", str(out)]) == 1
    assert "error: the decode step of dar does not give the full forward's logits" in capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["checks"]["vanilla"]["ok"] and not report["checks"]["dar"]["ok"]
    assert {x["variant"]: x["check_ok"] for x in report["results"]} == {"vanilla": True, "dar": False}
    args = type("Args", (), {"config": ["configs/pythia-160m.yml", "num_layers=2", "window_size=128"]})
    model = decode.build(args, "dar", torch.device("cpu"), torch.bfloat16)
    broken = decode.check_decode(model, torch.device("cpu"), torch.bfloat16)
    assert not broken["ok"] and broken["decode_rel_err"] > decode.CHECK_SLACK * broken["forward_rel_err"] > 0
    monkeypatch.setattr(DARCache, "attend", attend)
    assert decode.check_decode(model, torch.device("cpu"), torch.bfloat16)["ok"]


def test_decode_sdpa_backends_limit_the_decode_steps_attention(tmp_path, monkeypatch, capsys):
    """bench/decode.py --sdpa-backends: the checked and timed decode steps call scaled_dot_product_attention only
    under the named backends (math here: no CPU flash kernel runs), the report records them; a name torch does not
    have is a one-line error before any work."""
    sys.path.insert(0, str(ROOT / "bench"))
    import decode
    from torch.profiler import profile

    with profile() as prof, torch.inference_mode():
        q = torch.randn(1, 2, 1, 8)
        with decode.sdpa_backends(["math"])():
            torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(1, 1, 1, 1, dtype=bool))
    names = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_attention_math" in names
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" not in names
    seen = []
    attention = torch.nn.functional.scaled_dot_product_attention

    def spy(q, *args, **kwargs):  # a decode step's query: one token (the prefill's and the forwards' have more)
        if q.shape[2] == 1:
            seen.append(torch._C._get_math_sdp_enabled() and not torch._C._get_flash_sdp_enabled())
        return attention(q, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    out = tmp_path / "decode.json"
    assert decode.main(["--variants", "vanilla", "--contexts", "64", "--batches", "1", "--steps", "1", "--warmup",
                        "0", "--sdpa-backends", "math", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["sdpa_backends"] == ["math"]
    assert len(seen) >= 4 and all(seen)  # the check's 3 steps and the timed one, in each layer
    assert decode.main(["--sdpa-backends", "flash,fa9", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("error: --sdpa-backends takes names from flash, efficient, "
                                                        "math, cudnn, got flash,fa9")
    assert decode.main(["--variants", "vanilla", "--contexts", "64", "--batches", "1", "--steps", "1",
                        "--sdpa-backends", "cudnn", "--out", str(out)]) == 2  # no cuDNN on a CPU
    assert capsys.readouterr().err.splitlines()[-1] == ("error: --sdpa-backends cudnn: none of these runs the decode "
                                                        "step's attention on cpu in float32")


def test_step_profiles_put_every_attention_kernel_under_attention():
    """profile_step's categories by kernel name: the project's Triton kernels (names of the H200 runs) and SDPA's
    are attention, the fused loss's kernel and custom op the loss, cuBLAS's products matmul."""
    sys.path.insert(0, str(ROOT))
    from bench.profile_step import category

    attention = ["_fwd_kernel", "_bwd_kernel", "_dq_kernel", "_delta_kernel", "_routed_fwd_kernel",
                 "_routed_dq_kernel", "_range_partial_kernel", "neox_dar::mswa_backward",
                 "GeneratedBackwardFor_neox_dar_aha_forward_default", "MSWAFunctionBackward", "DARFunction",
                 "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1"
                 "_kernel0_0",
                 "void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*)"]
    assert {name: category(name) for name in attention} == {name: "attention" for name in attention}
    assert category("_cross_entropy_kernel") == category("neox_dar::fused_linear_cross_entropy") == "loss"
    assert category("nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NTN") == "matmul"


@pytest.mark.parametrize("script", ["train_throughput", "profile_step"])
@pytest.mark.parametrize("args,message", [
    (["configs/tiny.yml", "nope=1"], "error: unknown key 'nope' in the command line"),
    (["configs/tiny.yml", "--aha-mu-f", "0.1"],
     "error: --aha-mu-f needs a share in (0, 1) and a model with AHA layers"),
    (["configs/tiny.yml", "configs/attention/aha.yml", "--aha-mu-f", "1.5"], "error: --aha-mu-f needs a share"),
])
def test_training_benches_refuse_a_bad_config_or_share_in_one_line(script, args, message, capsys):
    """Both training benchmarks load their config the same way (bench.train_throughput.bench_config): a bad key or
    an AHA share without AHA layers is one line on stderr and exit 2, before any model is built."""
    import importlib

    sys.path.insert(0, str(ROOT))
    module = importlib.import_module(f"bench.{script}")
    with pytest.raises(SystemExit) as exit_info:
        module.main([*args, "--out", os.devnull])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith(message) and err.count("\n") == 1, err


def test_attention_bench_times_flex_only_for_the_flex_kernels(monkeypatch):
    """--flex-kernels (the kit's quick run: mswa, the one flex target) keeps inductor from compiling the other
    kernels' masks; every kernel still gets the other methods."""
    import torch

    sys.path.insert(0, str(ROOT))
    from bench import attention

    timed = []
    monkeypatch.setattr(attention, "build_cases", lambda name, T, args, *a: (None, dict.fromkeys(args.methods)))
    monkeypatch.setattr(attention, "check_outputs", lambda *a: {})
    monkeypatch.setattr(attention, "Timer", lambda *a: None)
    monkeypatch.setattr(attention, "check_and_time",
                        lambda name, T, method, *a: timed.append((name, method)) or {"kernel": name, "T": T,
                                                                                   "method": method})
    args = attention.parse_args(["--interpret", "--kernels", "dar", "mswa", "aha", "--methods", "triton", "flex",
                                 "--flex-kernels", "mswa"])
    args.methods = ["triton", "flex"]  # --interpret drops flex (a CPU compile takes minutes); the choice is tested
    attention.run_benchmarks(args, torch, None)
    assert timed == [("dar", "triton"), ("mswa", "triton"), ("aha", "triton"), ("mswa", "flex")]
    args.flex_kernels = None
    timed.clear()
    attention.run_benchmarks(args, torch, None)
    assert [m for m in timed if m[1] == "flex"] == [("dar", "flex"), ("mswa", "flex"), ("aha", "flex")]


def test_a_failed_profile_keeps_the_timings(monkeypatch):
    """bench/attention.py --profile: a profiler that raises leaves the row's timings and says why it has no
    profile (a GPU run must not lose a target's time to its diagnostics)."""
    import torch

    sys.path.insert(0, str(ROOT))
    from bench import attention

    def broken(*a, **k):
        raise RuntimeError("profiler unavailable\nsecond line")

    monkeypatch.setattr("neox_dar.timing.launch_profile", broken)
    args = attention.parse_args(["--interpret", "--warmup-ms", "0", "--rep-ms", "0"])
    timer = attention.Timer(torch, None, args, gpu=False)
    x = torch.randn(2, 4, 8, requires_grad=True)
    r = attention.timed(lambda t: t * 2, [x], timer, torch, chunk=2, profile=True)
    assert r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0
    assert r["profile"] == {"error": "RuntimeError: profiler unavailable"}


@pytest.mark.parametrize("graph", ["replays", "raises"])
def test_the_graph_replay_timing_is_recorded_or_its_error_keeps_the_timings(monkeypatch, graph):
    """bench/attention.py --profile on a GPU (the timer's device faked here): the forward+backward replayed from
    a CUDA graph is recorded beside the eager timings, and a capture that fails leaves them and says why."""
    import torch

    sys.path.insert(0, str(ROOT))
    from bench import attention

    def replayed(fn, timer, torch):
        if graph == "raises":
            raise RuntimeError("operation not permitted when stream is capturing\nsecond line")
        return 0.25

    monkeypatch.setattr(attention, "graph_ms", replayed)
    monkeypatch.setattr(attention.Timer, "ms", lambda self, fn: (fn(), 1.5)[1])
    monkeypatch.setattr(attention.Timer, "peak_mb", lambda self, fn: 3.0)
    args = attention.parse_args(["--interpret", "--warmup-ms", "0", "--rep-ms", "0"])
    timer = attention.Timer(torch, None, args, gpu=True)
    x = torch.randn(2, 4, 8, requires_grad=True)
    r = attention.timed(lambda t: t * 2, [x], timer, torch, chunk=2, profile=True)
    assert r["fwd_ms"] == r["fwd_bwd_ms"] == 1.5 and r["host_fwd_bwd_ms"] > 0 and "error" not in r["profile"]
    if graph == "replays":
        assert r["graph_fwd_bwd_ms"] == 0.25 and "graph_error" not in r
    else:
        assert r["graph_error"] == "RuntimeError: operation not permitted when stream is capturing"
        assert "graph_fwd_bwd_ms" not in r
