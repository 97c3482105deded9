"""eval.table: per-corpus perplexity and Rel. (%) = mean of ppl(run)/ppl(vanilla)*100; missing stays missing."""

import json

import pytest

from eval.table import main
from neox_dar.evaluation.tables import relative_percent


def results(ppl: dict, manifest="m", attention="vanilla", checkpoint="/runs/x/checkpoints/step_00000100"):
    return {"checkpoint": checkpoint, "attention_type": attention,
            "corpora": {c: {"token_perplexity": v, "word_perplexity": 2 * v, "byte_perplexity": 1.5,
                            "bits_per_byte": 0.6, "manifest_sha256": manifest} for c, v in ppl.items()}}


def write(tmp_path, name, res):
    path = tmp_path / name
    path.write_text(json.dumps(res))
    return str(path)


def test_relative_percent_formula():
    base = results({"fineweb_edu": 20.0, "c4": 40.0, "wikitext103": 50.0})
    run = results({"fineweb_edu": 21.0, "c4": 38.0, "wikitext103": 55.0})
    expected = (21 / 20 + 38 / 40 + 55 / 50) / 3 * 100
    assert relative_percent(run, base) == pytest.approx(expected)
    assert relative_percent(base, base) == pytest.approx(100.0)
    assert relative_percent(results({"fineweb_edu": 21.0, "c4": 38.0}), base) is None


def test_table_markdown_latex_and_missing(tmp_path, capsys):
    base = write(tmp_path, "vanilla.json", results({"fineweb_edu": 20.0, "c4": 40.0, "wikitext103": 50.0}))
    dar = write(tmp_path, "dar.json", results({"fineweb_edu": 21.0, "c4": 38.0, "wikitext103": 55.0}, attention="dar"))
    swa = write(tmp_path, "swa.json", results({"fineweb_edu": 22.0, "wikitext103": 60.0}, manifest="other"))
    assert main([dar, swa, "--baseline", base, "--names", "DAR,SWA_w128"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "| Model | FineWeb-Edu | C4 | WikiText-103 | Rel. (%) |" in out
    assert "| Vanilla | 20.00 | 40.00 | 50.00 | 100.00 |" in out
    rel = (21 / 20 + 38 / 40 + 55 / 50) / 3 * 100
    assert f"| DAR | 21.00 | 38.00 | 55.00 | {rel:.2f} |" in out
    assert "| SWA_w128 | 22.00 | -- | 60.00 | -- |" in out          # missing corpus: never a number
    assert r"\toprule" in out and r"SWA\_w128 & 22.00 & -- & 60.00 & -- \\" in out
    assert "Rel. (\\%)" in out
    assert "other documents" in captured.err                         # manifest differs from the baseline


def test_default_names_metric_and_errors(tmp_path, capsys):
    base = write(tmp_path, "v.json", results({"fineweb_edu": 20.0, "c4": 40.0, "wikitext103": 50.0}))
    run = write(tmp_path, "a.json", results({"fineweb_edu": 10.0, "c4": 20.0, "wikitext103": 25.0}, attention="aha",
                                            checkpoint="/runs/aha-70m/checkpoints/step_00001000"))
    assert main([run, "--baseline", base, "--metric", "word_perplexity", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| aha (aha-70m) | 20.00 | 40.00 | 50.00 | 50.00 |" in out and "tabular" not in out
    assert main([str(tmp_path / "none.json"), "--baseline", base]) == 2
    assert "none.json" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main([str(bad), "--baseline", base]) == 2
