"""eval.aha_gates: AHA's Table 3 (gaps between full-attention calls), Fig. 1 (gates over a text) and per-task
Figs. 3-4, on a tiny AHA checkpoint and on hand-made gates and result files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from builders import saved_run

from eval.aha_gates import head_tables, main, representative, stream_gaps, text_gates

ROOT = Path(__file__).resolve().parents[1]


def test_stream_gaps_is_the_mean_spacing_of_consecutive_openings():
    gates = torch.zeros(20, 3, dtype=torch.bool)
    gates[:, 0] = True  # every token: gap 1
    gates[[2, 5, 13], 1] = True  # spacings 3 and 8
    gates[7, 2] = True  # one opening: no gap
    gaps = stream_gaps(gates)
    assert gaps[0] == 1.0 and gaps[1] == pytest.approx(5.5) and torch.isnan(gaps[2])


def _result(tmp_path: Path) -> Path:
    stats = [{"layer0/mu_f": [1.0, 0.5], "layer1/mu_f": [0.1, 0.0]}, {"layer0/mu_f": [0.8, 0.25], "layer1/mu_f": [0.2, 0.0]}]
    rows = [{"task": "mmlu", "label": "MMLU", "attention_stats": stats[0]},
            {"task": "gsm8k", "label": "GSM8K", "attention_stats": stats[1]}]
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"suite": "aha-table1", "tasks": rows}))
    return path


def test_table3_prints_one_over_mu_f_for_representative_heads(tmp_path, capsys):
    path = _result(tmp_path)
    tables = head_tables(json.loads(path.read_text()))
    assert list(tables) == ["MMLU", "GSM8K"] and representative(tables) == [(0, 0), (1, 0), (1, 1)]
    assert main(["table3", str(path), "--json", str(tmp_path / "gaps.json")]) == 0
    out = capsys.readouterr().out
    assert "| Layer 0, Head 0 | 1.00 | 1.25 |" in out and "| Layer 1, Head 0 | 10.00 | 5.00 |" in out
    assert "| Layer 1, Head 1 | never | never |" in out
    assert json.loads((tmp_path / "gaps.json").read_text())["gap"]["1.0"] == {"MMLU": 10.0, "GSM8K": 5.0}
    assert main(["table3", str(path), "--heads", "0.1"]) == 0 and "| Layer 0, Head 1 | 2.00 | 4.00 |" in \
        capsys.readouterr().out


def test_committed_perplexity_result_gives_table3_and_per_corpus_figures(tmp_path, capsys):
    """The CPU replication's AHA run (a perplexity result: one column per corpus)."""
    result = ROOT / "results" / "replicate-cpu" / "runs" / "aha-w64" / "eval" / "perplexity.json"
    assert main(["table3", str(result)]) == 0
    assert "| Head | wikitext103 | wikipedia |" in capsys.readouterr().out
    assert main(["heads", str(result), "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aha_mu_f_heads_tasks.png", "aha_mu_f_heatmap_tasks.png"]


@pytest.fixture(scope="module")
def aha_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("aha") / "run"
    model, _ = saved_run(run, "attention_type=aha", "window_size=4", seed=5)
    return run, model


def test_text_draws_fig1_from_the_forwards_gates(aha_run, tmp_path):
    run, model = aha_run
    text = tmp_path / "a.txt"
    text.write_text("The cat sat on the mat.\nIt was a sunny day, and the cat was happy to sit there.")
    assert main(["text", str(run), "--text", str(text), "--text", str(text), "--out", str(tmp_path / "fig1.png"),
                 "--json", str(tmp_path / "fig1.json"), "--max-tokens", "20"]) == 0
    assert (tmp_path / "fig1.png").stat().st_size > 0
    out = json.loads((tmp_path / "fig1.json").read_text())
    (first, _) = out["texts"]
    assert first["tokens"] == 20 and len(first["share_per_token"]) == 20
    gates = text_gates(model, [0] * 3, prefix=0)  # (T, L, H)
    assert gates.shape == (3, 2, 4) and gates.dtype == torch.bool
    # the per-head mu_f of the text is the mean of its share over tokens
    mu = torch.tensor(first["mu_f_per_head"])
    assert mu.mean().item() == pytest.approx(sum(first["share_per_token"]) / 20)


def test_bad_input_is_one_line(aha_run, tmp_path, capsys):
    run, _ = aha_run
    assert main(["table3", str(tmp_path / "none.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "x.json").write_text("{}")
    assert main(["heads", str(tmp_path / "x.json"), "--out", str(tmp_path)]) == 2
    assert "not a result" in capsys.readouterr().err
    assert main(["table3", str(_result(tmp_path)), "--heads", "7.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not in the model's 2 layers x 2 heads" in err
    vanilla = tmp_path / "vanilla"
    saved_run(vanilla)
    (tmp_path / "t.txt").write_text("hello")
    assert main(["text", str(vanilla), "--text", str(tmp_path / "t.txt"), "--out", str(tmp_path / "f.png")]) == 2
    assert "an AHA checkpoint is needed" in capsys.readouterr().err
    assert main(["text", str(run), "--text", str(tmp_path / "t.txt"), "--out", str(tmp_path / "f.png"),
                 "--max-tokens", "0"]) == 2
    assert capsys.readouterr().err == "error: --max-tokens must be >= 1, got 0\n"
    # outputs checked before any work (an OSError, IsADirectoryError or FileExistsError traceback after it, and a
    # folder as text's --out was written as FOLDER.png)
    for argv, said in ((["text", str(run), "--text", str(tmp_path / "t.txt"), "--out", str(tmp_path)],
                        "name an image file ending in .png"),
                       (["table3", str(_result(tmp_path)), "--json", str(tmp_path)],
                        f"--json {tmp_path} is a directory"),
                       (["heads", str(_result(tmp_path)), "--out", str(tmp_path / "t.txt")], "is a file")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


def test_docs_table3_is_the_commands_output(capsys, monkeypatch):
    docs = (ROOT / "docs" / "attention.md").read_text()
    shown = docs.split("<!-- aha-table3 -->\n", 1)[1].split("\n<!-- /aha-table3 -->", 1)[0]
    monkeypatch.chdir(ROOT)
    assert main(["table3", "results/replicate-cpu/runs/aha-w64/eval/perplexity.json"]) == 0
    assert capsys.readouterr().out.strip() == shown.strip()
