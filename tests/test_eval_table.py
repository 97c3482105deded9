"""eval.table: per-corpus perplexity and Rel. (%) = mean of ppl(run)/ppl(vanilla)*100; missing stays missing."""

import json
import math

import pytest

from eval.table import main
from neox_dar.evaluation.corpora import CORPORA
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
    capsys.readouterr()
    bad.write_bytes(b"{\xff}")  # a binary file: the error named no file
    assert main([run, "--baseline", str(bad)]) == 2
    assert capsys.readouterr().err == f"error: {bad} is not UTF-8 text (byte 0xff at offset 1): is it the file you " \
                                      "mean?\n"


def test_bits_per_byte_rel_is_the_byte_perplexity_ratio(tmp_path, capsys):
    """With --metric bits_per_byte, Rel. (%) is the ratio of byte perplexities, as the report computes it (it was the
    ratio of bits per byte, a different number for the same files)."""
    def bpb(nll_by_corpus):  # 4000 bytes per corpus
        return {"checkpoint": "x", "attention_type": "dar", "corpora": {
            c: {"bits_per_byte": nll / (4000 * math.log(2)), "byte_perplexity": math.exp(nll / 4000),
                "token_perplexity": 1.0, "manifest_sha256": "m"} for c, nll in nll_by_corpus.items()}}
    run = dict(zip(CORPORA, (2900.0, 3600.0, 3700.0)))
    base = dict(zip(CORPORA, (3000.0, 3500.0, 4000.0)))
    expected = sum(math.exp((run[c] - base[c]) / 4000) for c in CORPORA) / 3 * 100
    assert main([write(tmp_path, "r.json", bpb(run)), "--baseline", write(tmp_path, "b.json", bpb(base)),
                 "--metric", "bits_per_byte", "--names", "R", "--format", "markdown"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("| R "))
    assert line.endswith(f"| {expected:.2f} |"), line


def test_a_result_scored_otherwise_is_flagged(tmp_path, capsys):
    """A run scored with another window, stride, prefix token, dtype, tokenizer or at another training step than the
    baseline is warned on stderr (each was a Rel. without a word); a result without the key (an older file) is
    not."""
    ppl = {"fineweb_edu": 20.0, "c4": 40.0, "wikitext103": 50.0}
    settings = {"step": 800, "max_length": 2048, "stride": 2048, "prefix_token": 0, "dtype": "float32",
                "tokenizer_sha256": "t"}
    base = write(tmp_path, "v.json", {**results(ppl), **settings})
    same = write(tmp_path, "same.json", {**results(ppl), **settings})
    old = write(tmp_path, "old.json", results(ppl))
    assert main([same, old, "--baseline", base, "--names", "A,B"]) == 0
    assert capsys.readouterr().err == ""
    for key, value, what in [("step", 100, "training step 100"), ("max_length", 512, "window (max_length) 512"),
                             ("stride", 256, "stride 256"), ("prefix_token", 7, "prefix token id 7"),
                             ("dtype", "bfloat16", "dtype bfloat16"),
                             ("tokenizer_sha256", "u", "tokenizer u")]:
        run = write(tmp_path, f"{key}.json", {**results(ppl), **settings, key: value})
        assert main([run, "--baseline", base, "--names", "A"]) == 0
        err = capsys.readouterr().err
        assert err == (f"warning: A: scored with {what}, the baseline with {settings[key]}: its Rel. compares more "
                       "than the models\n"), err


def test_missing_or_non_finite_values_print_missing(tmp_path, capsys):
    """A NaN perplexity, a null one or a metric the file lacks (an older version's) is '--' in its cell and in Rel.
    (they printed nan, or were a TypeError / KeyError traceback); a corpus entry that is not an object is one line."""
    base = write(tmp_path, "v.json", results({"fineweb_edu": 20.0, "c4": 40.0, "wikitext103": 50.0}))
    nan = results({"fineweb_edu": float("nan"), "c4": 40.0, "wikitext103": 50.0})
    null = results({"fineweb_edu": 20.0, "c4": 40.0, "wikitext103": 50.0})
    null["corpora"]["c4"]["token_perplexity"] = None
    older = results({"fineweb_edu": 20.0, "c4": 40.0, "wikitext103": 50.0})
    del older["corpora"]["wikitext103"]["byte_perplexity"]
    assert main([write(tmp_path, "n.json", nan), write(tmp_path, "z.json", null), write(tmp_path, "o.json", older),
                 "--baseline", base, "--names", "N,Z,O", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| N | -- | 40.00 | 50.00 | -- |" in out and "| Z | 20.00 | -- | 50.00 | -- |" in out
    assert main([write(tmp_path, "o2.json", older), "--baseline", base, "--names", "O",
                 "--metric", "byte_perplexity", "--format", "markdown"]) == 0
    assert "| O | 1.50 | 1.50 | -- | -- |" in capsys.readouterr().out
    broken = results({"fineweb_edu": 20.0})
    broken["corpora"]["c4"] = "12.5"
    assert main([write(tmp_path, "b.json", broken), "--baseline", base]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "corpus 'c4' is '12.5', not an object of metrics" in err, err


def test_corpora_outside_the_table_are_named(tmp_path, capsys):
    """Results of other corpora (enwik8) gave a table of '--' with exit 0 and no word; a note names them and the
    command that shows them."""
    base = write(tmp_path, "v.json", results({"enwik8": 3.0}))
    run = write(tmp_path, "r.json", results({"enwik8": 3.1, "c4": 40.0}))
    assert main([run, "--baseline", base, "--names", "R", "--format", "markdown"]) == 0
    captured = capsys.readouterr()
    assert "| R | -- | 40.00 | -- | -- |" in captured.out
    assert captured.err == ("note: enwik8 is not among this table's corpora (fineweb_edu, c4, wikitext103): "
                            "python -m neox_dar.report shows every corpus of a sweep or a folder of runs\n")
