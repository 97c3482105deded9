"""Committed results (results/*/, written by ``python -m neox_dar.report.publish``) are what the committed code
rebuilds from the committed run files, and the tables in the docs are those reports: no number is typed."""

from __future__ import annotations

import json
import os
import re
import statistics
from pathlib import Path

import pytest

from neox_dar.report.__main__ import report_tables
from neox_dar.report.collect import collect
from neox_dar.report.publish import PROVENANCE, block
from neox_dar.report.tables import to_markdown

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted(p for p in (ROOT / "results").glob("*") if (p / PROVENANCE).is_file())
DOCS = {name: ROOT / "docs" / "experiments.md"  # results folder -> the document showing its table
        for name in ("replicate-cpu", "results-round2", "results-round2-finetune")}
ROUND2 = [p for p in RESULTS if p.name.startswith("results-round2")]


@pytest.mark.parametrize("folder", RESULTS, ids=[p.name for p in RESULTS])
def test_committed_report_is_rebuilt_from_the_run_files_and_the_docs_show_it(folder):
    meta = json.loads((folder / PROVENANCE).read_text())
    assert meta["device"] and meta["training_command"] and meta["published"]["git_commit"]
    assert all(r["trained_with"] and r["trained_with"]["git_commit"] for r in meta["runs"].values())
    runs, sweep, _ = collect(folder / "runs")
    md = "\n".join(to_markdown(t) for t in report_tables(runs, sweep.report))
    assert md == (folder / "report" / "table.md").read_text()
    doc = DOCS.get(folder.name)
    if doc is not None:
        assert block(doc, folder.name) == md.rstrip(), (f"regenerate with: python -m neox_dar.report.publish ... "
                                                        f"{folder} --docs {doc.relative_to(ROOT)}")


def test_the_cpu_replication_is_committed():
    assert "replicate-cpu" in [p.name for p in RESULTS]


def test_the_orderings_docs_state_for_the_cpu_replication():
    """docs/experiments.md ("What was seen") states these orderings of the committed CPU replication."""
    runs, sweep, _ = collect(ROOT / "results" / "replicate-cpu" / "runs")
    table = report_tables(runs, sweep.report)[0]
    row = {r[0]: dict(zip(table.columns, r)) for r in table.rows}
    rel = {name: r["Rel. (%)"] for name, r in row.items()}
    floor = abs(rel["vanilla-seed2"] - 100)
    assert rel["dar"] < rel["uniform"] and rel["uniform"] > 100 + floor
    assert [n for n, v in rel.items() if isinstance(v, float) and v > 100 + floor] == ["uniform"]
    for name in ("dar", "swa", "mswa", "aha-w16", "aha-w64", "mswa-linear"):
        assert rel[name] < 100 - floor, name
    assert rel["mswa"] < rel["swa"] and row["mswa"]["Cost"] < row["swa"]["Cost"]
    assert (row["mswa"]["KV (B/token)"], row["swa"]["KV (B/token)"]) == (225.0, 256.0)
    assert row["aha-w64"]["mu_f (%)"] < row["aha-w16"]["mu_f (%)"] and rel["aha-w64"] > rel["aha-w16"]
    assert rel["mswa"] * 1.05 < rel["mswa-linear"] < 100 - floor


def test_aha_mu_f_order_of_the_cpu_replication_rests_on_one_head():
    """docs/experiments.md (the CPU replication, AHA): the final mu_f order of aha-w16 over aha-w64 comes from layer 0
    head 0 (0.685 against 0.064); the other 15 heads average 0.248 and 0.246; the training log's mu_f is higher at
    w = 64 at every logged step from 50 to 240, and at 27 of the 80 logged steps."""
    runs = ROOT / "results" / "replicate-cpu" / "runs"
    heads = {}
    for run in ("aha-w16", "aha-w64"):
        corpora = json.loads((runs / run / "eval" / "perplexity.json").read_text())["corpora"].values()
        per = [[x for layer in range(4) for x in c["attention_stats"][f"layer{layer}/mu_f"]] for c in corpora]
        heads[run] = [sum(h) / len(h) for h in zip(*per)]  # mean over the corpora, as the report
    assert round(heads["aha-w16"][0], 3) == 0.685 and round(heads["aha-w64"][0], 3) == 0.064
    rest = {run: sum(h[1:]) / 15 for run, h in heads.items()}
    assert (round(rest["aha-w16"], 3), round(rest["aha-w64"], 3)) == (0.248, 0.246)
    logged = {run: {r["step"]: r["mu_f"] for r in map(json.loads, (runs / run / "metrics.jsonl").open()) if "mu_f" in r}
              for run in ("aha-w16", "aha-w64")}
    higher = [s for s in sorted(logged["aha-w16"]) if logged["aha-w64"][s] > logged["aha-w16"][s]]
    assert len(logged["aha-w16"]) == 80 and len(higher) == 27
    assert set(range(50, 250, 10)) <= set(higher) and 40 not in higher and 250 not in higher


@pytest.mark.parametrize("folder", ROUND2, ids=[p.name for p in ROUND2])
def test_round2_provenance_names_torch_the_bytes_and_no_absolute_path(folder):
    """Issue 35: the torch version, the sha256 of the training and evaluation bytes, repository-relative paths."""
    data = json.loads((folder / "data.json").read_text())
    assert data["torch"] and len(data["sha256"]["runs/replicate-cpu/data/wiki_train.bin"]) == 64
    assert {"runs/replicate-cpu/data/wiki.test.tokens", "runs/replicate-cpu/data/wiki_heldout100.jsonl.gz"} <= set(
        data["sha256"])
    meta = json.loads((folder / PROVENANCE).read_text())
    for run, record in meta["runs"].items():
        assert "/work/" not in json.dumps(record), run
        config = (folder / "runs" / run / "config.yml").read_text()
        assert "save: runs/" in config, run
        for ev in (folder / "runs" / run / "eval").glob("*.json"):
            assert '"/' not in ev.read_text(), ev


# where a machine keeps its folders (the first path component), and a temporary folder made by Python's tempfile
MACHINE_PATH = re.compile(r"(?<![\w.$~])/(?:work|home|Users|root|scratch|mnt)/|/tmp/tmp[a-z0-9_]{6,10}/")


def test_committed_results_and_docs_name_no_folder_of_the_machine_they_ran_on():
    """Results, provenance and docs hold repository-relative paths (``../shared/data`` for the shared data)."""
    found = []
    for top in ("results", "bench/results", "docs", "README.md"):
        paths = [ROOT / top] if (ROOT / top).is_file() else (ROOT / top).rglob("*")
        for path in paths:
            if path.suffix in (".json", ".md", ".yml", ".txt", ".jsonl") and path.is_file():
                found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in MACHINE_PATH.finditer(path.read_text())]
    assert not found, found


def test_a_results_command_line_names_paths_under_the_current_folder_relatively(tmp_path, monkeypatch):
    from neox_dar.provenance import provenance

    monkeypatch.chdir(tmp_path)
    command = provenance(["bench/x.py", f"--out={tmp_path}/bench/results/x.json", str(tmp_path / "data")])["command"]
    assert command == "python bench/x.py --out=bench/results/x.json data"


def test_a_results_command_line_is_the_module_a_command_ran(tmp_path):
    """``python -m MODULE ...`` is recorded as typed (it was ``python MODULE/PATH.py ...``, another entry point);
    ``python FILE.py ...`` too."""
    import subprocess
    import sys

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "tool.py").write_text("from neox_dar.provenance import provenance\n"
                                              "print(provenance()['command'])\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv, typed in ((["-m", "pkg.tool", "--x", "1"], "python -m pkg.tool --x 1"),
                        (["pkg/tool.py", "--x", "1"], "python pkg/tool.py --x 1")):
        out = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert out.stdout.strip() == typed, out.stderr


def round2_rel() -> tuple[dict, dict, float]:
    """Rel. (%) and Rel. vs swa (%) per run of results/results-round2's first table, and the noise floor: the largest
    |Rel. - 100| of vanilla seeds 2 and 3 (docs/experiments.md's definition)."""
    runs, sweep, _ = collect(ROOT / "results" / "results-round2" / "runs")
    table = report_tables(runs, sweep.report)[0]
    rows = {r[0]: dict(zip(table.columns, r)) for r in table.rows}
    rel = {name: row["Rel. (%)"] for name, row in rows.items()}
    vs_swa = {name: row["Rel. vs swa (%)"] for name, row in rows.items()}
    seeds = [rel[n] for n in ("vanilla-seed2", "vanilla-seed3") if isinstance(rel.get(n), float)]
    return rel, vs_swa, max(abs(v - 100) for v in seeds)


@pytest.mark.skipif(not (ROOT / "results" / "results-round2").is_dir(), reason="round 2 not published")
def test_the_orderings_docs_state_for_round2_seeds_and_dar_threshold():
    """docs/experiments.md, "Results, second round", (a) and (b)."""
    rel, _, floor = round2_rel()
    assert round(floor, 2) == 1.00 and abs(rel["vanilla-seed3"] - 100) <= floor  # (a): seed 3 within seed 2's floor
    assert round(rel["vanilla-seed3"], 2) == 100.62
    dar = {"64": "dar-d64", "32": "dar", "16": "dar-d16"}
    uni = {"64": "uniform-d64", "32": "uniform", "16": "uniform-d16"}
    for d in dar:  # (b): uniform far above DAR at every d_down
        assert rel[uni[d]] > rel[dar[d]] + 10 * floor, d
    assert rel["uniform-d64"] > rel["uniform"] + floor and rel["dar-d64"] > rel["dar"] + floor  # 64 worse than 32
    assert rel["uniform-d16"] > rel["uniform-d64"]
    assert abs(rel["dar"] - rel["swa"]) <= floor and abs(rel["dar-d16"] - rel["swa"]) <= floor
    assert round(rel["dar-d64"] - rel["swa"], 2) == 2.77
    gaps = [rel[uni[d]] - rel[dar[d]] for d in dar]  # the claims table: "by 14 to 27 points", every DAR below vanilla
    assert 14 <= min(gaps) < 15 and 27 <= max(gaps) < 28
    assert all(rel[n] < 100 - floor for n in dar.values())
    if "dar-d64-seed2" in rel:  # the seed-2 repeats: DAR at d/2 and d/4 within the floor of each other and of SWA
        assert (round(rel["dar-d64-seed2"], 2), round(rel["dar-seed2"], 2)) == (94.19, 94.24)
        assert all(abs(rel[n] - rel["swa"]) <= floor for n in ("dar-d64-seed2", "dar-seed2"))
        assert round(rel["dar-d64"] - rel["dar-d64-seed2"], 2) == 2.73 and abs(rel["dar"] - rel["dar-seed2"]) < 0.2
    if "uniform-seed2" in rel:  # far above DAR again, but uniform's seeds spread more than its d_down steps
        assert round(rel["uniform-seed2"] - rel["dar-seed2"], 1) == 22.5
        assert round(rel["uniform-seed2"] - rel["uniform"], 2) == 8.23 > rel["uniform-d64"] - rel["uniform"]
    if "uniform-d64-seed2" in rel:  # seed 2 reverses seed 1's d/2-against-d/4 order; the means do not separate
        assert round(rel["uniform-d64-seed2"], 2) == 109.24 < rel["uniform-seed2"]
        means = [(rel[f"uniform{d}"] + rel[f"uniform{d}-seed2"]) / 2 for d in ("-d64", "")]
        assert [round(m, 2) for m in means] == [111.58, 112.64]


def round2_head_mu_f(run: str, folder: str = "results-round2") -> list[float]:
    """Per (layer, head) mu_f of a published round-2 run's final evaluation (in ``results/<folder>``), the mean over
    its corpora; layer-major."""
    corpora = json.loads((ROOT / "results" / folder / "runs" / run / "eval" / "perplexity.json")
                         .read_text())["corpora"].values()
    per_corpus = [[v for key, heads in sorted(c["attention_stats"].items()) if key.endswith("mu_f") for v in heads]
                  for c in corpora]
    return [sum(vals) / len(vals) for vals in zip(*per_corpus)]


@pytest.mark.skipif(not (ROOT / "results" / "results-round2" / "runs" / "aha-w128-seed2").is_dir(),
                    reason="round 2's AHA seed-2 runs not published")
def test_the_orderings_docs_state_for_round2_aha_windows():
    """docs/experiments.md, "Results, second round", (c): mu_f falls from w = 16 to 64 in both seeds, with and
    without each run's busiest head; at w = 128 the seeds disagree by more than any neighbouring windows differ."""
    mean = {run: 100 * statistics.fmean(round2_head_mu_f(run)) for w in (16, 32, 64, 128)
            for run in (f"aha-w{w}", f"aha-w{w}-seed2")}
    trimmed = {run: 100 * statistics.fmean(sorted(round2_head_mu_f(run))[:-1]) for run in mean}
    falls = [round(values[f"aha-w16{seed}"] - values[f"aha-w64{seed}"], 1) for values in (mean, trimmed)
             for seed in ("", "-seed2")]
    assert falls == [4.0, 3.6, 3.0, 4.7]
    spread = {w: abs(mean[f"aha-w{w}"] - mean[f"aha-w{w}-seed2"]) for w in (16, 32, 64, 128)}
    assert round(spread[128], 1) == 14.1 and max(spread[w] for w in (16, 32, 64)) < 2
    steps = [abs(mean[f"aha-w{a}{s}"] - mean[f"aha-w{b}{s}"]) for s in ("", "-seed2") for a, b in ((16, 32), (32, 64))]
    assert max(steps) < 4 < spread[128] / 3
    assert max(round2_head_mu_f("aha-w128")) > 0.9  # one head of seed 1 at w = 128 routes nearly every token


@pytest.mark.skipif(not (ROOT / "results" / "results-round2-finetune" / "runs" / "aha-ft-w128").is_dir(),
                    reason="round 2's fine-tuning runs not published")
def test_the_orderings_docs_state_for_round2_fine_tuning():
    """docs/experiments.md, "Results, second round", (e): mu_f per window (falls from 16 to 64, rises at 128), one
    head always open and one never at w = 64 and 128, no head below 26% at w = 16, quality within 0.1 point."""
    runs, sweep, _ = collect(ROOT / "results" / "results-round2-finetune" / "runs")
    table = report_tables(runs, sweep.report)[0]
    row = {r[0]: dict(zip(table.columns, r)) for r in table.rows}
    windows = (16, 32, 64, 128)
    assert [round(row[f"aha-ft-w{w}"]["mu_f (%)"], 1) for w in windows] == [76.7, 74.7, 51.6, 58.0]
    rel = [row[f"aha-ft-w{w}"]["Rel. (%)"] for w in windows]
    assert (round(min(rel), 2), round(max(rel), 2)) == (99.96, 100.05)
    heads = {w: round2_head_mu_f(f"aha-ft-w{w}", "results-round2-finetune") for w in windows}
    layer1 = lambda w, h: heads[w][4 + h]  # noqa: E731  (4 heads per layer)
    assert all(layer1(w, 1) > 0.995 for w in windows)
    assert layer1(64, 3) < 0.005 and layer1(128, 3) < 0.005
    assert round(min(heads[16]), 2) == 0.26


@pytest.mark.skipif(not (ROOT / "results" / "results-round2-dimpo" / "results.json").is_file(),
                    reason="round 2's DimPO study not published")
def test_the_round2_dimpo_table_is_rebuilt_and_its_orderings_are_the_docs():
    """results/results-round2-dimpo: table.md and docs/experiments.md's table are what ``dimpo table`` makes from
    the committed results.json; (f)'s statements: DimPO lowest KL of the trained methods at every d' (CPO next),
    falling with d'; random far behind; PCA below DimPO at d' = 16 only; ORPO's KL not monotonic in d'."""
    from neox_dar.dimpo.tables import table1

    folder = ROOT / "results" / "results-round2-dimpo"
    table = table1(str(folder))
    md = to_markdown(table)
    assert (folder / "table.md").read_text().startswith(md)
    assert block(ROOT / "docs" / "experiments.md", "results-round2-dimpo") == md.rstrip()
    assert not re.search(r"/(work|home|tmp|root)/", (folder / "results.json").read_text() + md)
    kl = {r[0]: {d: float(r[table.columns.index(f"{d} KL")]) for d in (16, 8, 4)} for r in table.rows}
    mse = {r[0]: {d: float(r[table.columns.index(f"{d} MSE")]) for d in (16, 8, 4)} for r in table.rows}
    trained = ("Triplet", "CPO", "SimPO", "ORPO", "DimPO")
    for d in (16, 8, 4):
        order = sorted(trained, key=lambda m: kl[m][d])
        assert order[:2] == ["DimPO", "CPO"], d
        assert min(kl["Rand"].values()) > max(kl[m][d] for m in trained)
    assert kl["DimPO"][16] < kl["DimPO"][8] < kl["DimPO"][4] and mse["DimPO"][16] < mse["DimPO"][8] < mse["DimPO"][4]
    assert kl["PCA"][16] < kl["DimPO"][16] and kl["PCA"][8] > kl["DimPO"][8] and kl["PCA"][4] > kl["DimPO"][4]
    assert kl["ORPO"][8] < kl["ORPO"][16]


@pytest.mark.skipif(not (ROOT / "results" / "results-round2" / "runs" / "dar-2x").is_dir(),
                    reason="round 2's 2x runs not published")
def test_the_orderings_docs_state_for_round2_scaling():
    """docs/experiments.md, "Results, second round", (d): SWA's lead over vanilla shrinks from 1x to 2x (each
    against vanilla of its budget) and stays beyond the noise floor; DAR closes on vanilla with it; MSWA's lead
    shrinks less and it stays below SWA beyond the floor; at 4x SWA, DAR and MSWA stay ahead of vanilla beyond the
    floor, MSWA ahead of SWA, DAR within the floor of SWA."""
    rel, vs_swa, floor = round2_rel()
    assert (round(100 - rel["swa"], 2), round(100 - rel["swa-2x"], 2)) == (5.85, 1.8)
    assert 100 - rel["swa-2x"] > floor
    # DAR closes on vanilla with SWA, within the floor of SWA at both budgets
    assert (round(100 - rel["dar"], 2), round(100 - rel["dar-2x"], 2)) == (5.6, 1.58)
    assert (round(vs_swa["dar"], 2), round(vs_swa["dar-2x"], 2)) == (100.26, 100.22)
    assert abs(vs_swa["dar-2x"] - 100) < floor
    # MSWA's lead over vanilla shrinks less, and its lead over SWA holds beyond the floor; vanilla the worst at 2x
    assert (round(100 - rel["mswa"], 2), round(100 - rel["mswa-2x"], 2)) == (11.62, 7.39)
    assert (round(vs_swa["mswa"], 2), round(vs_swa["mswa-2x"], 2)) == (93.87, 94.3)
    assert 100 - vs_swa["mswa-2x"] > floor
    assert max(rel[r] for r in ("swa-2x", "dar-2x", "mswa-2x")) < rel["vanilla-2x"]
    # 4x: SWA's lead does not keep shrinking, and vanilla has not overtaken it; MSWA's leads narrow slowly, beyond
    # the floor, and vanilla is the worst of the three
    assert round(100 - rel["swa-4x"], 2) == 2.56 and 100 - rel["swa-4x"] > floor
    assert round(100 - rel["mswa-4x"], 2) == 7.71 and round(vs_swa["mswa-4x"], 2) == 94.73
    assert 100 - vs_swa["mswa-4x"] > floor and min(rel["swa-4x"], rel["mswa-4x"]) < rel["vanilla-4x"]
    # DAR at 4x: its lead over vanilla stops shrinking after 2x (beyond the floor), it stays within the floor of SWA,
    # and the order is MSWA, SWA, DAR, vanilla
    assert round(100 - rel["dar-4x"], 2) == 1.65 and 100 - rel["dar-4x"] > floor
    assert round(vs_swa["dar-4x"], 2) == 100.95 and abs(vs_swa["dar-4x"] - 100) < floor
    assert sorted(("vanilla-4x", "swa-4x", "dar-4x", "mswa-4x"), key=rel.get) == ["mswa-4x", "swa-4x", "dar-4x",
                                                                                 "vanilla-4x"]


def test_the_studies_start_checkpoint_is_committed_and_is_vanilla_seed3():
    """(e) and (f) start from vanilla-seed3's step-800 weights, committed: the folder loads as a checkpoint (its
    manifest verified), holds the published run's model config, and its weights are the bytes docs/experiments.md
    names by sha256."""
    import hashlib

    from neox_dar.config import load_config
    from neox_dar.saved_model import load_model

    folder = ROOT / "results" / "results-round2" / "checkpoints" / "vanilla-seed3"
    _, cfg = load_model(folder)
    assert cfg == load_config(ROOT / "results" / "results-round2" / "runs" / "vanilla-seed3" / "config.yml").model
    sha = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    assert f"model.safetensors with sha256 `{sha}`" in " ".join((ROOT / "docs" / "experiments.md").read_text().split())
