"""The papers' downstream suites (eval.downstream): tasks and metrics by lm-eval's names, the short-context filter
on the prompts the model receives, per-task mu_f, relative-score tables, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import saved_run

from eval.downstream import main, run_suite, table
from eval.suites import SUITES, SuiteError, load_suites
from neox_dar.tokenizer import DEFAULT_TOKENIZER, load_tokenizer

QUESTIONS = ["Is 3 smaller than 5?", "Is ice colder than steam, given that both are made of water at normal air "
             "pressure and the steam is hot?", "Is a cat a mammal?", "Do fish breathe with gills, unlike the "
             "mammals and the birds that live on land and breathe air with lungs?", "Is 7 even?",
             "Is the sun a star, and is it the closest star to the Earth, nearer than any star of the night sky?"]


def _task_folder(root: Path) -> Path:
    """A local 1-shot multiple-choice lm-eval task over questions of mixed lengths, and a suite file for it."""
    rows = [{"question": q, "choices": ["no", "yes"], "label": 1} for q in QUESTIONS]
    (root / "yesno.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "yesno.yaml").write_text(
        f"task: neox_dar_yesno\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'yesno.jsonl'}\n"
        "test_split: test\nfewshot_split: test\nfewshot_config:\n  sampler: first_n\noutput_type: multiple_choice\n"
        'doc_to_text: "Q: {{question}}\\nA:"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\n'
        "metric_list:\n  - metric: acc\n")
    (root / "suites.yml").write_text(
        "yesno:\n  paper: a test suite\n  min_context: window\n  relative: Retain %\n"
        "  tasks:\n    - [neox_dar_yesno, 1, 'acc,none']\n")
    return root


@pytest.fixture(scope="module", autouse=True)
def lm_evals_task_index_once():
    """lm-eval's TaskManager indexes its own ~13,000 task YAML files (~15 s) each time one over them is made (a
    run_suite whose tasks are not all in include_path makes one; test_suites_name_lm_evals_tasks does). That index
    is a pure function of the installed files: for this module it is built once and every TaskManager gets it (the
    index of any other folder, include_path's, is built as usual)."""
    import lm_eval.tasks
    from lm_eval.tasks._index import TaskIndex

    builtin, build, cache = Path(lm_eval.tasks.__file__).parent.resolve(), TaskIndex.build, {}

    def build_once(paths, *, resolve_includes=True):
        index = {}
        for root in paths:
            if Path(root).resolve() != builtin:
                index.update(build([root], resolve_includes=resolve_includes))
                continue
            if resolve_includes not in cache:
                cache[resolve_includes] = build([root], resolve_includes=resolve_includes)
            index.update(cache[resolve_includes])
        return index

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TaskIndex, "build", staticmethod(build_once))
        yield


@pytest.fixture(scope="module")
def aha(tmp_path_factory):
    root = tmp_path_factory.mktemp("aha")
    saved_run(root / "run", "attention_type=aha", "window_size=30", seed=5)
    return root / "run", _task_folder(root)


def _prompt_tokens(shot_index: int, index: int) -> int:
    """Tokens of the 1-shot prompt of document ``index`` (first_n: the first other document is the example)."""
    tok = load_tokenizer(path=DEFAULT_TOKENIZER)
    example = f"Q: {QUESTIONS[shot_index]}\nA: yes\n\n"
    return len(tok.encode(example + f"Q: {QUESTIONS[index]}\nA:", add_special_tokens=False).ids)


def test_short_prompts_are_dropped_and_the_rest_scored_as_lm_eval_scores_them(aha):
    """min_context = the model's window (30): documents whose 1-shot prompt is shorter are dropped; the others
    get exactly lm-eval's own scores for them (same few-shot example), and mu_f is over the scored tokens."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    run, folder = aha
    suites = load_suites(str(folder / "suites.yml"))
    result = run_suite(str(run), "yesno", suites, include_path=str(folder), batch_size=2, device="cpu")
    lengths = [_prompt_tokens(1 if i == 0 else 0, i) for i in range(len(QUESTIONS))]
    keep = [i for i, n in enumerate(lengths) if n >= 30]
    assert 0 < len(keep) < len(QUESTIONS) and result["min_context"] == 30
    (row,) = result["tasks"]
    assert (row["docs"], row["dropped_short"]) == (len(keep), len(QUESTIONS) - len(keep))
    assert 0.0 <= row["mu_f"] <= 1.0 and sorted(row["attention_stats"]) == ["layer0/mu_f", "layer1/mu_f"]
    theirs = simple_evaluate(model="neox_dar", model_args=f"checkpoint={run}", tasks=["neox_dar_yesno"],
                             num_fewshot=1, samples={"neox_dar_yesno": keep}, device="cpu", batch_size=2,
                             task_manager=TaskManager(include_path=str(folder), include_defaults=False))
    assert row["score"] == pytest.approx(theirs["results"]["neox_dar_yesno"]["acc,none"])
    again = run_suite(str(run), "yesno", suites, include_path=str(folder), min_context=0, batch_size=2,
                      device="cpu")
    assert again["tasks"][0]["docs"] == len(QUESTIONS) and again["tasks"][0]["dropped_short"] == 0


def test_table_prints_scores_average_relative_and_mu_f(tmp_path):
    def result(name, scores, mu=None):
        rows = [{"task": t, "label": t.upper(), "score": s, **({"mu_f": mu} if mu is not None else {})}
                for t, s in scores.items()]
        return {"checkpoint": f"runs/{name}", "suite": "aha-table1", "tasks": rows}

    base = result("base", {"a": 0.5, "b": 0.8})
    text = table([base, result("aha-w64", {"a": 0.45, "b": 0.8}, mu=0.25)], base, SUITES)
    lines = text.splitlines()
    assert lines[0].startswith("AHA Table 1") and "| run | A | B | Avg. | Retain % | mu_f |" in text
    assert "| aha-w64 | 45.00 | 80.00 | 62.50 | 95.00 | 0.250 |" in text  # (90 + 100) / 2
    assert "| base | 50.00 | 80.00 | 65.00 | 100.00 | - |" in text


def test_suites_name_lm_evals_tasks():
    """Every task of every built-in suite is one lm-eval 0.4 knows (a task or a group)."""
    from lm_eval.tasks import TaskManager

    known = set(TaskManager().all_tasks)
    for name, suite in SUITES.items():
        missing = [t.task for t in suite.tasks if t.task not in known]
        assert not missing, (name, missing)
    assert [t.shots for t in SUITES["dar-table4"].tasks] == [5, 5, 5, 5, 3, 0]
    assert [t.shots for t in SUITES["aha-table1"].tasks] == [5, 5, 5, 5, 0, 0]


def test_bad_input_is_one_line(aha, tmp_path, capsys):
    run, folder = aha
    assert main(["run", str(run), "--suite", "dar-table4"]) == 2
    assert "--allow-code-execution" in capsys.readouterr().err
    assert main(["run", str(run), "--suite", "nope"]) == 2
    assert "unknown suite 'nope'" in capsys.readouterr().err
    (tmp_path / "bad.yml").write_text("x: {tasks: 3}\n")
    assert main(["list", "--suite-file", str(tmp_path / "bad.yml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a suite file" in err
    for body, said in [("x: {tasks: [[a, 0, acc]]\n", "malformed YAML in {f}:2:1: expected ',' or '}}', but got"),
                       ("x: {tasks: [[a, 0, acc]]}\nx: {tasks: []}\n", "'x' is given twice in {f}:2")]:
        (tmp_path / "bad.yml").write_text(body)
        assert main(["list", "--suite-file", str(tmp_path / "bad.yml")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said.format(f=tmp_path / "bad.yml") in err, err
    assert main(["list"]) == 0 and "dar-table4: DAR Table 4" in capsys.readouterr().out
    # before: a KeyError traceback, a run recorded as -1-shot, lm-eval's "did not find any docs!"
    (tmp_path / "typo.yml").write_text("typo: {tasks: [[neox_dar_yesnoo, 0, 'acc,none']]}\n")
    (tmp_path / "minus.yml").write_text("minus: {tasks: [[neox_dar_yesno, -1, 'acc,none']]}\n")
    for words, said in ((["--suite", "typo", "--suite-file", str(tmp_path / "typo.yml")],
                         "suite typo: no lm-eval task named neox_dar_yesnoo"),
                        (["--suite", "minus", "--suite-file", str(tmp_path / "minus.yml")],
                         "shots must be >= 0, got -1"),
                        (["--suite", "yesno", "--limit", "0", "--suite-file", str(folder / "suites.yml")],
                         "--limit must be >= 1, got 0"),
                        # checked before the suite runs (an IsADirectoryError traceback after it, before)
                        (["--suite", "yesno", "--suite-file", str(folder / "suites.yml"), "--out", str(tmp_path)],
                         f"--out {tmp_path} is a directory"),
                        (["--suite", "yesno", "--suite-file", str(folder / "suites.yml"), "--device", "gpu"],
                         "--device 'gpu' is not a device"),
                        (["--suite", "yesno", "--suite-file", str(folder / "suites.yml"), "--include-path",
                          str(tmp_path / "none")], f"--include-path {tmp_path / 'none'} is not a folder")):
        argv = ["run", str(run), "--include-path", str(folder), *words]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err


def test_a_group_with_an_emptied_subtask_and_a_tag_are_scored(aha, tmp_path):
    """A group whose subtask keeps no document after the window filter is scored on the others (lm-eval crashed on
    the empty one, so the group had no score); a tag's score is the mean of its tasks' (it was its first task's)."""
    run, folder = aha
    body = (folder / "yesno.yaml").read_text()

    def task(name, rows, tag=""):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / f"{name}.yaml").write_text(body.replace("task: neox_dar_yesno", f"task: neox_dar_{name}{tag}")
                                             .replace("yesno.jsonl", f"{name}.jsonl"))

    task("short", [{"question": q, "choices": ["no", "yes"], "label": 1} for q in ("Is 7 odd?", "Is 2 even?")])
    for name, label in (("yes5", 1), ("no5", 0)):  # the same 5 questions, opposite answers: scores k/5 and 1 - k/5
        task(name, [{"question": q, "choices": ["no", "yes"], "label": label} for q in QUESTIONS[:5]],
             "\ntag: neox_dar_tag")
    def group(name, *members):
        (folder / f"{name}.yaml").write_text(f"group: neox_dar_{name}\ntask:\n" + "".join(
            f"  - neox_dar_{m}\n" for m in members) + "aggregate_metric_list:\n  - metric: acc\n    weight_by_size: true\n")

    group("mix", "yesno", "short")
    (tmp_path / "s.yml").write_text("mix: {min_context: window, tasks: [[neox_dar_mix, 1, 'acc,none']]}\n"
                                    "tag: {tasks: [[neox_dar_tag, 0, 'acc,none']]}\n"
                                    "each: {tasks: [[neox_dar_yes5, 0, 'acc,none'], [neox_dar_no5, 0, 'acc,none']]}\n")
    suites = load_suites(str(tmp_path / "s.yml"))

    def scores(name, suites=suites):
        return run_suite(str(run), name, suites, include_path=str(folder), batch_size=2, device="cpu")["tasks"]

    (mixed,), (alone,) = scores("mix"), scores("yesno", load_suites(str(folder / "suites.yml")))
    assert mixed["unscored_subtasks"] == ["neox_dar_short"] and mixed["docs"] == alone["docs"]
    assert mixed["score"] == pytest.approx(alone["score"])
    (tag,), each = scores("tag"), [r["score"] for r in scores("each")]
    assert tag["score"] == pytest.approx(0.5) and each[0] + each[1] == pytest.approx(1.0) and each[0] != 0.5
    # a group of groups, as lm-eval's mmlu (mmlu -> mmlu_stem -> tasks): the size-weighted mean of its leaf tasks
    # (lm-eval 0.4.13's evaluate() crashed on the nested form the deprecated get_task_dict gave: the MMLU rows of
    # the DAR and AHA suites could not run)
    group("outer", "mix", "yes5")
    (tmp_path / "n.yml").write_text("outer: {tasks: [[neox_dar_outer, 0, 'acc,none']]}\nleaves: {tasks: "
                                    "[[neox_dar_yesno, 0, 'acc,none'], [neox_dar_short, 0, 'acc,none'], "
                                    "[neox_dar_yes5, 0, 'acc,none']]}\n")
    nested = load_suites(str(tmp_path / "n.yml"))
    (outer,), leaves = scores("outer", nested), scores("leaves", nested)
    assert outer["docs"] == sum(r["docs"] for r in leaves)
    assert outer["score"] == pytest.approx(sum(r["score"] * r["docs"] for r in leaves) / outer["docs"])


def test_tables_refuse_results_that_scored_other_documents():
    def result(name, min_context):
        return {"checkpoint": f"runs/{name}", "suite": "aha-table1", "min_context": min_context,
                "tasks": [{"task": "a", "score": 0.5}]}

    with pytest.raises(SuiteError, match="dropped documents shorter than different lengths"):
        table([result("w256", 256)], result("base", 128), SUITES)


def test_the_shipped_demo_task_runs_from_any_directory(aha, tmp_path, monkeypatch):
    """data/eval/tasks' demo task reads its documents from beside its YAML (it named a path relative to the
    repository root, so it failed anywhere else): run from a scratch directory it scores all 8 documents."""
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    result = run_suite(str(aha[0]), "demo", load_suites(root / "configs" / "finetune" / "demo-suite.yml"),
                       include_path=str(root / "data" / "eval" / "tasks"), min_context=0, batch_size=2,
                       device="cpu")
    assert result["tasks"][0]["docs"] == 8
