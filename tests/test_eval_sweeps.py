"""Evaluation defaults of sweeps: the Hub corpora with documented document counts, and one manifest per sweep so
that every run scores the same documents. The Hub is unreachable here: ``datasets.load_dataset`` is replaced by
a function that yields rows, and pinning is exercised with local files."""

import json
import shutil
from pathlib import Path

import datasets
import pytest
from builders import saved_run

from eval.perplexity import build_parser, main
from neox_dar.evaluation.corpora import (
    CORPORA,
    HUB_DEFAULT_DOCS,
    HUB_SOURCES,
    CorpusError,
    load_hub,
    load_local,
)
from neox_dar.evaluation.perplexity import SWEEP_MANIFEST, _publish, load_corpora
from neox_dar.sweep.slurm import eval_args
from neox_dar.sweep.errors import SweepError
from neox_dar.rundir import RUN_META
from neox_dar.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_sweeps_evaluate_the_hub_corpora_with_the_default_counts():
    """Every shipped sweep but those that score local files: the replications and the second round of results
    (their local files and extra corpus: tests/test_replicate.py, tests/test_results.py) and MSWA's enwik8 sweep
    (the enwik8 test split, bits per character), whose last --corpora names enwik8 alone."""
    local = {"replicate-small.yml", "replicate-cpu.yml", "results-round2.yml", "results-round2-finetune.yml",
             "mswa-enwik8.yml"}
    enwik8 = build_parser().parse_args(["run", *eval_args(load_sweep(ROOT / "configs/sweeps/mswa-enwik8.yml").eval)])
    assert enwik8.source == "local" and enwik8.corpora == "enwik8"
    for path in sorted((ROOT / "configs/sweeps").glob("*.yml")):
        if path.name in local:
            continue
        args = eval_args(load_sweep(path).eval)
        parsed = build_parser().parse_args(["run", *args])
        assert parsed.source == "hub" and parsed.sweep_manifest, path.name
        assert parsed.corpora.split(",") == list(CORPORA)
        assert parsed.max_docs == [f"{c}={'all' if n is None else n}" for c, n in HUB_DEFAULT_DOCS.items()]
    assert HUB_DEFAULT_DOCS == {"fineweb_edu": 2000, "c4": 5000, "wikitext103": None}


def test_eval_settings():
    assert eval_args(None) == [] and eval_args(False) == []
    assert eval_args({"source": "local", "corpora": ["c4"], "max_docs": 3, "args": ["--batch-size", "4"]}) == [
        "--source", "local", "--corpora", "c4", "--sweep-manifest", "--max-docs=c4=3", "--batch-size", "4"]
    assert eval_args({"source": "local"})[-3:] == ["--max-docs=fineweb_edu=all", "--max-docs=c4=all",
                                                   "--max-docs=wikitext103=all"]
    assert eval_args({"max_docs": {"c4": 10, "fineweb_edu": None}})[-3:] == [
        "--max-docs=fineweb_edu=all", "--max-docs=c4=10", "--max-docs=wikitext103=all"]
    for bad, message in (({"sources": "hub"}, "unknown eval setting"), ({"source": "web"}, "source"),
                         ({"corpora": ["c5"]}, "corpora"), ({"corpora": "c4"}, "corpora"),
                         ({"max_docs": {"c5": 1}}, "max_docs"), ({"max_docs": 0}, "max_docs"),
                         ({"max_docs": {"c4": "ten"}}, "max_docs"), ({"max_docs": 1.5}, "max_docs")):
        with pytest.raises(SweepError, match=message) as e:
            eval_args(bad)
        assert "\n" not in str(e.value)


def _run_dir(sweep_dir, name, seed):
    run = sweep_dir / name
    saved_run(run, seed=seed)
    (run / RUN_META).write_text(json.dumps({"sweep": "s", "run": name}))
    return run


def _evaluate(run, ev):
    out = run / "eval" / "perplexity.json"
    rc = main([str(run), *eval_args(ev), "--no-progress", "--batch-size", "4", "--out", str(out)])
    return rc, json.loads(out.read_text()) if rc == 0 else None


def test_runs_of_a_sweep_score_the_documents_of_its_manifest(tmp_path, capsys):
    """The first run evaluated writes <sweep>/eval_manifest.json; a later run scores exactly those documents even
    when the corpus files changed order, and refuses to run when a pinned document's text changed."""
    corpus = tmp_path / "c4"
    shutil.copytree(ROOT / "data/eval/c4", corpus)
    ev = {"source": "local", "corpora": ["c4"], "max_docs": 2, "args": ["--corpus-path", f"c4={corpus}"]}
    sweep = tmp_path / "runs"
    first, second = _run_dir(sweep, "vanilla", 1), _run_dir(sweep, "other", 2)

    rc, res1 = _evaluate(first, ev)
    assert rc == 0
    manifest = json.loads((sweep / SWEEP_MANIFEST).read_text())
    ids = [d["id"] for d in manifest["corpora"]["c4"]["documents"]]
    assert len(ids) == 2 and res1["corpora"]["c4"]["manifest_sha256"] == manifest["corpora"]["c4"]["sha256"]

    # a new file that sorts first: the first two documents of the directory are now others
    (corpus / "a-new.jsonl").write_text("".join(json.dumps({"text": f"A new document number {i}."}) + "\n"
                                                for i in range(3)))
    unpinned, _ = load_corpora(["c4"], "local", paths={"c4": str(corpus)}, max_docs={"c4": 2})
    assert [d.id for d in unpinned["c4"]] != ids
    rc, res2 = _evaluate(second, ev)
    assert rc == 0
    assert res2["manifest_hash"] == res1["manifest_hash"] and res2["corpora"]["c4"]["documents"] == 2
    assert res2["corpora"]["c4"]["tokens"] == res1["corpora"]["c4"]["tokens"]
    assert "scoring the documents of" in capsys.readouterr().err

    # a pinned document whose text changed: a one-line error, no results
    victim = sorted(p for p in corpus.iterdir() if p.name.startswith("c4-"))[0]
    shutil.copy(ROOT / "data/eval/c4" / sorted(p.name for p in (ROOT / "data/eval/c4").iterdir())[1], victim)
    (second / "eval" / "perplexity.json").unlink()
    rc, _ = _evaluate(second, ev)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert rc == 2 and len(errors) == 1 and "differs from the manifest" in errors[0], err

    # --sweep-manifest needs a run directory of a sweep
    assert main([str(first / "checkpoints"), "--corpora", "c4", "--sweep-manifest"]) == 2
    assert RUN_META in capsys.readouterr().err


def test_manifest_publication_is_atomic_and_the_first_writer_wins(tmp_path):
    path = tmp_path / "sweep" / SWEEP_MANIFEST
    assert _publish(path, {"corpora": {"c4": "first"}})
    assert not _publish(path, {"corpora": {"c4": "second"}})
    assert json.loads(path.read_text()) == {"corpora": {"c4": "first"}}
    assert [p.name for p in path.parent.iterdir()] == [SWEEP_MANIFEST]  # no temporary file left behind


def _fake_hub(monkeypatch, rows_by_path, calls):
    def load_dataset(path, name=None, split=None, streaming=False):
        calls.append((path, name, split, streaming))
        return iter(rows_by_path[path])  # a stream: rows one by one, never a length
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)


def _short_wikitext_pages(n: int = 4) -> list:
    """The ``n`` shortest pages of the shipped WikiText-103 sample, in file order: the stand-in Hub split's pages,
    every one of which an evaluation scores (the sample's first four are ~17k tokens; these are ~1.4k)."""
    pages = load_local("wikitext103")
    return [pages[i] for i in sorted(sorted(range(len(pages)), key=lambda i: len(pages[i].count_text))[:n])]


@pytest.fixture()
def hub_rows():
    # the stand-in C4 split holds the shipped sample's documents, shortest first: the evaluations score its first rows
    c4 = [{"text": d.text, "timestamp": "2019", "url": f"https://x/{i}"}
          for i, d in enumerate(sorted(load_local("c4"), key=lambda d: len(d.text)))]
    wiki = [{"page": d.count_text} for d in _short_wikitext_pages()]
    fineweb = [{"id": f"<urn:{i}>", "text": d.text} for i, d in enumerate(load_local("fineweb_edu")[:5])]
    return {HUB_SOURCES["c4"].path: c4, HUB_SOURCES["wikitext103"].path: wiki, HUB_SOURCES["fineweb_edu"].path: fineweb}


def test_load_hub_streams_the_first_documents(monkeypatch, hub_rows):
    calls = []
    _fake_hub(monkeypatch, hub_rows, calls)
    c4 = load_hub("c4", max_docs=3)
    assert calls == [("allenai/c4", "en", "validation", True)]
    assert [d.id for d in c4] == [f"allenai/c4/en/validation:{i}" for i in range(3)]
    assert [d.text for d in c4] == [r["text"] for r in hub_rows["allenai/c4"][:3]]
    fineweb = load_hub("fineweb_edu")
    assert [d.id for d in fineweb] == [f"<urn:{i}>" for i in range(5)]
    wiki = load_hub("wikitext103", max_docs=None)
    local = _short_wikitext_pages()
    assert [(d.text, d.count_text) for d in wiki] == [(d.text, d.count_text) for d in local]  # detokenized as lm-eval
    hub_rows["allenai/c4"][0] = {"content": "no text field"}
    with pytest.raises(CorpusError, match="row 0 has no string 'text' field"):
        load_hub("c4", max_docs=2)
    hub_rows["allenai/c4"].clear()
    with pytest.raises(CorpusError, match="yielded no documents"):
        load_hub("c4")


def test_hub_source_through_the_command_line_and_the_sweep_manifest(monkeypatch, hub_rows, tmp_path):
    calls = []
    _fake_hub(monkeypatch, hub_rows, calls)
    sweep = tmp_path / "runs"
    first, second = _run_dir(sweep, "a", 1), _run_dir(sweep, "b", 2)
    ev = {"corpora": ["c4", "wikitext103"], "max_docs": {"c4": 3}}
    rc, res = _evaluate(first, ev)
    assert rc == 0
    assert res["corpora"]["c4"]["documents"] == 3 and res["corpora"]["wikitext103"]["documents"] == 4
    assert res["corpora"]["c4"]["source"] == "hub:allenai/c4/en/validation"
    manifest = json.loads((sweep / SWEEP_MANIFEST).read_text())
    assert manifest["corpora"]["c4"]["num_documents"] == 3
    hub_rows["allenai/c4"].insert(3, {"text": "a row after the pinned ones changes nothing"})
    rc, res2 = _evaluate(second, ev)
    assert rc == 0 and res2["manifest_hash"] == res["manifest_hash"]
    hub_rows["allenai/c4"].insert(0, {"text": "a new first row"})
    (second / "eval" / "perplexity.json").unlink()
    rc, _ = _evaluate(second, ev)
    assert rc == 2  # the Hub split changed under the pinned documents: refused, not silently rescored


def test_prefetch_writes_the_hub_documents_that_an_offline_evaluation_then_scores(monkeypatch, hub_rows, tmp_path,
                                                                                   capsys):
    """``python -m eval.prefetch OUT``, then ``--source local --data-dir OUT``: the Hub's documents (ids, texts and
    hashes, so the same manifest) with no network; a changed file is refused; an interrupted prefetch leaves OUT as
    it was."""
    from eval.prefetch import main as prefetch_main
    from neox_dar.evaluation.perplexity import load_corpora

    _fake_hub(monkeypatch, hub_rows, [])
    out = tmp_path / "eval-offline"
    assert prefetch_main([str(out), "--max-docs", "c4=3"]) == 0
    assert "fineweb_edu: 5 documents from hub:HuggingFaceFW/fineweb-edu" in capsys.readouterr().out
    hub_docs, hub_entries = load_corpora(list(CORPORA), "hub", max_docs={"c4": 3})
    monkeypatch.setattr(datasets, "load_dataset", None)  # offline: nothing may reach the Hub now
    docs, entries = load_corpora(list(CORPORA), "local", str(out))
    for name in CORPORA:
        assert [(d.id, d.text, d.count_text) for d in docs[name]] == [
            (d.id, d.text, d.count_text) for d in hub_docs[name]], name
        assert entries[name]["sha256"] == hub_entries[name]["sha256"]
    recorded = json.loads((out / "prefetch.json").read_text())["corpora"]
    assert recorded["c4"]["num_documents"] == 3 and recorded["c4"]["documents_sha256"] == hub_entries["c4"]["sha256"]
    c4_file = out / recorded["c4"]["file"]
    c4_file.write_bytes(c4_file.read_bytes()[:-3])
    with pytest.raises(CorpusError, match="is not the file python -m eval.prefetch wrote"):
        load_corpora(["c4"], "local", str(out))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(datasets, "load_dataset", interrupted)
    assert prefetch_main([str(out)]) == 130
    assert "left as it was" in capsys.readouterr().err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before and not list(tmp_path.glob(".tmp-*"))
    assert prefetch_main([str(c4_file), "--corpora", "c4"]) == 2
    assert prefetch_main([str(out), "--corpora", "enwik8"]) == 2
    assert capsys.readouterr().err.count("error: ") == 2
    # a folder that is not an earlier prefetch is never replaced (it emptied data/eval, or the current folder)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert prefetch_main([str(mine), "--corpora", "c4"]) == 2
    assert "holds no prefetch.json" in capsys.readouterr().err and (mine / "notes.txt").read_text() == "mine"
    # an earlier prefetch keeps its other corpora when one is fetched again
    _fake_hub(monkeypatch, hub_rows, [])
    assert prefetch_main([str(out), "--corpora", "c4", "--max-docs", "2"]) == 0
    again = json.loads((out / "prefetch.json").read_text())["corpora"]
    assert again["c4"]["num_documents"] == 2 and again["fineweb_edu"] == recorded["fineweb_edu"]
    load_corpora(list(CORPORA), "local", str(out))  # every file is the one its record names
