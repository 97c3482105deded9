"""DimPO's key-pair selections (Appendix C, Fig. 4: neox_dar.dimpo.pairs) against per-instance rankings, the
training step on them, ``dimpo fit --pairs`` and ``dimpo study``."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_dimpo import manual_split, run_cli, trained  # noqa: F401 (trained: the byte-level model fixture)

from neox_dar.dimpo.losses import dimpo_loss
from neox_dar.dimpo.methods import PAPER, _dimpo_step
from neox_dar.dimpo.pairs import PairSelection, key_pairs


def _ranking(split, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Instance i's causal key positions by decreasing original weight, and its original logits."""
    d, h, p = int(split.doc[i]), int(split.head[i]), int(split.pos[i])
    logits = split.k[d, h // split.group, :p + 1] @ split.q[i] / math.sqrt(split.head_dim)
    return logits.argsort(descending=True, stable=True), logits


@pytest.mark.parametrize("text", ["top-bottom", "distance:1", "distance:5", "distinct:1", "distinct:3", "all:2",
                                  "all:4"])
def test_each_selection_is_its_definition_on_every_instance(text):
    split = manual_split(group=2)
    sel = PairSelection.parse(text)
    pairs = key_pairs(split, sel, block=5, seed=3)
    for i in range(len(split)):
        order, logits = _ranking(split, i)
        m = len(order)
        rank = {int(p): r for r, p in enumerate(order)}
        ok = pairs.valid[i]
        c, r = pairs.chosen[i][ok].tolist(), pairs.rejected[i][ok].tolist()
        if sel.kind in ("top-bottom", "distance"):
            gap = m - 1 if sel.kind == "top-bottom" else min(sel.k, m - 1)
            assert (c, r) == ([int(order[0])], [int(order[gap])])
        elif sel.kind == "distinct":
            assert len(c) == min(sel.k, m // 2) and len(set(c + r)) == 2 * len(c)
            assert all(rank[x] < m // 2 for x in c) and all(rank[x] >= m - m // 2 for x in r)
        else:
            keys = pairs.subset[i][pairs.subset_valid[i]].tolist()
            n = min(sel.k, m)
            assert len(set(keys)) == n and max(keys) < m and len(c) == n * (n - 1) // 2
            assert {frozenset(x) for x in zip(c, r)} == {frozenset((a, b)) for a in keys for b in keys if a < b}
            assert all(logits[a] >= logits[b] for a, b in zip(c, r))
    again = key_pairs(split, sel, block=7, seed=3)  # the same draw whatever the block
    assert torch.equal(again.chosen, pairs.chosen) and torch.equal(again.valid, pairs.valid)


def test_dimpo_on_all_k_is_its_loss_over_the_sampled_keys():
    split = manual_split(group=1)
    pairs = key_pairs(split, PairSelection("all", 3), block=4, seed=1)
    w = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
    rows = torch.tensor([30, 7, 51])
    expected = []
    for i in rows.tolist():
        keys = split.k[int(split.doc[i]), int(split.head[i])][pairs.subset[i][pairs.subset_valid[i]]]
        psi = torch.softmax(keys @ split.q[i] / math.sqrt(6), 0)[None]
        z = ((keys @ w.T) @ (w @ split.q[i]) / math.sqrt(3))[None]
        expected.append(dimpo_loss(psi, z, torch.ones_like(psi, dtype=torch.bool), **PAPER["dimpo"].loss))
    got = _dimpo_step(w, split, rows, PAPER["dimpo"], pairs)
    assert float(got) == pytest.approx(float(torch.stack(expected).mean()), rel=1e-5)


def test_bad_selection_is_one_line(trained, tmp_path, capsys):  # noqa: F811
    ckpt, data = trained
    for bad in ("all:1", "near:3", "distance:x", "top-bottom:2"):
        code, _, err = run_cli(["fit", ckpt, "--train", data, "--out", tmp_path, "--pairs", bad], capsys)
        assert code == 2 and len(err.splitlines()) == 1 and "--pairs takes top-bottom" in err, err
    code, _, err = run_cli(["study", ckpt, "--train", data, "--out", tmp_path, "--methods", "pca"], capsys)
    assert code == 2 and "none of --methods (pca) is studied" in err


def test_fit_with_pairs_then_study_draws_fig4(trained, tmp_path, capsys):  # noqa: F811
    ckpt, data = trained
    small = ["--seq-len", "32", "--train-docs", "1", "--valid-docs", "1", "--test-docs", "1", "--dims", "4",
             "--device", "cpu"]
    code, out, _ = run_cli(["fit", ckpt, "--train", data, "--out", tmp_path / "fit", "--methods", "simpo",
                            "--pairs", "distinct:2"] + small, capsys)
    assert code == 0 and "key selection distinct:2" in out
    assert json.loads((tmp_path / "fit" / "results.json").read_text())["settings"]["pairs"] == "distinct:2"
    code, _, _ = run_cli(["study", ckpt, "--train", data, "--out", tmp_path / "study", "--methods", "orpo,dimpo",
                          "--panels", "all,distance", "--ks", "2,4"] + small, capsys)
    assert code == 0 and (tmp_path / "study" / "fig4.png").stat().st_size > 0
    study = json.loads((tmp_path / "study" / "study.json").read_text())
    assert sorted(study) == ["all", "distance"] and sorted(study["all"]) == ["dimpo", "orpo"]
    assert sorted(study["distance"]) == ["orpo"] and sorted(study["distance"]["orpo"]) == ["2", "4"]
    assert all(v["kl"] > 0 and v["mse"] > 0 for m in study.values() for ks in m.values() for v in ks.values())


def test_docs_fig4_tables_are_the_committed_results():
    from pathlib import Path

    from neox_dar.dimpo.study import tables
    from neox_dar.report.tables import to_markdown

    root = Path(__file__).resolve().parents[1]
    study = json.loads((root / "bench" / "results" / "dimpo_fig4_small.json").read_text())["study"]
    docs = (root / "docs" / "dimpo.md").read_text()
    shown = docs.split("<!-- dimpo-fig4 -->\n", 1)[1].split("\n<!-- /dimpo-fig4 -->", 1)[0]
    assert shown == "\n".join(to_markdown(t).strip() for t in tables(study))
    orpo = study["distance"]["orpo"]
    assert min(orpo, key=lambda k: orpo[k]["kl"]) == "8" and max(orpo, key=lambda k: orpo[k]["kl"]) == "127"
    assert round(orpo["8"]["kl"], 3) == 0.731 and round(orpo["127"]["kl"], 3) == 1.006
    assert round(study["all"]["orpo"]["2"]["kl"], 3) == 0.810 and round(study["all"]["orpo"]["16"]["kl"], 3) == 0.684
    distinct = study["distinct"]["orpo"]
    assert round(distinct["1"]["kl"], 3) == 0.772 and round(distinct["64"]["kl"], 3) == 0.685
    dimpo = study["all"]["dimpo"]
    assert min(dimpo, key=lambda k: dimpo[k]["kl"]) == "8" and dimpo["16"]["mse"] < dimpo["8"]["mse"]


def test_a_fit_from_before_pairs_resumes_and_another_selection_is_refused(trained, tmp_path, one_thread):  # noqa: F811
    from test_dimpo import fit, splits

    from neox_dar.dimpo import DimPOError
    from neox_dar.dimpo.fit import fit_settings, run_fit
    from neox_dar.evaluation.loading import load_for_eval

    fit(trained, tmp_path, ["random", "pca"], [4])
    path = tmp_path / "results.json"
    old = json.loads(path.read_text())
    del old["settings"]["pairs"], old["layers"]["1"]  # as written before --pairs, stopped after layer 0
    old["complete"] = False
    path.write_text(json.dumps(old))
    assert fit(trained, tmp_path, ["random", "pca"], [4])["complete"]
    loaded, docs = load_for_eval(trained[0]), splits(trained[1])
    settings = fit_settings(loaded.info, loaded.cfg, docs, ["random", "pca"], [4], {}, 1, None, 0,
                            PairSelection("distinct", 2))
    with pytest.raises(DimPOError, match=r"other settings \(pairs differ\)"):
        run_fit(loaded.model, settings, docs, {}, tmp_path)
