"""eval.doc_lengths: token counts per document, the summary fractions, and the CDF PNG."""

import json

import numpy as np

from eval.doc_lengths import document_lengths, length_summary, main
from neox_dar.evaluation.corpora import load_local
from neox_dar.tokenizer import load_tokenizer


def test_lengths_and_summary():
    docs = load_local("c4")[:5]
    tok = load_tokenizer()
    lengths = document_lengths([d.text for d in docs], tok)
    assert lengths.tolist() == [len(tok.encode(d.text, add_special_tokens=False).ids) for d in docs]
    rng = np.random.default_rng(0)
    values = rng.integers(1, 5000, size=400)
    s = length_summary(values, 128, 2048)
    assert s["documents"] == 400
    assert s["frac_le_window"] == np.mean(values <= 128) and s["frac_le_seq_length"] == np.mean(values <= 2048)
    assert s["quantiles"]["p50"] == np.median(values)


def test_cli_writes_png_and_summary(tmp_path, capsys):
    out, summary = tmp_path / "fig" / "cdf.png", tmp_path / "summary.json"
    assert main(["--corpora", "c4,fineweb_edu", "--max-docs", "20", "--window", "64", "--seq-length", "512",
                 "--out", str(out), "--json", str(summary)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(summary.read_text())
    assert set(data) == {"c4", "fineweb_edu"} and data["c4"]["documents"] == 20
    assert "% <= w=64" in capsys.readouterr().out
    assert main(["--corpora", "c4", "--data-dir", str(tmp_path / "none"), "--out", str(out)]) == 2
    capsys.readouterr()
    # checked before any corpus is read: a folder as --out (written as FOLDER.png beside it, "wrote FOLDER" said), a
    # name matplotlib cannot write (its ValueError traceback), a folder as --json (a traceback after the work), w < 1
    for bad, said in ((["--out", str(tmp_path)], f"--out {tmp_path}: name an image file ending in .png"),
                      (["--out", str(tmp_path / "cdf.txt")], "name an image file ending in .png"),
                      (["--out", str(out), "--json", str(tmp_path)], f"--json {tmp_path} is a directory"),
                      (["--out", str(out), "--window", "0"], "--window must be >= 1, got 0")):
        assert main(["--corpora", "c4", *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and said in err and err.count("\n") == 1, err
    assert not (tmp_path.parent / f"{tmp_path.name}.png").exists()
