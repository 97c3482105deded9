"""The report recomputes its tables from run files, shows missing evaluations as missing, draws the figures."""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
from pathlib import Path

import pytest

from neox_dar.evaluation.corpora import CORPORA
from neox_dar.report.__main__ import main as report_main
from neox_dar.report.collect import collect
from neox_dar.report.tables import average_table, build_table, to_latex, to_markdown
from neox_dar.sweep.errors import SweepError
from neox_dar.sweep.planning import plan, write_plan
from neox_dar.sweep.spec import parse_sweep

SWEEP = {
    "name": "synthetic",
    "configs": ["configs/tiny.yml"],
    "set": {"train_iters": 40},
    "grid": {"attention": {"dar": {"configs": ["configs/attention/dar.yml"]},
                           "uniform": {"configs": ["configs/attention/uniform.yml"]}},
             "dar_d_down": [32, 16]},
    "runs": [{"name": "vanilla", "configs": ["configs/attention/vanilla.yml"]},
             {"name": "aha-w16", "configs": ["configs/attention/aha.yml"], "set": {"window_size": 16}},
             {"name": "mswa-w16", "configs": ["configs/attention/mswa.yml"], "set": {"window_size": 16}}],
    "report": {"title": "synthetic table", "baseline": {"attention_type": "vanilla"}, "cost": True},
}


def _write_run_files(run_dir: Path, rng: random.Random, cfg_layers: int = 2, heads: int = 4,
                     aha: bool = False) -> dict:
    """Contract-shaped metrics.jsonl, status.json and eval/perplexity.json with random values (an AHA run's
    evaluation also holds mu_f per corpus, layer and head)."""
    rows = []
    for step in range(10, 41, 10):
        rows.append({"step": step, "loss": 10 - step / 10 + rng.random(), "lm_loss": 9.0, "aux_loss": 0.0,
                     "lr": 1e-3, "grad_norm": 1.0, "tokens_per_sec": 1e4, "samples_per_sec": 80.0,
                     "consumed_samples": step * 16,
                     "mu_f": rng.random(),
                     **{f"mu_f/layer{l}": [rng.random() for _ in range(heads)] for l in range(cfg_layers)}})
        if step % 20 == 0:
            rows.append({"step": step, "valid_loss": 8 - step / 20 + rng.random()})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "status.json").write_text(json.dumps({"state": "done", "step": 40, "train_iters": 40}))
    corpora = {c: {"nll": 1.0, "tokens": 100, "words": 80, "bytes": 400,
                   "token_perplexity": rng.uniform(20, 60), "word_perplexity": rng.uniform(40, 90),
                   "byte_perplexity": rng.uniform(1.5, 3), "bits_per_byte": rng.uniform(0.8, 1.5), "documents": 3}
               for c in CORPORA}
    if aha:
        for entry in corpora.values():
            entry["attention_stats"] = {f"layer{l}/mu_f": [rng.random() for _ in range(heads)]
                                        for l in range(cfg_layers)}
            entry["mu_f"] = sum(map(sum, entry["attention_stats"].values())) / (cfg_layers * heads)
    (run_dir / "eval").mkdir(exist_ok=True)
    result = {"checkpoint": str(run_dir), "step": 40, "config_hash": "x", "manifest_hash": "y",
              "attention_type": "vanilla", "corpora": corpora}
    (run_dir / "eval" / "perplexity.json").write_text(json.dumps(result))
    return result


@pytest.fixture()
def sweep_dir(tmp_path):
    sweep = parse_sweep(SWEEP, tmp_path / "synthetic.yml")
    root = write_plan(sweep, plan(sweep, tmp_path / "runs"))
    rng = random.Random(7)
    results = {r.name: _write_run_files(root / r.name, rng, aha=r.name.startswith("aha")) for r in sweep.runs}
    return root, results


def _row(table, name):
    return next(r for r in table.rows if r[0] == name)


def _rel(a: dict, b: dict) -> float:
    """SPEC's Rel. (%) from per-corpus perplexities, computed here independently of the report."""
    return sum(a[c] / b[c] for c in CORPORA) / len(CORPORA) * 100


def test_table_recomputed_from_run_files(sweep_dir):
    root, results = sweep_dir
    runs, sweep, _ = collect(root)
    table = build_table(runs, sweep.report)
    ppl = {n: {c: r["corpora"][c]["token_perplexity"] for c in CORPORA} for n, r in results.items()}
    row = _row(table, "dar-d32")
    ci = table.columns.index("FineWeb-Edu")
    assert row[ci] == ppl["dar-d32"]["fineweb_edu"]
    assert row[table.columns.index("Rel. (%)")] == pytest.approx(_rel(ppl["dar-d32"], ppl["vanilla"]))
    assert _row(table, "vanilla")[table.columns.index("Rel. (%)")] == pytest.approx(100.0)
    before = to_markdown(table)

    # corrupt one number in one run file: the table must follow
    path = root / "dar-d32" / "eval" / "perplexity.json"
    data = json.loads(path.read_text())
    data["corpora"]["c4"]["token_perplexity"] *= 1.37
    path.write_text(json.dumps(data))
    runs, sweep, _ = collect(root)
    after_table = build_table(runs, sweep.report)
    after = to_markdown(after_table)
    assert after != before
    new_rel = _row(after_table, "dar-d32")[table.columns.index("Rel. (%)")]
    ppl["dar-d32"]["c4"] *= 1.37
    assert new_rel == pytest.approx(_rel(ppl["dar-d32"], ppl["vanilla"]))
    assert f"{new_rel:.2f}" in after


def test_missing_evaluation_is_shown_missing(sweep_dir):
    root, _ = sweep_dir
    (root / "uniform-d16" / "eval" / "perplexity.json").unlink()
    data = json.loads((root / "dar-d16" / "eval" / "perplexity.json").read_text())
    del data["corpora"]["wikitext103"]
    (root / "dar-d16" / "eval" / "perplexity.json").write_text(json.dumps(data))
    runs, sweep, _ = collect(root)
    table = build_table(runs, sweep.report)
    rel = table.columns.index("Rel. (%)")
    missing = _row(table, "uniform-d16")
    assert all(missing[table.columns.index(c)] is None for c in ("FineWeb-Edu", "C4", "WikiText-103"))
    assert missing[rel] is None
    partial = _row(table, "dar-d16")
    assert partial[table.columns.index("WikiText-103")] is None and partial[rel] is None
    assert partial[table.columns.index("C4")] is not None
    md_line = next(line for line in to_markdown(table).splitlines() if line.startswith("| uniform-d16 "))
    assert md_line.count("--") >= 4 and " 0.00 " not in md_line
    tex_line = next(line for line in to_latex(table).splitlines() if line.startswith("uniform-d16 "))
    assert tex_line.count("--") >= 4


def test_a_run_of_another_budget_or_a_nan_is_flagged_not_compared(sweep_dir):
    """A run evaluated after another training budget than its baseline (here extended: step 50, 800 samples of 128
    tokens) gets a warning under the table; a NaN perplexity (a diverged run) is missing, in its cell and in Rel.
    (Before: Rel. compared step 50 with step 40 without a word, and printed nan.)"""
    root, _ = sweep_dir
    path = root / "dar-d32" / "eval" / "perplexity.json"
    data = json.loads(path.read_text())
    data["step"] = 50
    path.write_text(json.dumps(data))
    with (root / "dar-d32" / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 50, "loss": 5.0, "consumed_samples": 800}) + "\n")
    nan = json.loads((root / "dar-d16" / "eval" / "perplexity.json").read_text())
    nan["corpora"]["c4"]["token_perplexity"] = float("nan")
    (root / "dar-d16" / "eval" / "perplexity.json").write_text(json.dumps(nan))
    runs, sweep, _ = collect(root)
    table = build_table(runs, sweep.report)
    seq = next(r for r in runs if r.name == "vanilla").cfg.model.seq_length
    assert (f"warning: dar-d32: evaluated at step 50 ({800 * seq:,} tokens), its baseline vanilla at step 40 "
            f"({640 * seq:,} tokens): its Rel. compares models trained for different budgets") in table.notes
    assert not any(n.startswith("warning: dar-d16") for n in table.notes)
    row = _row(table, "dar-d16")
    assert row[table.columns.index("C4")] is None and row[table.columns.index("Rel. (%)")] is None


def test_missing_baseline_makes_rel_missing(sweep_dir):
    root, _ = sweep_dir
    (root / "vanilla" / "eval" / "perplexity.json").unlink()
    runs, sweep, _ = collect(root)
    table = build_table(runs, sweep.report)
    assert all(row[table.columns.index("Rel. (%)")] is None for row in table.rows)


def _planned_with_results(tmp_path: Path, spec: dict, seed: int):
    """A sweep planned under ``tmp_path`` with random result files in every run: (runs, sweep, results by run)."""
    sweep = parse_sweep(spec, tmp_path / f"{spec['name']}.yml")
    root = write_plan(sweep, plan(sweep, tmp_path / "runs"))
    rng = random.Random(seed)
    res = {r.name: _write_run_files(root / r.name, rng) for r in sweep.runs}
    runs, sweep, _ = collect(root)
    return runs, sweep, res


def _scales(report: dict, attention: tuple[str, ...] = ("vanilla", "dar")) -> dict:
    """A sweep of tiny.yml at two widths (``small``: 64, ``big``: 128) by the attention variants ``attention`` (in
    that order), with ``report``."""
    return {"name": "scales", "configs": ["configs/tiny.yml"],
            "grid": {"scale": {"small": {"set": {"hidden_size": 64}}, "big": {"set": {"hidden_size": 128}}},
                     "attention": {a: {"configs": [f"configs/attention/{a}.yml"]} for a in attention}},
            "report": report}


def test_group_by_uses_baseline_of_the_same_group(tmp_path):
    spec = _scales({"baseline": {"attention_type": "vanilla"}, "group_by": ["scale"]})
    runs, sweep, res = _planned_with_results(tmp_path, spec, seed=11)
    table = build_table(runs, sweep.report)
    ppl = {n: {c: r["corpora"][c]["token_perplexity"] for c in CORPORA} for n, r in res.items()}
    rel = table.columns.index("Rel. (%)")
    assert _row(table, "big-dar")[rel] == pytest.approx(_rel(ppl["big-dar"], ppl["big-vanilla"]))
    assert _row(table, "small-dar")[rel] == pytest.approx(_rel(ppl["small-dar"], ppl["small-vanilla"]))


def test_group_by_puts_each_baseline_before_its_group(tmp_path):
    """With ``group_by`` each group's baseline comes before the first run of its group, the rest in the sweep's
    order (before: the sweep's order alone, a run above the baseline it is measured against)."""
    spec = _scales({"baseline": {"attention_type": "vanilla"}, "group_by": ["scale"]}, ("dar", "vanilla"))
    runs, sweep, _ = _planned_with_results(tmp_path, spec, seed=5)
    assert [r.name for r in runs] == ["small-dar", "small-vanilla", "big-dar", "big-vanilla"]
    table = build_table(runs, sweep.report)
    assert [row[0] for row in table.rows] == ["small-vanilla", "small-dar", "big-vanilla", "big-dar"]


def test_a_baseline_of_another_scale_is_flagged(tmp_path):
    """SPEC compares a run with vanilla at the same scale: without group_by, the big DAR's Rel. against the small
    vanilla gets a warning naming the keys (before: Rel. 94 against a model half its width, without a word); with
    group_by each scale has its own baseline and no warning."""
    spec = _scales({"baseline": {"attention_type": "vanilla", "scale": "small"}})
    runs, sweep, _ = _planned_with_results(tmp_path, spec, seed=11)
    notes = [n for n in build_table(runs, sweep.report).notes if "differs from its baseline" in n]
    said = "(hidden_size 128 against 64; head_dim 32 against 16; intermediate_size 512 against 256)"
    assert len(notes) == 2 and all(said in n for n in notes), notes
    assert {n.split(":")[1].strip() for n in notes} == {"big-vanilla", "big-dar"}
    grouped = {**sweep.report, "baseline": {"attention_type": "vanilla"}, "group_by": ["scale"]}
    assert not [n for n in build_table(runs, grouped).notes if "differs from its baseline" in n]


def test_a_run_scored_with_another_window_or_stride_is_flagged(sweep_dir):
    """The report warns when a run's evaluation used another window or stride than its baseline's (both change
    perplexity besides the model; they were compared without a word)."""
    root, _ = sweep_dir
    for name, stride in (("vanilla", 2048), ("dar-d32", 256)):
        path = root / name / "eval" / "perplexity.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "max_length": 2048, "stride": stride}))
    runs, sweep, _ = collect(root)
    notes = [n for n in build_table(runs, sweep.report).notes if "scored with" in n]
    assert notes == ["warning: dar-d32: scored with stride 256, the baseline with 2048: its Rel. compares more than "
                     "the models"]


def test_run_files_this_version_cannot_read_are_one_line_errors(sweep_dir, capsys):
    """A config.yml with a key this version does not know, a metrics.jsonl row that is not an object or bytes that
    are not UTF-8, and an evaluation whose corpus is not an object of metrics: one line naming the run or file, exit 2
    (tracebacks before: ConfigError, AttributeError, UnicodeDecodeError, TypeError)."""
    root, _ = sweep_dir
    cases = []
    cfg = root / "dar-d32" / "config.yml"
    cases.append((cfg, cfg.read_text() + "bogus_key: 3\n", "run dar-d32: its config.yml cannot be read"))
    metrics = root / "uniform-d16" / "metrics.jsonl"
    cases.append((metrics, "null\n" + metrics.read_text(), "metrics.jsonl:1: a row must be a JSON object"))
    cases.append((metrics, b"\xff\xfe" + metrics.read_bytes(), "metrics.jsonl: not UTF-8 text"))
    ev = root / "dar-d16" / "eval" / "perplexity.json"
    data = json.loads(ev.read_text())
    cases.append((ev, json.dumps({**data, "corpora": {**data["corpora"], "c4": "12.5"}}),
                  "corpus 'c4' is '12.5', not an object of metrics"))
    for path, broken, said in cases:
        good = path.read_bytes()
        path.write_bytes(broken if isinstance(broken, bytes) else broken.encode())
        assert report_main([str(root), "--no-figures"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("report error: ") and err.count("\n") == 1 and said in err, err
        path.write_bytes(good)
    assert report_main([str(root), "--no-figures"]) == 0


def test_cli_writes_tables_and_figures(sweep_dir, capsys):
    root, _ = sweep_dir
    assert report_main([str(root), "--out", str(root / "rep")]) == 0
    out = capsys.readouterr().out
    assert "| dar-d32 |" in out
    for name in ("table.md", "table.tex", "table.json", "relative_ppl_vs_step.png", "loss_curves.png",
                 "cost_vs_perplexity.png", "aha_mu_f_heatmap.png", "aha_mu_f_heads.png"):
        f = root / "rep" / name
        assert f.is_file() and f.stat().st_size > 100, name
    assert (root / "rep" / "relative_ppl_vs_step.png").read_bytes()[:4] == b"\x89PNG"
    # a later report whose runs draw no figure (--no-figures here) leaves none of the earlier ones beside its
    # tables (they stayed, as if drawn from these runs), and no other file of the folder is touched
    (root / "rep" / "notes.png").write_bytes(b"mine")
    assert report_main([str(root), "--out", str(root / "rep"), "--no-figures"]) == 0
    assert (f"removed {root / 'rep' / 'loss_curves.png'}: --no-figures draws none, and an earlier report's would "
            "not match these tables") in capsys.readouterr().out  # it said "these runs do not draw", which they do
    assert sorted(p.name for p in (root / "rep").iterdir()) == ["notes.png", "table.json", "table.md", "table.tex"]


def test_a_planned_run_without_its_directory_is_named_under_the_table(sweep_dir, capsys):
    """A run of the sweep whose directory was deleted is left out of the table and named in a warning under it
    (before: left out without a word)."""
    import shutil

    root, _ = sweep_dir
    assert report_main([str(root), "--out", str(root / "rep"), "--no-figures"]) == 0
    assert "have no directory" not in capsys.readouterr().out
    shutil.rmtree(root / "dar-d32")
    assert report_main([str(root), "--out", str(root / "rep"), "--no-figures"]) == 0
    assert "| dar-d32 |" not in capsys.readouterr().out
    md = (root / "rep" / "table.md").read_text()
    assert "warning: 1 run(s) of the sweep have no directory in its output" in md and md.rstrip().endswith("dar-d32")
    assert str(root) not in md


def test_cost_column_orders_swa_family(sweep_dir):
    root, _ = sweep_dir
    runs, sweep, _ = collect(root)
    table = build_table(runs, sweep.report)
    cost = table.columns.index("Cost")
    assert _row(table, "vanilla")[cost] == pytest.approx(1.0)
    assert 0 < _row(table, "mswa-w16")[cost] < 0.5


def test_fig3_uses_evaluations_at_several_steps(sweep_dir):
    from neox_dar.report.figures import _eval_points, _valid_points

    root, results = sweep_dir
    rng = random.Random(5)
    for name in ("vanilla", "dar-d32"):
        for step in (10, 20):
            r = json.loads(json.dumps(results[name]))
            r["step"] = step
            for c in CORPORA:
                r["corpora"][c]["token_perplexity"] = rng.uniform(30, 90)
            (root / name / "eval" / f"step_{step:08d}.json").write_text(json.dumps(r))
    runs, sweep, _ = collect(root)
    by = {r.name: r for r in runs}
    pts = _eval_points(by["dar-d32"], by["vanilla"], {"metric": "token_perplexity"})
    assert [s for s, _ in pts] == [10, 20, 40]
    ppl = {n: {s: {c: e["corpora"][c]["token_perplexity"] for c in CORPORA} for e in by[n].evals
               for s in [e["step"]]} for n in ("vanilla", "dar-d32")}
    assert pts[0][1] == pytest.approx(_rel(ppl["dar-d32"][10], ppl["vanilla"][10]))
    assert by["dar-d32"].eval["step"] == 40  # the table keeps the final evaluation
    valid = _valid_points(by["dar-d32"], by["vanilla"])
    assert [s for s, _ in valid] == [20, 40]


def test_mu_f_comes_from_the_evaluation(sweep_dir):
    """mu_f (table and figures) is the final evaluation's, per layer and head averaged over the corpora, never the
    trainer's last micro-batch; an AHA run without such an evaluation shows it missing."""
    from neox_dar.report.figures import draw_all

    root, results = sweep_dir
    runs, sweep, _ = collect(root)
    aha = next(r for r in runs if r.name == "aha-w16")
    stats = [results["aha-w16"]["corpora"][c]["attention_stats"] for c in CORPORA]
    expect = [[sum(s[f"layer{l}/mu_f"][h] for s in stats) / len(stats) for h in range(4)] for l in range(2)]
    heat = aha.stat_table("mu_f")
    assert len(heat) == 2 and all(row == pytest.approx(e) for row, e in zip(heat, expect))
    overall = sum(map(sum, expect)) / 8
    assert overall == pytest.approx(sum(results["aha-w16"]["corpora"][c]["mu_f"] for c in CORPORA) / 3)
    assert aha.stat_mean("mu_f") == pytest.approx(overall) and aha.stat_mean("mu_f") != pytest.approx(aha.train_rows()[-1]["mu_f"])
    table = build_table(runs, sweep.report)
    assert _row(table, "aha-w16")[table.columns.index("mu_f (%)")] == pytest.approx(overall * 100)
    assert any("final evaluation" in n for n in table.notes)

    (root / "aha-w16" / "eval" / "perplexity.json").unlink()
    runs, sweep, _ = collect(root)
    table = build_table(runs, sweep.report)
    assert _row(table, "aha-w16")[table.columns.index("mu_f (%)")] is None  # missing, not the training value
    files, skipped = draw_all(runs, table, sweep.report, root / "rep")
    assert not any("aha" in f.name for f in files) and any("AHA mu_f" in s for s in skipped)


# ---------------------------------------------------------------------------------------------------------------
# issue 21: wrong settings are errors; the figures say what they plot; the tables say what was scored


def test_a_wrong_baseline_or_report_key_is_a_one_line_error(sweep_dir, capsys):
    root, _ = sweep_dir
    assert report_main([str(root), "--baseline", "vanila", "--no-figures"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("report error: the baseline {'run': 'vanila'} matches no run (runs: ")
    assert len(err.strip().splitlines()) == 1
    runs, sweep, _ = collect(root)
    for report, message in (({"basline": {"attention_type": "vanilla"}}, "did you mean 'baseline'"),
                            ({"baseline": {"attention_typ": "vanilla"}}, "neither an axis of the runs nor a config"),
                            ({"baseline": {"attention_type": "vanila"}}, "matches no run"),
                            ({"baseline": {"run": "vanilla"}, "group_by": ["scal"]}, "group_by names 'scal'")):
        with pytest.raises(SweepError, match=message):
            build_table(runs, report)


def _captured_figures(monkeypatch) -> dict:
    """Figures by file name, kept open (figures.save_figure closes them after saving)."""
    from neox_dar.report import figures

    kept = {}

    def save(fig, path, rect=None):
        kept[path.name] = fig
        fig.tight_layout(rect=rect)
        fig.savefig(path, dpi=60)
        return path

    monkeypatch.setattr(figures, "save_figure", save)
    return kept


def test_relative_perplexity_figure_names_what_it_plots(sweep_dir, monkeypatch):
    """The title names the sweep, the baseline and the quantity; evaluations at several steps give the paper's Rel.
    with its last point equal to the table's; runs without them fall back to the validation proxy, drawn dashed and
    labelled with the tokens it rests on; steps are integers."""
    from matplotlib.ticker import MaxNLocator

    from neox_dar.report.figures import draw_all

    root, results = sweep_dir
    rng = random.Random(3)
    for name in ("vanilla", "dar-d32"):
        r = json.loads(json.dumps(results[name]))
        r["step"], r["in_training"] = 20, True
        for c in CORPORA:
            r["corpora"][c]["token_perplexity"] = rng.uniform(30, 90)
        (root / name / "eval" / "step_00000020.json").write_text(json.dumps(r))
        r["step"] = 40  # an in-training evaluation at the final step: the table (and the curve) keep the final one
        (root / name / "eval" / "step_00000040.json").write_text(json.dumps(r))
    figs = _captured_figures(monkeypatch)
    runs, sweep, _ = collect(root)
    table = build_table(runs, sweep.report)
    draw_all(runs, table, sweep.report, root / "rep", sweep.name)
    fig = figs["relative_ppl_vs_step.png"]
    title = fig._suptitle.get_text()
    caption = " ".join(t.get_text() for t in fig.texts).replace("\n", " ")
    assert "synthetic" in title and "baseline (vanilla)" in title and "Rel. (%) = mean over" in caption
    assert "dashed: proxy" in caption and "8,192 tokens per validation" in caption  # eval_iters 4 x batch 16 x 128
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    dar = lines["dar-d32"]
    assert dar.get_linestyle() == "-" and list(dar.get_xdata()) == [20, 40]
    assert dar.get_ydata()[-1] == pytest.approx(_row(table, "dar-d32")[table.columns.index("Rel. (%)")])
    proxy = lines["uniform-d16 (valid-loss proxy)"]
    assert proxy.get_linestyle() == "--"
    assert isinstance(ax.xaxis.get_major_locator(), MaxNLocator) and ax.xaxis.get_major_locator()._integer


def test_loss_curves_show_the_difference_to_the_baseline(sweep_dir, monkeypatch):
    from neox_dar.report.figures import loss_curves

    root, _ = sweep_dir
    figs = _captured_figures(monkeypatch)
    runs, sweep, _ = collect(root)
    loss_curves(runs, sweep.report, root, sweep.name)
    fig = figs["loss_curves.png"]
    top, bottom = fig.axes[0], fig.axes[1]
    assert "synthetic" in fig._suptitle.get_text() and "vanilla" in bottom.get_title()
    by = {r.name: {x["step"]: x["loss"] for x in r.train_rows()} for r in runs}
    diff = next(ln for ln in bottom.get_lines() if ln.get_label() == "dar-d32")
    assert list(diff.get_ydata()) == pytest.approx([by["dar-d32"][s] - by["vanilla"][s] for s in diff.get_xdata()])
    assert len([ln for ln in top.get_lines() if not ln.get_label().startswith("_")]) == len(runs)


def test_cost_figure_keeps_runs_at_equal_cost_apart_and_explains_the_cost(sweep_dir, monkeypatch):
    from neox_dar.report.figures import cost_vs_perplexity

    root, _ = sweep_dir
    figs = _captured_figures(monkeypatch)
    runs, sweep, _ = collect(root)
    table = build_table(runs, sweep.report)
    by_name = {r.name: r for r in runs}
    cost_vs_perplexity(table, [by_name[row[0]] for row in table.rows], root, sweep.name)
    fig = figs["cost_vs_perplexity.png"]
    ax = fig.axes[0]
    for line in ax.get_lines():  # no line runs vertically through runs of one cost
        xs = list(line.get_xdata())
        assert line.get_linestyle() == "None" or len(set(xs)) == len(xs)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels and all("10^" not in t and "times" not in t and "\\\\" not in t for t in labels), labels
    assert any("DAR's second key/value projection" in t.get_text().replace("\n", " ") for t in fig.texts)
    assert "relative to vanilla" in ax.get_xlabel()


def test_table_says_what_each_corpus_was_scored_on(sweep_dir):
    root, results = sweep_dir
    runs, sweep, _ = collect(root)
    table = build_table(runs, sweep.report)
    line = next(n for n in table.notes if n.startswith("Scored on:"))
    assert line == "Scored on: FineWeb-Edu 3 documents / 100 tokens; C4 3 documents / 100 tokens; WikiText-103 " \
                   "3 documents / 100 tokens."


def test_seed_spread_table(tmp_path):
    """average_over: [seed] merges the runs that differ only in their seed: mean of every number, Rel. (%)'s sample
    standard deviation and range beside it."""
    spec = {"name": "seeds", "configs": ["configs/tiny.yml"],
            "grid": {"attention": {"vanilla": {"configs": ["configs/attention/vanilla.yml"]},
                                   "dar": {"configs": ["configs/attention/dar.yml"], "set": {"window_size": 16}}},
                     "seed": [1, 2, 3]},
            "report": {"baseline": {"attention_type": "vanilla"}, "group_by": ["seed"], "average_over": ["seed"]}}
    runs, sweep, res = _planned_with_results(tmp_path, spec, seed=2)
    table = build_table(runs, sweep.report)
    avg = average_table(table, runs, ["seed"])
    rel = [_rel({c: res[f"dar-seed{s}"]["corpora"][c]["token_perplexity"] for c in CORPORA},
                {c: res[f"vanilla-seed{s}"]["corpora"][c]["token_perplexity"] for c in CORPORA}) for s in (1, 2, 3)]
    row = next(r for r in avg.rows if r[0] == "dar")
    assert row[avg.columns.index("n")] == 3
    assert row[avg.columns.index("Rel. (%)")] == pytest.approx(sum(rel) / 3)
    assert row[avg.columns.index("Rel. sd")] == pytest.approx(statistics.stdev(rel))
    assert row[avg.columns.index("Rel. range")] == f"{min(rel):.2f}..{max(rel):.2f}"
    c4 = avg.columns.index("C4")
    assert row[c4] == pytest.approx(sum(res[f"dar-seed{s}"]["corpora"]["c4"]["token_perplexity"] for s in (1, 2, 3)) / 3)
    assert "seed" not in avg.columns
    assert row[avg.columns.index("Step")] == 40 and not [n for n in avg.notes if n.startswith("warning")]

    # one seed evaluated at another step: the row's Step is missing and a note names the runs (it showed the largest)
    late = next(r for r in runs if r.name == "dar-seed2")
    late.evals[-1]["step"] = 30
    avg = average_table(build_table(runs, sweep.report), runs, ["seed"])
    assert next(r for r in avg.rows if r[0] == "dar")[avg.columns.index("Step")] is None
    assert "warning: dar-seed1 dar-seed2 dar-seed3 were evaluated at steps 40, 30, 40: their row's means mix " \
           "training budgets" in avg.notes


def test_average_over_must_name_a_grid_axis(tmp_path, capsys):
    """average_over merges runs whose other axes agree: a config key that is not an axis merged nothing (every run
    its own row, n = 1, said as a mean); now a one-line error naming the axes."""
    spec = {"name": "seeds", "configs": ["configs/tiny.yml"],
            "grid": {"attention": {"vanilla": {"configs": ["configs/attention/vanilla.yml"]},
                                   "dar": {"configs": ["configs/attention/dar.yml"]}}},
            "report": {"baseline": {"attention_type": "vanilla"}}}
    runs, sweep, _ = _planned_with_results(tmp_path, spec, seed=3)
    with pytest.raises(SweepError, match="report average_over names 'seed', which is not a grid axis of the runs "
                                         r"\(axes: attention\)"):
        average_table(build_table(runs, sweep.report), runs, ["seed"])
    assert report_main([str(tmp_path / "runs"), "--no-figures", "--average-over", "seed"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


NOISE_SWEEP = {
    "name": "noisy",
    "configs": ["configs/tiny.yml"],
    "set": {"train_iters": 40},
    "runs": [{"name": "vanilla-seed1", "configs": ["configs/attention/vanilla.yml"],
              "axes": {"variant": "vanilla", "seed": "seed1"}},
             {"name": "vanilla-seed2", "configs": ["configs/attention/vanilla.yml"], "set": {"seed": 2},
              "axes": {"variant": "vanilla", "seed": "seed2"}},
             {"name": "dar", "configs": ["configs/attention/dar.yml"], "axes": {"variant": "dar", "seed": "seed1"}},
             {"name": "swa", "configs": ["configs/attention/swa.yml"], "axes": {"variant": "swa", "seed": "seed1"}}],
    "report": {"metric": "bits_per_byte", "relative_over": ["wikitext103", "wikipedia"],
               "baseline": {"variant": "vanilla", "seed": "seed1"}, "repeats": {"variant": "vanilla"}, "cost": True},
}


@pytest.fixture()
def noisy(tmp_path):
    """Two vanilla seeds, DAR and SWA, evaluated on WikiText-103 and an extra corpus with chosen byte perplexities
    (bits per byte = log2 of them), and validated every 10 steps."""
    import math

    sweep = parse_sweep(NOISE_SWEEP, tmp_path / "noisy.yml")
    root = write_plan(sweep, plan(sweep, tmp_path / "runs"))
    ppl = {"vanilla-seed1": (3.0, 4.0), "vanilla-seed2": (3.03, 4.0), "dar": (3.3, 4.4), "swa": (3.0, 4.02)}
    for name, (wt, wiki) in ppl.items():
        _write_run_files(root / name, random.Random(1))
        rows = [{"step": s, "valid_loss": 2.0 - s / 100 + 0.01 * (name == "dar") - 0.002 * (name == "vanilla-seed2"),
                 "consumed_samples": s * 16} for s in (10, 20, 30, 40)]
        metrics = root / name / "metrics.jsonl"
        train = [line for line in metrics.read_text().splitlines() if "valid_loss" not in line]
        metrics.write_text("".join(line + "\n" for line in train) + "".join(json.dumps(r) + "\n" for r in rows))
        result = json.loads((root / name / "eval" / "perplexity.json").read_text())
        result["corpora"] = {c: {"byte_perplexity": p, "bits_per_byte": math.log2(p), "tokens": 100, "documents": 2}
                             for c, p in (("wikitext103", wt), ("wikipedia", wiki))}
        (root / name / "eval" / "perplexity.json").write_text(json.dumps(result))
    return root, ppl


def test_noise_floor_bits_per_byte_and_rel_over_the_evaluated_corpora(noisy):
    """metric bits_per_byte shows bits per byte per corpus, while Rel. (%) stays a perplexity ratio (byte
    perplexity) averaged over relative_over's corpora; the repeat of the baseline gives the noise floor, and each
    run says whether it is beyond it; the KV column is describe's bytes per token."""
    import math

    from neox_dar.config import load_config
    from neox_dar.describe import kv_cache_bytes_per_token

    root, ppl = noisy
    runs, sweep, _ = collect(root)
    table = build_table(runs, sweep.report)
    col = table.columns.index
    assert table.columns[col("Run") + 3:col("Rel. (%)")] == ["WikiText-103", "wikipedia"]
    base = ppl["vanilla-seed1"]
    for name, (wt, wiki) in ppl.items():
        row = _row(table, name)
        assert row[col("WikiText-103")] == pytest.approx(math.log2(wt))
        assert row[col("Rel. (%)")] == pytest.approx((wt / base[0] + wiki / base[1]) / 2 * 100)
    floor = abs((3.03 / 3 + 4.0 / 4) / 2 * 100 - 100)
    assert [_row(table, n)[col("vs noise")] for n in ppl] == ["", "within", "beyond", "within"]
    assert any(n.startswith("Noise floor: vanilla-seed2 has Rel.") and f"{floor:.2f} points" in n
               for n in table.notes)
    avg = average_table(table, runs, ["seed"])  # the baseline's group is the baseline (it showed '--', 'missing')
    assert {r[0]: r[avg.columns.index("vs noise")] for r in avg.rows} == {"vanilla": "", "dar": "beyond",
                                                                          "swa": "within"}
    table.rows[[r[0] for r in table.rows].index("swa")][col("vs noise")] = "beyond"
    table.rows.append(["swa-seed2", *_row(table, "swa")[1:]])
    table.rows[-1][col("vs noise")] = "within"
    runs.append(dataclasses.replace(next(r for r in runs if r.name == "swa"), name="swa-seed2",
                                    axes={"variant": "swa", "seed": "seed2"}))
    swa = next(r for r in average_table(table, runs, ["seed"]).rows if r[0] == "swa")
    assert swa[avg.columns.index("vs noise")] == "mixed" and swa[avg.columns.index("n")] == 2
    cfg = load_config(root / "dar" / "config.yml")
    assert _row(table, "dar")[col("KV (B/token)")] == pytest.approx(
        sum(kv_cache_bytes_per_token(cfg, cfg.model.seq_length, "bf16")))


def test_learning_curves_against_tokens_seen_with_the_noise_band(noisy, monkeypatch):
    """Validation loss per run against the tokens seen (consumed samples x seq_length), the in-training Rel. (%)
    below with the repeat dashed and its distance from 100 shaded as the noise floor."""
    import math

    from neox_dar.report.figures import learning_curves

    root, _ = noisy
    figs = _captured_figures(monkeypatch)
    runs, sweep, _ = collect(root)
    learning_curves(runs, sweep.report, root, sweep.name)
    fig = figs["learning_curves.png"]
    top, bottom = fig.axes[0], fig.axes[1]
    tokens = [s * 16 * 128 for s in (10, 20, 30, 40)]
    dar = next(ln for ln in top.get_lines() if ln.get_label() == "dar")
    assert list(dar.get_xdata()) == tokens
    rel = next(ln for ln in bottom.get_lines() if ln.get_label() == "dar")
    assert list(rel.get_ydata()) == pytest.approx([math.exp(0.01) * 100] * 4)
    repeat = next(ln for ln in bottom.get_lines() if ln.get_label() == "vanilla-seed2")
    assert repeat.get_linestyle() == "--"
    band = bottom.collections[0].get_paths()[0].vertices[:, 1]
    assert band.max() == pytest.approx(100 + (1 - math.exp(-0.002)) * 100)


def test_publish_copies_the_run_files_and_regenerates_the_docs_table(noisy, tmp_path, capsys):
    """publish: the run files without checkpoints, the provenance, the report rebuilt from the copies, and the
    document's marked block replaced by the report's table (text outside the markers untouched); what it prints
    names the files where they end up (it named the staging folder, gone by then)."""
    from neox_dar.report.publish import block, main as publish_main

    root, _ = noisy
    (root / "dar" / "checkpoints" / "step_00000040").mkdir(parents=True)
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- noisy:start -->\nold table\n<!-- noisy:end -->\nafter\n")
    out = tmp_path / "results" / "noisy"
    assert publish_main([str(root), str(out), "--command", "python -m neox_dar.sweep noisy.yml run --local",
                         "--docs", str(doc)]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out / 'report' / 'table.md'}, " in said and ".tmp-" not in said
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["dar", "swa", "sweep.yml", "vanilla-seed1",
                                                                  "vanilla-seed2"]
    assert not (out / "runs" / "dar" / "checkpoints").exists()
    assert (out / "runs" / "dar" / "eval" / "perplexity.json").is_file()
    meta = json.loads((out / "provenance.json").read_text())
    assert meta["training_command"].startswith("python -m neox_dar.sweep") and "cores" in meta["device"]
    assert meta["published"]["git_commit"] and set(meta["runs"]) == {"dar", "swa", "vanilla-seed1", "vanilla-seed2"}
    table = (out / "report" / "table.md").read_text()
    assert block(doc, "noisy") == table.rstrip()
    assert doc.read_text().startswith("before\n") and doc.read_text().endswith("\nafter\n")
    runs, sweep, _ = collect(out / "runs")
    assert to_markdown(build_table(runs, sweep.report)) == table


def test_publish_only_adds_a_later_run_and_keeps_the_others(noisy, tmp_path):
    """publish --only RUN: a run trained later joins the published folder; the other runs' files and provenance
    records stay as published, the added run's record names its command, and the report covers all of them. A run
    not under RUNS_DIR is a one-line error."""
    import shutil

    from neox_dar.report.publish import main as publish_main

    root, _ = noisy
    out = tmp_path / "results" / "noisy"
    swa = tmp_path / "swa-later"
    shutil.move(root / "swa", swa)  # published first without SWA
    assert publish_main([str(root), str(out), "--command", "first"]) == 0
    shutil.move(swa, root / "swa")
    (root / "dar" / "metrics.jsonl").write_text("")  # a change --only must not publish
    before = json.loads((out / "provenance.json").read_text())
    assert publish_main([str(root), str(out), "--command", "second", "--only", "swa"]) == 0
    meta = json.loads((out / "provenance.json").read_text())
    assert sorted(meta["runs"]) == ["dar", "swa", "vanilla-seed1", "vanilla-seed2"]
    assert meta["training_command"] == "first" and meta["runs"]["swa"]["command"] == "second"
    assert all(meta["runs"][n] == before["runs"][n] for n in before["runs"])
    assert (out / "runs" / "dar" / "metrics.jsonl").read_text() != ""
    assert "swa" in (out / "report" / "table.md").read_text()
    assert publish_main([str(root), str(out), "--only", "nope"]) == 2


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_publish_checks_every_argument_before_it_touches_the_publication(noisy, tmp_path, capsys):
    """A mistyped RUNS_DIR, --sweep, --only or --docs, or a report that fails, is a one-line error (exit 2) that
    leaves an existing publication byte for byte as it was (no half-built folder beside it); a re-publication
    keeps the files that publish does not write."""
    from neox_dar.report.publish import main as publish_main

    root, _ = noisy
    out = tmp_path / "results" / "noisy"
    assert publish_main([str(root), str(out)]) == 0
    (out / "data.json").write_text("{}\n")  # written by another tool
    before = _tree(out)
    doc = tmp_path / "doc.md"
    doc.write_text("no markers\n")
    capsys.readouterr()
    for argv in ([str(root) + "-typo", str(out)], [str(tmp_path), str(out)], [str(root), str(out), "--sweep", "x.yml"],
                 [str(root), str(out), "--only", "nope"], [str(root), str(out), "--docs", str(doc)],
                 [str(root), str(root)], [str(root), str(out / "data.json")]):
        assert publish_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("publish error: ") and err.count("\n") == 1, err
        assert _tree(out) == before, argv
    (root / "dar" / "eval" / "perplexity.json").write_text('{"corpora": ')  # the report fails on the copy
    assert publish_main([str(root), str(out)]) == 2
    assert _tree(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["noisy"]
    (root / "dar" / "eval" / "perplexity.json").unlink()
    assert publish_main([str(root), str(out)]) == 0
    assert (out / "data.json").read_text() == "{}\n"
    assert not (out / "runs" / "dar" / "eval" / "perplexity.json").exists()


def test_report_out_under_a_file_and_a_torn_evaluation_are_one_line_errors(sweep_dir, tmp_path, capsys):
    """report --out under a file or naming a file is a one-line error; a torn eval/perplexity.json (a write cut
    short) stops report and sweep status with one line naming the file and how to recover."""
    from neox_dar.sweep.__main__ import main as sweep_main

    root, _ = sweep_dir
    (tmp_path / "README.md").write_text("a file\n")
    for out in (tmp_path / "README.md" / "report", tmp_path / "README.md"):
        assert report_main([str(root), "--out", str(out), "--no-figures"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"report error: --out {out}") and err.count("\n") == 1, err
    torn = root / "vanilla" / "eval" / "perplexity.json"
    torn.write_text(torn.read_text()[:100])
    assert report_main([str(root), "--no-figures"]) == 2
    assert sweep_main([str(root / "sweep.yml"), "status", "--out", str(root)]) == 2
    for err in capsys.readouterr().err.splitlines():
        assert f"{torn}: not valid JSON" in err and "delete it and evaluate the run again" in err, err


def test_compare_adds_a_rel_column_against_another_reference_of_the_same_group(tmp_path):
    """``report.compare``: one more Rel. (%) column per label, against the reference run of the same group (the
    DAR paper's DAR read against SWA at the same window as well as against vanilla); empty for the reference."""
    spec = _scales({"baseline": {"attention_type": "vanilla"}, "group_by": ["scale"],
                    "compare": {"swa": {"attention_type": "swa"}}}, ("vanilla", "swa", "dar"))
    runs, sweep, res = _planned_with_results(tmp_path, spec, seed=12)
    table = build_table(runs, sweep.report)
    ppl = {n: {c: r["corpora"][c]["token_perplexity"] for c in CORPORA} for n, r in res.items()}
    rel, vs = table.columns.index("Rel. (%)"), table.columns.index("Rel. vs swa (%)")
    assert vs == rel + 1
    for scale in ("small", "big"):
        assert _row(table, f"{scale}-dar")[vs] == pytest.approx(_rel(ppl[f"{scale}-dar"], ppl[f"{scale}-swa"]))
        assert _row(table, f"{scale}-vanilla")[vs] == pytest.approx(
            _rel(ppl[f"{scale}-vanilla"], ppl[f"{scale}-swa"]))
        assert _row(table, f"{scale}-swa")[vs] == ""
    assert any(n.startswith("Rel. vs swa (%): the same mean ratio against") for n in table.notes)
    with pytest.raises(SweepError, match="report compare must map labels to selectors"):
        build_table(runs, {**sweep.report, "compare": {"swa": "swa"}})
    with pytest.raises(SweepError, match="matches no run"):
        build_table(runs, {**sweep.report, "compare": {"linear": {"attention_type": "linear"}}})
