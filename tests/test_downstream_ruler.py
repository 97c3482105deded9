"""The RULER suite (DimPO Table 4) of eval.downstream: its definition, and its wiring (task metadata with the
lengths and the model's own tokenizer, one evaluation for both lengths, a group's mean over subtasks for a length
its aggregate leaves out) on a local stand-in of RULER's tasks (tests/fixtures/ruler_standin: lm-eval's RULER needs
the Hub and the wonderwords/nltk packages)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from builders import saved_run

import eval.downstream as downstream
from eval.downstream import _score, run_suite
from eval.suites import SUITES, SuiteError, load_suites

STANDIN = Path(__file__).resolve().parent / "fixtures" / "ruler_standin"


def test_dimpo_table4_suite_is_ruler_at_4k_and_8k():
    suite = SUITES["dimpo-table4"]
    assert [(t.task, t.metric) for t in suite.tasks] == [("ruler", "4096,none"), ("ruler", "8192,none")]
    assert suite.metadata == {"max_seq_lengths": [4096, 8192]} and suite.max_length == 8192


def test_a_length_the_group_does_not_aggregate_is_the_mean_over_its_subtasks():
    results = {"ruler": {"4096,none": 0.5, "4096_stderr,none": "N/A"}, "niah_single_1": {"4096,none": 0.4,
               "8192,none": 0.2}, "ruler_vt": {"4096,none": 0.6, "8192,none": 0.6}}
    assert _score(results, "ruler", "4096,none") == (0.5, None)
    assert _score(results, "ruler", "8192,none") == (pytest.approx(0.4), None)
    with pytest.raises(SuiteError, match="reported no '16384,none'"):
        _score(results, "ruler", "16384,none")


def test_the_standin_runs_both_lengths_in_one_evaluation_with_the_models_tokenizer(tmp_path, monkeypatch):
    saved_run(tmp_path / "run", seed=3)
    (tmp_path / "suites.yml").write_text(
        "ruler-standin:\n  paper: a RULER stand-in\n  max_length: 128\n  metadata: {max_seq_lengths: [64, 96]}\n"
        "  tasks:\n    - [neox_dar_ruler, 0, '64,none']\n    - [neox_dar_ruler, 0, '96,none']\n")
    calls, seen = [], []
    real = downstream.run_task

    def counted(lm, specs, manager, *args):
        calls.append([s.metric for s in specs])
        seen.append(dict(manager.metadata))
        return real(lm, specs, manager, *args)

    monkeypatch.setattr(downstream, "run_task", counted)
    result = run_suite(str(tmp_path / "run"), "ruler-standin", load_suites(str(tmp_path / "suites.yml")),
                       include_path=str(STANDIN), batch_size=2, device="cpu")
    assert calls == [["64,none", "96,none"]]
    assert seen[0]["max_seq_lengths"] == [64, 96] and not Path(seen[0]["tokenizer"]).exists()  # a temporary copy
    assert result["metadata"] == {"max_seq_lengths": [64, 96]} and result["max_length"] == 128
    rows = result["tasks"]
    assert [r["metric"] for r in rows] == ["64,none", "96,none"] and all(r["docs"] == 8 for r in rows)
    assert all(0.0 <= r["score"] <= 1.0 for r in rows)


def test_the_standin_sizes_prompts_with_the_given_tokenizer(tmp_path, monkeypatch):
    from neox_dar.tokenizer import DEFAULT_TOKENIZER, hf_tokenizer

    monkeypatch.syspath_prepend(str(STANDIN))
    standin = importlib.import_module("standin")
    tok = hf_tokenizer(DEFAULT_TOKENIZER)
    tok.save_pretrained(tmp_path)
    docs = standin.needle_a(max_seq_lengths=[64, 96], tokenizer=str(tmp_path))["test"]
    assert [r["max_length"] for r in docs] == [64, 64, 96, 96]
    assert all(len(tok(r["input"]).input_ids) <= r["max_length"] for r in docs)
