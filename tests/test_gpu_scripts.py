"""scripts/gpu_wheels.sh and scripts/gpu_check.sh on the CPU: argument handling, the plan (it must fit the GPU
machine's 10-minute command limit and, for the targets' measurements, one 15-minute lease), steps that keep going past a failure or a time limit, the whole kit rehearsed on
the CPU at toy sizes (`--rehearse`), and the wheel set (it must resolve for the GPU machine's Python 3.12, torch 2.11
and Triton 3.6, with every dependency there)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
SAMPLE = ROOT / "runs" / "gpu_sample"
COMMAND_LIMIT_S = 600  # the device tool's limit on one command


def run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / script), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def plan_steps(out: str) -> list[str]:
    return re.findall(r"^\d+\. (\S+)", out, flags=re.M)


def plan_commands(out: str) -> dict[str, list[str]]:
    """The plan's command lines, per step."""
    steps: dict[str, list[str]] = {}
    for line in out.splitlines():
        if m := re.match(r"\d+\. (\S+)", line):
            steps[m.group(1)] = []
        elif line.startswith("     ") and steps:
            steps[list(steps)[-1]].append(line.strip())
    return steps


def summary_rows(path: Path) -> dict[str, str]:
    """summary.md's first table: step -> status."""
    table = path.read_text().split("| step |", 1)[1].split("\n\n", 1)[0]
    rows = [r.split("|") for r in table.splitlines() if r.startswith("| ")]
    return {r[1].strip(): r[2].strip() for r in rows}


LEASE_S = 900  # a session's device time, the machine's start included
START_S = 150  # what a machine's start and the transfers may take of it (38 s and ~130 s on 2026-11-28's H200s)


def test_the_quick_plan_is_four_parts_each_inside_one_command_and_the_first_two_inside_one_lease():
    res = run("gpu_check.sh", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert plan_steps(res.stdout) == ["install", "kernel-tests", "identities", "bench-attention", "train-throughput",
                                      "train-compiled", "train-profile", "train-smoke", "decode"]
    assert "over the device tool's 600s command limit: run --part 1, then --part 2 (one 15-minute lease)" in res.stdout
    parts, totals = {}, {}
    for part in ("1", "2", "3", "4"):
        out = run("gpu_check.sh", "--part", part, "--dry-run").stdout
        totals[part] = int(re.search(r"time limit in all: (\d+)s", out).group(1))
        assert totals[part] <= COMMAND_LIMIT_S - 30, f"part {part} must end (summary included) inside one command"
        parts[part] = plan_steps(out)
    assert parts == {"1": ["install", "kernel-tests", "bench-attention"],
                     "2": ["install", "train-throughput", "decode"],
                     "3": ["install", "identities", "train-profile", "train-smoke"],
                     "4": ["install", "train-compiled"]}
    assert totals["1"] + totals["2"] <= LEASE_S - START_S, "the targets' measurements must fit one lease"
    assert totals["2"] + totals["4"] - 25 <= LEASE_S - START_S, "parts 2 and 4 fit one lease (one install)"
    throughput = plan_commands(res.stdout)["train-throughput"]
    # the MFU target's model, Pythia-160M: the five variants without compile, vanilla and MSWA with it, the runs
    # a time limit may cut last
    assert len(throughput) == 7 and all("pythia-160m" in t for t in throughput)
    assert [re.search(r"attention/(\w+)\.yml .*torch_compile=(\w+)", t).groups() for t in throughput] == [
        ("vanilla", "false"), ("mswa", "false"), ("swa", "false"), ("dar", "false"), ("aha", "false"),
        ("vanilla", "true"), ("mswa", "true")]
    assert "train_batch_size=32" in throughput[0]  # two of the config's 16-sample micro-batches
    assert [("--aha-mu-f 0.1" in t) for t in throughput] == [False] * 4 + [True] + [False] * 2  # AHA at 10% routed
    # with torch_compile, the targets the throughput step leaves open: compiled vanilla first (the denominator),
    # DAR, AHA at 10% routed, then Pythia-410M's MFU (two of its 8-sample micro-batches)
    compiled = plan_commands(res.stdout)["train-compiled"]
    assert [re.search(r"pythia-(\w+)\.yml configs/attention/(\w+)\.yml .*attention_impl=(\w+) torch_compile=true",
                      c).groups() for c in compiled] == [("160m", "vanilla", "sdpa"), ("160m", "dar", "triton"),
                                                         ("160m", "aha", "triton"), ("410m", "vanilla", "sdpa")]
    assert [("--aha-mu-f 0.1" in c) for c in compiled] == [False, False, True, False]
    assert "train_batch_size=16" in compiled[3] and all(re.search(r"--out \S+/train-compiled/[\w-]+\.json$", c)
                                                        for c in compiled)
    # the step profiles at the same shape: the open targets' variants first, the compiled run last
    profiles = plan_commands(res.stdout)["train-profile"]
    assert [re.search(r"attention/(\w+)\.yml .*attention_impl=(\w+) torch_compile=(\w+)", c).groups()
            for c in profiles] == [("aha", "triton", "false"), ("dar", "triton", "false"), ("vanilla", "sdpa", "false"),
                                   ("mswa", "triton", "false"), ("vanilla", "sdpa", "true")]
    assert all("bench/profile_step.py configs/pythia-160m.yml" in c and "train_batch_size=32" in c
               and re.search(r"--out \S+/profile/[\w-]+\.json$", c) for c in profiles)
    assert [("--aha-mu-f 0.1" in c) for c in profiles] == [True] + [False] * 4
    assert "-k long_sequence" in res.stdout and "-k 'not long_sequence and not float32]'" in res.stdout
    assert res.stdout.count("exit_interval=100") == 1  # one command, run twice: stop with a checkpoint, resume
    assert "bench/decode.py --dtype bfloat16 --profile --preset pythia-160m" in res.stdout
    bad = run("gpu_check.sh", "--part", "5", "--dry-run")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--part needs 1" in bad.stderr


def test_full_plan_covers_the_throughput_grid_and_steps_run_in_plan_order():
    res = run("gpu_check.sh", "--full", "--dry-run")
    assert res.returncode == 0, res.stderr
    throughput = plan_commands(res.stdout)["train-throughput"]
    # 70M and 160M x torch_compile off/on x (vanilla on sdpa + DAR, SWA, MSWA, AHA on triton and on sdpa)
    assert len(throughput) == 2 * 2 * 9
    assert "-k 'not long_sequence'" in res.stdout  # every kernel test, float32 included
    assert {(m, c) for m in ("70m", "160m") for c in ("false", "true")} == {
        (re.search(r"pythia-(\w+)\.yml", t).group(1), re.search(r"torch_compile=(\w+)", t).group(1))
        for t in throughput}
    res = run("gpu_check.sh", "--steps", "train-smoke,kernel-tests", "--dry-run")
    assert plan_steps(res.stdout) == ["install", "kernel-tests", "train-smoke"]


def test_rehearsal_plan_is_the_gpu_plan_at_toy_sizes():
    """Step by step, the rehearsal runs the same scripts, configs and tests with the same result files; only sizes
    (and the install, which has no wheels to install) differ."""
    gpu = plan_commands(run("gpu_check.sh", "--dry-run").stdout)
    rehearsal = plan_commands(run("gpu_check.sh", "--rehearse", "--dry-run").stdout)
    assert list(rehearsal) == list(gpu)
    # the torch_compile runs stay on the GPU (inductor's CPU build takes minutes; tests/test_compile.py covers it)
    for step in ("train-throughput", "train-compiled", "train-profile"):
        gpu[step] = [c for c in gpu[step] if "torch_compile=true" not in c]
    files = re.compile(r"(?:tests|bench|configs(?:/attention)?)/[\w.-]+|train\.py|[\w-]+\.json|-k long_sequence")
    for step in list(gpu)[1:]:
        assert [files.findall(c) for c in rehearsal[step]] == [files.findall(c) for c in gpu[step]], step
    assert "--interpret" in rehearsal["bench-attention"][0] and "precision=fp32" in rehearsal["train-smoke"][0]
    assert "KERNEL_TESTS_LONG_T=32 " in rehearsal["identities"][0]
    assert "KERNEL_TESTS_LONG_T=8192 " in gpu["identities"][0]


def test_rehearsal_runs_every_step_on_the_cpu(tmp_path):
    """`gpu_check.sh --rehearse`: every step of the kit on this CPU at toy sizes, the same result files and summary."""
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--rehearse"], cwd=ROOT, capture_output=True,
                         text=True, timeout=1200, env={**os.environ, "OUT": str(out), "TMPDIR": str(tmp_path)})
    log = (out / "gpu_check.log").read_text() if (out / "gpu_check.log").exists() else ""
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr[-3000:]
    assert summary_rows(out / "summary.md") == {s: "ok" for s in ["install", "kernel-tests", "identities",
                                                                  "bench-attention", "train-throughput",
                                                                  "train-compiled", "train-profile", "train-smoke",
                                                                  "decode"]}
    assert json.loads((out / "train_compiled.json").read_text()) == {"runs": []}  # compiled runs: the GPU's only
    assert "rehearsal on this CPU at toy sizes" in (out / "summary.md").read_text()
    assert re.search(r"\b8 passed\b", log) and "train-smoke: loss falls, resume continued to step 12" in log
    attention = json.loads((out / "attention.json").read_text())
    assert {r["kernel"] for r in attention["results"]} == {"dar", "swa", "mswa", "aha"}
    assert not [r for r in attention["results"] if r.get("error")]
    runs = json.loads((out / "train_throughput.json").read_text())["runs"]
    assert sorted((r["config"]["attention_type"], r["config"]["attention_impl"]) for r in runs) == [
        ("aha", "triton"), ("dar", "triton"), ("mswa", "triton"), ("swa", "triton"), ("vanilla", "sdpa")]
    assert all(r["engine"]["tokens_per_sec"] > 0 and r["device"].startswith("CPU") for r in runs)
    (aha,) = [r["engine"]["aha_mu_f"] for r in runs if r["config"]["attention_type"] == "aha"]
    assert aha["target"] == 0.1 and 0 < aha["measured"] < 0.3  # 1 - 0.1 quantile thresholds; the router trains
    profiles = {p.name: json.loads(p.read_text()) for p in (out / "profile").glob("*.json")}
    assert sorted(profiles) == [f"{a}-compile_false.json" for a in ("aha-triton", "dar-triton", "mswa-triton",
                                                                      "vanilla-sdpa")]
    assert all(r["profile"]["kernel_ms"] > 0 and r["profile"]["top"] for r in profiles.values())
    assert 0 < profiles["aha-triton-compile_false.json"]["profile"]["aha_mu_f"]["measured"] < 0.3
    decode = json.loads((out / "decode.json").read_text())
    assert decode["dtype"] == "bfloat16" and {r["context"] for r in decode["results"]} == {64}
    # the targets, from the same files: every ratio computed, none judged off a GPU
    targets = json.loads((out / "targets.json").read_text())
    assert targets["missing"] == [] and {t["area"] for t in targets["targets"]} == {"attention", "training", "decode"}
    assert all(t["met"] is None and not t["judged"] for t in targets["targets"])
    # every ratio measured but flex's (not run on a CPU: minutes to compile) and the MFU (no peak FLOP/s for a CPU)
    assert all(t["value"] > 0 for t in targets["targets"] if not {"MFU", "flex"} & set(t["target"].split()))
    summary = (out / "summary.md").read_text()
    assert re.search(r"^\| aha \(triton\), \d+% routed \| [\d.]+ \| [\d.]+ \(\d+%\) \|", summary, flags=re.M)
    assert "| decode | d 128 x 4 layers, context 64, batch 1: dar tokens/s / vanilla >= 3 (" in summary


@pytest.mark.parametrize("args,message", [
    (["--steps", "kernel-tests,nope"], "unknown step 'nope'"),
    (["--dry-run", "--steps"], "--steps needs a comma-separated list"),
    (["--quick", "--full"], "--quick and --full exclude each other"),
    (["--fast"], "unknown argument '--fast'"),
])
def test_bad_arguments_are_one_line_errors(args, message):
    res = run("gpu_check.sh", *args)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and res.stdout == "" and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"gpu_check.sh: error: {message}")


@pytest.mark.parametrize("var", ["OUT", "TMPDIR"])
def test_a_path_with_a_space_is_refused_before_any_step(tmp_path, var):
    spaced = tmp_path / "my runs"
    res = run("gpu_check.sh", "--rehearse", **{var: str(spaced)})
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and res.stdout == "" and len(lines) == 1, res.stderr
    assert lines[0].startswith("gpu_check.sh: error: the kit's paths must not contain spaces;") and "my runs" in lines[0]
    assert not spaced.exists()


def test_a_copy_without_git_goes_past_a_failure_and_a_time_limit_and_records_its_commit(tmp_path):
    """The GPU machine gets the tree without .git: NEOX_DAR_GIT_COMMIT names the commit, and the summary and every
    result file record it (not None, not a git repository above the copy). No wheels (the install fails), a
    2-second limit on the kernel tests (killed, with their workers): the script goes on, writes its log and summary
    under $OUT and exits 1."""
    copy = tmp_path / "tree"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes((ROOT / name).read_bytes())
    (tmp_path / "no_wheels").mkdir()
    res = subprocess.run(["bash", str(copy / "scripts" / "gpu_check.sh"), "--steps", "kernel-tests,decode"], cwd=copy,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OUT": str(tmp_path / "out"), "GPU_WHEELS": str(tmp_path / "no_wheels"),
                              "TMPDIR": str(tmp_path), "NEOX_DAR_GIT_COMMIT": "cafe1234",
                              "GPU_CHECK_LIMIT_kernel_tests": "2",
                              # the preset's six variants on a 2-layer, 64-wide model of its config (the 160M
                              # shape takes ~13 s to build six times on the CPU)
                              "GPU_CHECK_DECODE_ARGS": "--contexts 64 --batches 1 --steps 1 --warmup 0 --dtype float32 "
                                                       "configs/pythia-160m.yml window_size=16 num_layers=2 "
                                                       "hidden_size=64 num_attention_heads=4"})
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-2000:]
    rows = summary_rows(tmp_path / "out" / "summary.md")
    assert rows == {"install": "FAILED (1)", "kernel-tests": "TIMEOUT", "decode": "ok"}, rows
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert "no wheels in" in log and "=================== kernel-tests: TIMEOUT" in log
    assert "commit cafe1234:" in (tmp_path / "out" / "summary.md").read_text()
    decode = json.loads((tmp_path / "out" / "decode.json").read_text())
    assert len(decode["results"]) == 6  # the pythia-160m preset's variants
    assert decode["provenance"]["git_commit"] == "cafe1234" and decode["provenance"]["git_dirty"] is None
    targets = json.loads((tmp_path / "out" / "targets.json").read_text())
    assert targets["git_commit"] == "cafe1234"


needs_wheels = pytest.mark.skipif(not (WHEELS.is_dir() and (SAMPLE / "c4_sample.bin").is_file()),
                                  reason=".whl/ or runs/gpu_sample/ not built: run bash scripts/gpu_wheels.sh (PyPI)")


@needs_wheels
def test_wheel_set_resolves_for_python_312_and_fits_the_transfer_limit():
    """pip installs every pinned wheel for CPython 3.12 manylinux x86_64 (--dry-run --no-index --only-binary), the
    dependencies close over .whl/ and the GPU machine's packages, and what travels stays under 64 MiB."""
    res = run("gpu_wheels.sh", "--check")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "wheels, closed" in res.stdout and "ok: carry .whl and runs/gpu_sample" in res.stdout
    assert "resolved: " in res.stdout and "over torch 2.11.0, triton 3.6.0" in res.stdout
    assert not list(WHEELS.glob("torch-*.whl")) and not list(WHEELS.glob("triton-*.whl"))


@needs_wheels
def test_wheel_check_names_a_missing_wheel(tmp_path):
    partial = tmp_path / "wheels"
    partial.mkdir()
    for w in WHEELS.glob("*.whl"):
        if not w.name.startswith("hjson-"):  # a DeepSpeed dependency the GPU machine lacks
            (partial / w.name).symlink_to(w)
    res = run("gpu_wheels.sh", "--check", GPU_WHEELS=str(partial))
    assert res.returncode == 2
    assert "gpu_wheels.sh: error:" in res.stderr and "hjson" in res.stdout + res.stderr


def test_the_inference_docs_paper_preset_command_prints_what_they_say():
    """docs/inference.md runs a paper's decode preset through the kit's decode step: its command's dry run prints
    the bench/decode.py line the docs quote (the last --preset wins, no --contexts of the kit's own)."""
    text = " ".join((ROOT / "docs" / "inference.md").read_text().split())
    limit, command, printed = re.search(r"\(`GPU_CHECK_LIMIT_decode=(\d+) GPU_CHECK_DECODE_ARGS=\"([^\"]+)\" "
                                        r"bash scripts/gpu_check.sh --steps decode`, whose `--dry-run` prints "
                                        r"`([^`]+)`", text).groups()
    res = run("gpu_check.sh", "--steps", "decode", "--dry-run", GPU_CHECK_LIMIT_decode=limit,
              GPU_CHECK_DECODE_ARGS=command)
    assert res.returncode == 0, res.stderr
    assert f"decode            (time limit  {limit}s)" in res.stdout and f" {printed} --out" in res.stdout


def test_the_inference_docs_sdpa_backends_command_reaches_the_decode_step():
    """docs/inference.md's --sdpa-backends example through the kit's decode step: its dry run's bench/decode.py line
    carries the option (bench/decode.py's own handling of it: tests/test_bench.py)."""
    text = " ".join((ROOT / "docs" / "inference.md").read_text().split())
    (command,) = re.findall(r"`GPU_CHECK_DECODE_ARGS=\"([^\"]*--sdpa-backends[^\"]*)\" bash scripts/gpu_check.sh "
                            r"--steps decode`", text)
    res = run("gpu_check.sh", "--steps", "decode", "--dry-run", GPU_CHECK_DECODE_ARGS=command)
    assert res.returncode == 0, res.stderr
    assert f" --preset pythia-160m {command} --out" in res.stdout


def test_the_parts_time_limits_in_the_kernels_doc_are_the_plans():
    """docs/kernels.md gives each --part's summed time limits: they are what --dry-run prints."""
    doc = (ROOT / "docs" / "kernels.md").read_text()
    said = dict(re.findall(r"^bash scripts/gpu_check\.sh --part (\d) .*?\((\d+) s of limits", doc, flags=re.M))
    assert sorted(said) == ["1", "2", "3", "4"]
    for part, seconds in said.items():
        out = run("gpu_check.sh", "--part", part, "--dry-run").stdout
        assert re.search(r"time limit in all: (\d+)s", out).group(1) == seconds, part
