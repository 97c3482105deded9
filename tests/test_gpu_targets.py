"""bench/gpu_targets.py: the GPU issue's targets judged from one kit run's result files (made up here, in the
shapes bench/attention.py, bench/train_throughput.py and bench/decode.py write)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_targets import judge, markdown  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"


def attention_file(times: dict[tuple[str, int, str], float], device: str = H100) -> dict:
    return {"device": device, "cuda": "12.8" if device == H100 else None,
            "results": [{"kernel": k, "T": T, "method": m, "fwd_bwd_ms": ms} for (k, T, m), ms in times.items()]}


def throughput_run(attention: str, tokens_per_sec: float, mfu: float | None, hidden=768, layers=12, impl="triton",
                   device: str = H100, compiled: bool = False, mu_f: float | None = 0.1) -> dict:
    engine = {"tokens_per_sec": tokens_per_sec, "mfu": mfu}
    if attention == "aha" and mu_f is not None:
        engine["aha_mu_f"] = {"target": 0.1, "measured": mu_f}
    return {"device": device, "cuda": "12.8" if device == H100 else None,
            "config": {"hidden_size": hidden, "num_layers": layers, "attention_type": attention,
                       "attention_impl": impl, "torch_compile": compiled},
            "engine": engine}


def run_with_losses(attention: str, tokens: float, first: float, last: float = 10.0, compiled: bool = False,
                    impl: str = "triton") -> dict:
    """A throughput run that records its first- and last-step losses (MFU 0.41 compiled, 0.3 eager)."""
    r = throughput_run(attention, tokens, 0.41 if compiled else 0.3, impl=impl, compiled=compiled)
    r["engine"] |= {"loss_first_step": first, "loss_last_step": last}
    return r


def decode_file(rows: list[tuple[str, int, int, float]], device: str = H100, shape=(768, 12)) -> dict:
    return {"device": device, "model": {"hidden_size": shape[0], "num_layers": shape[1]},
            "results": [{"variant": v, "context": c, "batch": b, "speed_vs_vanilla": s} for v, c, b, s in rows]}


def write(folder: Path, **files: dict) -> Path:
    folder.mkdir(exist_ok=True)
    for name, content in files.items():
        (folder / f"{name}.json").write_text(json.dumps(content))
    return folder


def by_target(report: dict) -> dict[str, dict]:
    return {t["target"]: t for t in report["targets"]}


def test_attention_targets_at_every_the_shortest_and_the_longest_length(tmp_path):
    times = {}
    for T, sdpa in [(2048, 1.0), (8192, 10.0)]:
        times |= {("dar", T, "sdpa_causal"): sdpa, ("dar", T, "triton"): sdpa * (1.05 if T == 2048 else 1.2),
                  ("swa", T, "sdpa_causal"): sdpa,
                  ("swa", T, "triton"): sdpa * (0.4 if T == 2048 else 0.2), ("mswa", T, "sdpa_causal"): sdpa,
                  ("mswa", T, "triton"): sdpa * (0.5 if T == 2048 else 0.1), ("mswa", T, "flex"): sdpa * 0.4,
                  ("aha", T, "sdpa_causal"): sdpa, ("aha", T, "triton"): sdpa * 0.5}
    times[("mswa", 2048, "flex")] = None  # not timed (e.g. out of memory)
    report = judge(write(tmp_path / "run", attention=attention_file(times)))
    assert report["incomplete"] == [] and report["missing"] == ["train_throughput.json", "decode.json"]
    t = by_target(report)
    assert t["dar T=2048: triton / sdpa_causal fwd+bwd <= 1.1"]["met"] is True
    assert t["dar T=8192: triton / sdpa_causal fwd+bwd <= 1.1"]["met"] is False
    assert t["swa T=2048: triton / sdpa_causal fwd+bwd <= 0.45"]["met"] is True
    assert t["swa T=8192: triton / sdpa_causal fwd+bwd <= 0.15"]["met"] is False
    assert "swa T=8192: triton / sdpa_causal fwd+bwd <= 0.45" not in t  # each bound at its own length
    assert t["mswa T=2048: triton / sdpa_causal fwd+bwd <= 0.45"]["met"] is False
    assert t["mswa T=8192: triton / sdpa_causal fwd+bwd <= 0.15"]["met"] is True
    assert t["mswa T=2048: triton / flex fwd+bwd < 1"]["met"] is None  # flex not timed
    assert t["mswa T=2048: triton / flex fwd+bwd < 1"]["note"] == "flex not timed"
    assert t["aha T=2048: triton / sdpa_causal fwd+bwd <= 0.6"]["met"] is True
    assert t["aha T=8192: triton / sdpa_causal fwd+bwd <= 0.3"]["met"] is False


def test_attention_targets_report_the_graph_replayed_ratio_beside_the_judged_eager_one(tmp_path):
    """bench/attention.py --profile on a GPU also times each forward+backward replayed from a CUDA graph: the
    ratio of those is a note; the eager ratio alone is judged."""
    times = {("swa", 2048, "sdpa_causal"): 1.0, ("swa", 2048, "triton"): 1.2, ("swa", 8192, "sdpa_causal"): 10.0,
             ("swa", 8192, "triton"): 1.0}
    record = attention_file(times)
    graphs = {(2048, "sdpa_causal"): 0.8, (2048, "triton"): 0.24, (8192, "triton"): 0.9}  # no sdpa graph at 8192
    for r in record["results"]:
        if (r["T"], r["method"]) in graphs:
            r["graph_fwd_bwd_ms"] = graphs[(r["T"], r["method"])]
    t = by_target(judge(write(tmp_path / "run", attention=record)))
    short = t["swa T=2048: triton / sdpa_causal fwd+bwd <= 0.45"]
    long = t["swa T=8192: triton / sdpa_causal fwd+bwd <= 0.15"]
    assert short["met"] is False and short["value"] == pytest.approx(1.2)
    assert short["note"] == "replayed from CUDA graphs: 0.300"
    assert long["note"] == "" and long["met"] is True


def test_training_targets_mfu_with_and_without_compile_and_every_variant_against_vanilla(tmp_path):
    runs = [throughput_run("vanilla", 100_000, 0.30, impl="sdpa"), throughput_run("dar", 96_000, 0.29),
            throughput_run("mswa", 104_000, 0.27), throughput_run("swa", 106_000, 0.27),
            throughput_run("aha", 99_000, 0.28),
            throughput_run("vanilla", 120_000, 0.36, impl="sdpa", compiled=True),
            throughput_run("mswa", 130_000, 0.33, compiled=True),
            throughput_run("vanilla", 200_000, 0.30, hidden=512, layers=6, impl="sdpa"),
            throughput_run("dar", 180_000, 0.29, hidden=512, layers=6)]
    t = by_target(judge(write(tmp_path / "run", train_throughput={"runs": runs})))
    shape = "d 768 x 12 layers, torch_compile"
    assert t[f"{shape} false: vanilla MFU >= 0.28"]["met"] is True
    assert t[f"{shape} true: vanilla MFU >= 0.4"]["met"] is False
    assert t[f"{shape} false: DAR (triton) tokens/s / vanilla >= 0.95"]["met"] is True
    assert t[f"{shape} false: MSWA (triton) tokens/s / vanilla >= 1.05"]["met"] is False
    assert t[f"{shape} false: SWA (triton) tokens/s / vanilla >= 1.05"]["met"] is True
    assert t[f"{shape} false: AHA (triton) tokens/s / vanilla >= 1"]["met"] is False
    assert t[f"{shape} true: MSWA (triton) tokens/s / vanilla >= 1.05"]["value"] == pytest.approx(130 / 120)
    assert t[f"{shape} false: AHA (triton) tokens/s / vanilla >= 1"]["note"] == "mu_f 0.100"
    small = t["d 512 x 6 layers, torch_compile false: vanilla MFU >= 0.28"]
    assert small["met"] is None and not small["judged"] and "reported only" in small["note"]
    assert t["d 512 x 6 layers, torch_compile false: DAR (triton) tokens/s / vanilla >= 0.95"]["met"] is False


def test_the_compiled_step_joins_the_throughput_runs_and_its_repeat_of_a_run_replaces_it(tmp_path):
    """gpu_check.sh's train-compiled step (--part 4) writes train_compiled.json: compiled vanilla again, DAR, AHA
    and Pythia-410M. Alone it judges its own targets; beside train_throughput.json its vanilla gives the compiled MFU
    (the later run), while MSWA's compiled ratio takes the vanilla of its own file, measured beside it (it took the
    other step's)."""
    compiled = [throughput_run("vanilla", 125_000, 0.37, impl="sdpa", compiled=True),
                throughput_run("dar", 120_000, 0.36, compiled=True),
                throughput_run("aha", 126_000, 0.35, compiled=True),
                throughput_run("vanilla", 60_000, 0.46, hidden=1024, layers=24, impl="sdpa", compiled=True)]
    report = judge(write(tmp_path / "alone", train_compiled={"runs": compiled}))
    assert report["missing"] == ["attention.json", "decode.json"]
    t = by_target(report)
    shape = "d 768 x 12 layers, torch_compile true"
    assert t[f"{shape}: DAR (triton) tokens/s / vanilla >= 0.95"]["value"] == pytest.approx(120 / 125)
    assert t[f"{shape}: DAR (triton) tokens/s / vanilla >= 0.95"]["met"] is True
    assert t[f"{shape}: AHA (triton) tokens/s / vanilla >= 1"]["met"] is True
    assert t["d 1024 x 24 layers, torch_compile true: vanilla MFU >= 0.45"]["met"] is True
    eager = [throughput_run("vanilla", 100_000, 0.30, impl="sdpa"),
             throughput_run("vanilla", 120_000, 0.36, impl="sdpa", compiled=True),
             throughput_run("mswa", 130_000, 0.33, compiled=True)]
    t = by_target(judge(write(tmp_path / "both", train_throughput={"runs": eager}, train_compiled={"runs": compiled})))
    assert t[f"{shape}: vanilla MFU >= 0.4"]["value"] == 0.37
    assert t[f"{shape}: MSWA (triton) tokens/s / vanilla >= 1.05"]["value"] == pytest.approx(130 / 120)
    assert t["d 768 x 12 layers, torch_compile false: vanilla MFU >= 0.28"]["met"] is True


def test_a_run_whose_loss_is_not_finite_or_differs_under_compile_is_reported_not_judged(tmp_path):
    """bench/train_throughput.py records the first and last step's loss: a run whose loss is not finite is not
    judged (nor are the ratios over a vanilla that is not), and a compiled run's first-step loss must match the
    same run's without compile (the same seed and tokens) within LOSS_AGREEMENT."""
    run = run_with_losses
    runs = [run("vanilla", 100_000, 10.83, impl="sdpa"), run("dar", 96_000, 10.84),
            run("swa", 106_000, 10.82, last=float("nan")),
            run("vanilla", 120_000, 10.835, compiled=True, impl="sdpa"), run("dar", 118_000, 10.95, compiled=True)]
    t = by_target(judge(write(tmp_path / "run", train_throughput={"runs": runs})))
    shape = "d 768 x 12 layers, torch_compile"
    assert t[f"{shape} false: DAR (triton) tokens/s / vanilla >= 0.95"]["met"] is True
    swa = t[f"{shape} false: SWA (triton) tokens/s / vanilla >= 1.05"]
    assert swa["met"] is None and swa["value"] == 1.06 and swa["note"].startswith("loss not finite (10.82, nan)")
    compiled_vanilla = t[f"{shape} true: vanilla MFU >= 0.4"]
    assert compiled_vanilla["met"] is True
    assert compiled_vanilla["note"] == "first-step loss 10.8350 (10.8300 without compile)"
    dar = t[f"{shape} true: DAR (triton) tokens/s / vanilla >= 0.95"]
    assert dar["met"] is None
    assert dar["note"] == "first-step loss 10.9500 against 10.8400 without compile: reported only"
    runs[0]["engine"]["loss_first_step"] = float("inf")
    t = by_target(judge(write(tmp_path / "run", train_throughput={"runs": runs})))
    assert t[f"{shape} false: DAR (triton) tokens/s / vanilla >= 0.95"]["met"] is None
    assert "vanilla's run is not judged" in t[f"{shape} false: DAR (triton) tokens/s / vanilla >= 0.95"]["note"]


def test_aha_is_judged_only_at_about_a_tenth_of_its_rows_routed(tmp_path):
    """A zero-initialised router routes no row (the H200 runs before --aha-mu-f): AHA is then SWA plus a router."""
    for mu_f, judged, note in [(0.098, True, "mu_f 0.098"), (None, False, "routed share not set"),
                               (0.3, False, "mu_f 0.300, not near 0.1")]:
        runs = [throughput_run("vanilla", 100_000, 0.30, impl="sdpa"), throughput_run("aha", 90_000, 0.27, mu_f=mu_f)]
        (aha,) = [t for t in judge(write(tmp_path / "run", train_throughput={"runs": runs}))["targets"]
                  if "AHA" in t["target"]]
        assert aha["judged"] is judged and aha["note"].startswith(note) and aha["value"] == 0.9
        assert aha["met"] is (False if judged else None)


def test_decode_targets_at_the_longest_context_and_at_8k(tmp_path):
    rows = [("vanilla", 32768, 16, 1.0), ("dar", 32768, 16, 3.4), ("dar-latent", 32768, 16, 2.8),
            ("aha", 32768, 16, 1.5), ("dar", 32768, 1, 0.5), ("dar", 32768, 32, 0.1),
            ("vanilla", 8192, 16, 1.0), ("swa", 8192, 16, 1.3), ("aha", 8192, 16, 0.9)]
    t = by_target(judge(write(tmp_path / "run", decode=decode_file(rows))))
    p = "d 768 x 12 layers, context"
    assert set(t) == {f"{p} 32768, batch 16: dar tokens/s / vanilla >= 3",
                      f"{p} 32768, batch 16: dar-latent tokens/s / vanilla >= 3",
                      f"{p} 32768, batch 16: aha tokens/s / vanilla >= 2",
                      f"{p} 8192, batch 16: swa tokens/s / vanilla (step time no longer) >= 1",
                      f"{p} 8192, batch 16: aha tokens/s / vanilla (step time no longer) >= 1"}
    assert t[f"{p} 32768, batch 16: dar tokens/s / vanilla >= 3"]["met"] is True
    assert t[f"{p} 32768, batch 16: dar-latent tokens/s / vanilla >= 3"]["met"] is False
    assert t[f"{p} 32768, batch 16: aha tokens/s / vanilla >= 2"]["met"] is False
    assert t[f"{p} 8192, batch 16: swa tokens/s / vanilla (step time no longer) >= 1"]["met"] is True
    assert t[f"{p} 8192, batch 16: aha tokens/s / vanilla (step time no longer) >= 1"]["met"] is False
    # a run at other conditions: the 32k targets are "not measured" (they were judged at the longest context that
    # ran, with any batch), and a float32 decode is reported only
    short = judge(write(tmp_path / "short", decode=decode_file([r for r in rows if r[1] == 8192] + [
        ("dar", 8192, 16, 3.1)]) | {"dtype": "float32"}))
    t = by_target(short)
    assert t[f"{p} 32768, batch 16: dar tokens/s / vanilla >= 3"]["note"] == "not measured"
    assert t[f"{p} 8192, batch 16: swa tokens/s / vanilla (step time no longer) >= 1"]["met"] is None


def test_a_decode_whose_check_failed_is_reported_not_judged(tmp_path):
    # bench/decode.py checks each variant's decode against a float32 forward before timing it: a variant that
    # failed (or vanilla, the denominator) is not judged on its speed
    rows = [("vanilla", 32768, 16, 1.0), ("dar", 32768, 16, 3.4), ("aha", 32768, 16, 2.5), ("swa", 8192, 16, 6.0),
            ("vanilla", 8192, 16, 1.0)]
    report = decode_file(rows) | {"checks": {"vanilla": {"ok": True}, "dar": {"ok": False}, "aha": {"ok": True},
                                             "swa": {"ok": True}}}
    t = by_target(judge(write(tmp_path / "run", decode=report)))
    p = "d 768 x 12 layers, context"
    dar = t[f"{p} 32768, batch 16: dar tokens/s / vanilla >= 3"]
    assert dar["value"] == 3.4 and dar["met"] is None and not dar["judged"]
    assert dar["note"] == "decode check failed for dar: reported only"
    assert t[f"{p} 32768, batch 16: aha tokens/s / vanilla >= 2"]["met"] is True
    report["checks"]["vanilla"]["ok"] = False
    t = by_target(judge(write(tmp_path / "run", decode=report)))
    assert t[f"{p} 32768, batch 16: dar tokens/s / vanilla >= 3"]["note"] == \
        "decode check failed for dar, vanilla: reported only"
    assert {r["met"] for r in t.values()} == {None}


def test_decode_on_another_shape_than_pythia_160m_is_reported_not_judged(tmp_path):
    # a GPU run measured a 6-layer 512-wide model under the name of the 160M preset: its ratios are not the targets'
    rows = [("vanilla", 32768, 16, 1.0), ("dar", 32768, 16, 3.6)]
    t = by_target(judge(write(tmp_path / "run", decode=decode_file(rows, shape=(512, 6)))))
    dar = t["d 512 x 6 layers, context 32768, batch 16: dar tokens/s / vanilla >= 3"]
    assert dar["value"] == 3.6 and dar["met"] is None and not dar["judged"] and "reported only" in dar["note"]


def test_cpu_results_are_computed_not_judged_and_missing_files_named(tmp_path):
    cpu = "CPU x86_64 (2 threads)"
    folder = write(tmp_path / "run", decode=decode_file([("vanilla", 64, 1, 1.0), ("dar", 64, 1, 1.3)], cpu),
                   train_throughput={"runs": [throughput_run("vanilla", 10, None, device=cpu),
                                              throughput_run("dar", 12, None, device=cpu)]})
    report = judge(folder)
    assert report["missing"] == ["attention.json"]
    assert all(not t["judged"] and t["met"] is None for t in report["targets"])
    table = markdown(report)
    assert "| d 768 x 12 layers, context 64, batch 1: dar tokens/s / vanilla >= 3 | 1.300 | not judged |" in table
    assert "| 1.200 | not judged |" in table and "Not measured (no result file): attention.json." in table


def test_command_line(tmp_path):
    folder = write(tmp_path / "run", decode=decode_file([("vanilla", 32768, 16, 1.0), ("dar", 32768, 16, 3.5)]))
    res = subprocess.run([sys.executable, "bench/gpu_targets.py", str(folder), "--out", str(tmp_path / "t.json")],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "| d 768 x 12 layers, context 32768, batch 16: dar tokens/s / vanilla >= 3 | 3.500 | yes |" in res.stdout
    assert json.loads((tmp_path / "t.json").read_text())["targets"][0]["met"] is True
    (folder / "decode.json").write_text('{"results": [{"variant": "dar"}]}')
    res = subprocess.run([sys.executable, "bench/gpu_targets.py", str(folder)], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "is not one the kit writes" in res.stderr


def test_the_parts_of_one_run_are_judged_together(tmp_path):
    """`gpu_targets.py PART2 PART4`: parts 2 and 4 of one lease, two commands and two output folders. The
    throughput runs of both count (part 4's compiled vanilla replacing part 2's), so the compiled runs' first-step
    losses meet their eager runs' from part 2; decode comes from the folder that has it; a folder that is not one
    is refused in one line."""
    run = run_with_losses
    part2 = write(tmp_path / "part2", decode=decode_file([("vanilla", 32768, 16, 1.0), ("dar", 32768, 16, 3.2)]),
                  train_throughput={"runs": [run("vanilla", 100_000, 10.83, impl="sdpa"), run("dar", 82_000, 10.84),
                                             run("vanilla", 110_000, 10.83, compiled=True, impl="sdpa")]})
    part4 = write(tmp_path / "part4", train_compiled={"runs": [run("vanilla", 120_000, 10.831, compiled=True,
                                                                   impl="sdpa"),
                                                               run("dar", 116_000, 10.9, compiled=True)]})
    report = judge(part2, part4)
    assert report["folders"] == [str(part2), str(part4)] and report["missing"] == ["attention.json"]
    t = by_target(report)
    shape = "d 768 x 12 layers, torch_compile"
    assert t[f"{shape} true: vanilla MFU >= 0.4"]["note"] == "first-step loss 10.8310 (10.8300 without compile)"
    dar = t[f"{shape} true: DAR (triton) tokens/s / vanilla >= 0.95"]
    assert dar["value"] == pytest.approx(116 / 120) and dar["met"] is None  # its loss is not the eager run's
    assert t[f"{shape} false: DAR (triton) tokens/s / vanilla >= 0.95"]["value"] == pytest.approx(0.82)
    assert t["d 768 x 12 layers, context 32768, batch 16: dar tokens/s / vanilla >= 3"]["met"] is True
    res = subprocess.run([sys.executable, "bench/gpu_targets.py", str(part2), str(tmp_path / "nope")], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.strip().endswith("nope is not a folder")


def test_a_ratio_takes_its_vanilla_from_its_own_file_and_machine(tmp_path):
    """A variant's tokens/s is judged against the vanilla measured beside it, in its own file and on its machine:
    folders of two runs given together mixed them (AHA and SWA of one run over another run's vanilla, judged "yes");
    now a ratio without a vanilla in its file, or whose runs record different machines, is reported only."""
    run = run_with_losses
    one, other = {"machine": "boot-a/GPU-1"}, {"machine": "boot-b/GPU-1"}
    first = write(tmp_path / "first", train_throughput={"runs": [run("vanilla", 100_000, 10.83, impl="sdpa") | one,
                                                                 run("mswa", 110_000, 10.83) | one,
                                                                 run("dar", 99_000, 10.83) | other]})
    second = write(tmp_path / "second", train_compiled={"runs": [run("swa", 120_000, 10.83)]})
    t = by_target(judge(first, second))
    shape = "d 768 x 12 layers, torch_compile false"
    dar = t[f"{shape}: DAR (triton) tokens/s / vanilla >= 0.95"]
    assert dar["value"] == pytest.approx(0.99) and dar["met"] is None
    assert dar["note"] == "measured on another machine than vanilla's run: reported only"
    assert t[f"{shape}: MSWA (triton) tokens/s / vanilla >= 1.05"]["met"] is True
    swa = t[f"{shape}: SWA (triton) tokens/s / vanilla >= 1.05"]
    assert swa["value"] is None and swa["met"] is None and swa["note"].startswith("no vanilla run in its file")


def test_device_report_names_the_machine_and_its_start():
    """The benchmarks' device_report() records the machine id gpu_targets compares: the boot id (a CPU here)."""
    from neox_dar.provenance import device_report

    boot = Path("/proc/sys/kernel/random/boot_id")
    expected = boot.read_text().strip() if boot.exists() else None
    assert device_report()["machine"] == expected


def test_a_stopped_attention_run_is_named_incomplete(tmp_path):
    """bench/attention.py rewrites its JSON after each (kernel, T) with "complete": false until it ends."""
    partial = attention_file({("dar", 2048, "triton"): 1.0, ("dar", 2048, "sdpa_causal"): 1.0}) | {"complete": False}
    report = judge(write(tmp_path / "run", attention=partial))
    measured = [t for t in report["targets"] if t["note"] != "not measured"]
    assert report["incomplete"] == ["attention.json"] and len(measured) == 1
    # every other target of the issue is a row that says so (it vanished), at its own T (never judged at another)
    absent = {t["target"] for t in report["targets"] if t["note"] == "not measured"}
    assert "dar T=8192: triton / sdpa_causal fwd+bwd <= 1.1" in absent and "aha T=8192: triton / sdpa_causal " \
        "fwd+bwd <= 0.3" in absent and len(absent) == 9
    assert "Stopped before the end (what it measured is above): attention.json." in markdown(report)


def test_a_cuda_build_of_torch_on_the_cpu_is_not_judged(tmp_path):
    """The rehearsal hides the GPU: a CUDA build of torch then records its CUDA version on CPU numbers."""
    cpu = "CPU x86_64 (2 threads)"
    runs = [throughput_run(a, t, None, device=cpu) | {"cuda": "13.0"} for a, t in (("vanilla", 10), ("dar", 12))]
    times = {("dar", 32, "triton"): 2.0, ("dar", 32, "sdpa_causal"): 1.0}
    report = judge(write(tmp_path / "run", train_throughput={"runs": runs},
                         attention=attention_file(times, device="cpu (TRITON_INTERPRET=1)") | {"cuda": "13.0"}))
    assert report["targets"] and all(t["met"] is None and not t["judged"] for t in report["targets"])
