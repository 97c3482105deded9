"""DimPO end to end on a small trained model: documents and streamed instances (Sec. 3.3), evaluation, the fit of
Table 1 (resumable), and the ordering of the paper's Table 1 (DimPO < PCA < random KL at d' = d_h / 4).

The model is bench/dimpo_small.py's, trained here once per module (200 steps, ~10 s): a byte-level 2-layer GPT-NeoX
(vocabulary 256) on the shipped C4 sample, so its attention is that of a model of real text; its documents are C4
documents as bytes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from builders import config
from session_cache import built_once
from neox_dar.saved_model import save_weights
from neox_dar.data import IndexedDatasetWriter
from neox_dar.dimpo import DimPOError, LayerSplit, capture_split, evaluate, layer_qkv, select_documents
from neox_dar.dimpo.__main__ import main
from neox_dar.dimpo.fit import fit_settings, load_results, projection_path, run_fit
from neox_dar.dimpo.methods import PAPER
from neox_dar.dimpo.pairs import PairSelection, gather_keys, key_pairs
from neox_dar.dimpo.projections import load_projections
from neox_dar.dimpo.tables import table1
from neox_dar.evaluation.loading import load_for_eval
from neox_dar.model import build_model

SEQ = 128
BENCH = Path(__file__).resolve().parents[1] / "bench" / "dimpo_small.py"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(checkpoint dir, dataset prefix) of bench/dimpo_small.py's byte-level model (200 Adam steps, ~10 s), trained
    once for the session (test_dimpo_pairs.py uses it too)."""
    spec = importlib.util.spec_from_file_location("dimpo_small", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def build(folder):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            ckpt, data = bench.train_byte_model(folder, seq=SEQ)
            return str(ckpt), data
        finally:
            torch.set_num_threads(threads)

    ckpt, data = built_once(tmp_path_factory, "dimpo_model", build)
    return Path(ckpt), data


def splits(prefix, n=(4, 2, 2), seq=SEQ):
    return select_documents({s: prefix for s in ("train", "valid", "test")}, dict(zip(("train", "valid", "test"), n)),
                            seq, 256)


# ---- documents


def test_documents_are_disjoint_whole_and_long_enough(tmp_path):
    writer = IndexedDatasetWriter(tmp_path / "d", np.uint16)
    lengths = [50, 10, 64, 80, 5, 70, 90, 100]
    for i, n in enumerate(lengths):
        writer.add_document(np.full(n, i))
    writer.finalize()
    docs = select_documents({s: str(tmp_path / "d") for s in ("train", "valid", "test")},
                            {"train": 2, "valid": 1, "test": 2}, 50, 256)
    assert [docs[s].ids for s in ("train", "valid", "test")] == [[0, 2], [3], [5, 6]]
    for d in docs.values():  # each row is the first 50 tokens of one document, nothing concatenated
        assert d.tokens.shape[1] == 50 and all(bool((row == i).all()) for row, i in zip(d.tokens, d.ids))
    with pytest.raises(DimPOError, match=r"has 6 documents of at least 50 tokens \(5 taken by the splits before "
                                         r"it\); the test split needs 2"):
        select_documents({s: str(tmp_path / "d") for s in ("train", "valid", "test")},
                         {"train": 2, "valid": 3, "test": 2}, 50, 256)
    with pytest.raises(DimPOError, match="token id 7, beyond the model's vocabulary of 7"):
        select_documents({s: str(tmp_path / "d") for s in ("train", "valid", "test")},
                         {"train": 1, "valid": 1, "test": 4}, 50, 7)


# ---- one layer's instances


def test_layer_capture_equals_a_full_forward_and_stops_there(trained):
    model = load_for_eval(trained[0]).model
    tokens = splits(trained[1])["train"].tokens[:2]
    full = []
    hooks = [m.register_forward_hook(lambda mod, args, out: full.append(mod.split_heads(*args)))
             for m in model.attention_modules()]
    model(tokens)
    for h in hooks:
        h.remove()
    reached = []
    probe = model.embed_out.register_forward_hook(lambda *a: reached.append(True))
    for layer, expected in enumerate(full):
        got = layer_qkv(model, layer, tokens)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
    probe.remove()
    assert reached == []  # the capture never ran the output layer


def test_instances_are_every_h_th_query_offset_by_head(trained):
    model = load_for_eval(trained[0]).model
    docs = splits(trained[1])["train"]
    train = capture_split(model, 1, docs, every_query=False, keep_values=False, desc="t")
    test = capture_split(model, 1, docs, every_query=True, keep_values=True, desc="t")
    H, T = 4, SEQ
    assert len(train) == len(docs.ids) * T and len(test) == len(docs.ids) * H * T  # the paper's 40,960 = 10 x 4096
    for h in range(H):
        sel = (train.doc == 1) & (train.head == h)
        assert train.pos[sel].tolist() == list(range(h, T, H))
    assert train.v is None and train.k.shape == (4, H, T, 16) and test.v.shape == (4, H, T, 16)
    q, k, _ = layer_qkv(model, 1, docs.tokens[2:3])
    row = int(((test.doc == 2) & (test.head == 3) & (test.pos == 77)).nonzero())
    assert torch.equal(test.q[row], q[0, 3, 77]) and torch.equal(test.k[2], k[0])


def manual_split(group: int, seed: int = 0) -> LayerSplit:
    """Random vectors for 2 documents, 4 query heads sharing 4 / group key/value heads, every query."""
    g = torch.Generator().manual_seed(seed)
    N, H, T, D = 2, 4, 13, 6
    q = torch.randn(N, H, T, D, generator=g) * 2
    k, v = torch.randn(N, H // group, T, D, generator=g) * 2, torch.randn(N, H // group, T, D, generator=g)
    doc, head, pos = (t.flatten() for t in torch.meshgrid(torch.arange(N), torch.arange(H), torch.arange(T),
                                                          indexing="ij"))
    return LayerSplit(q[doc, head, pos], doc, head, pos, k, v, group)


@pytest.mark.parametrize("group", [1, 2, 4])
def test_blocks_pairs_and_evaluation_against_whole_attention_matrices(group):
    """Queries of head h read key/value head h // group (GQA); blocks of 5 queries give what whole causal
    attention matrices give; chosen/rejected are the highest/lowest-weighted causal keys."""
    split = manual_split(group)
    w = torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
    got = evaluate(split, {"w": w}, block=5)["w"]
    pairs = key_pairs(split, PairSelection(), block=5, seed=0)
    chosen, rejected = (split.k[split.doc, split.kv_head(torch.arange(len(split))), x[:, 0]]
                        for x in (pairs.chosen, pairs.rejected))
    kl = se = 0.0
    for i in range(len(split)):
        d, h, p = int(split.doc[i]), int(split.head[i]), int(split.pos[i])
        keys, vals = split.k[d, h // group, :p + 1].double(), split.v[d, h // group, :p + 1].double()
        q = split.q[i].double()
        orig = torch.softmax(keys @ q / math.sqrt(6), 0)
        proj = torch.softmax((keys @ w.double().T) @ (w.double() @ q) / math.sqrt(3), 0)
        kl += float((orig * (orig.log() - proj.log())).sum())
        se += float(((orig - proj) @ vals).pow(2).sum())
        assert torch.equal(chosen[i], split.k[d, h // group, int(orig.argmax())])
        assert torch.equal(rejected[i], split.k[d, h // group, int(orig.argmin())])
    assert got["kl"] == pytest.approx(kl / len(split), rel=1e-4)
    assert got["mse"] == pytest.approx(se / len(split), rel=1e-4)


def test_training_steps_see_each_instance_with_its_own_causal_keys():
    """A DimPO batch of instances from several documents and heads (padded to the longest list) and a pairwise
    batch give the mean of the losses computed one instance at a time from whole key lists (GQA: 2 heads per
    key/value head)."""
    from neox_dar.dimpo.losses import dimpo_loss, simpo_loss
    from neox_dar.dimpo.methods import _dimpo_step, _pair_step

    split = manual_split(group=2)
    w = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
    rows = torch.tensor([5, 40, 77, 101, 3])
    hyper = PAPER["dimpo"]
    expected, pairs = [], []
    for i in rows.tolist():
        d, h, p = int(split.doc[i]), int(split.head[i]), int(split.pos[i])
        keys = split.k[d, h // 2, :p + 1]
        psi = torch.softmax(keys @ split.q[i] / math.sqrt(6), 0)[None]
        z = ((keys @ w.T) @ (w @ split.q[i]) / math.sqrt(3))[None]
        expected.append(dimpo_loss(psi, z, torch.ones_like(psi, dtype=torch.bool), **hyper.loss))
        pairs.append((keys[int(psi.argmax())], keys[int(psi.argmin())]))
    got = _dimpo_step(w, split, rows, hyper, key_pairs(split, PairSelection(), block=4, seed=0))
    assert float(got) == pytest.approx(float(torch.stack(expected).mean()), rel=1e-5)
    kc, kr = (torch.stack(x) for x in zip(*pairs))
    selected = key_pairs(split, PairSelection(), block=4, seed=0)
    assert torch.equal(gather_keys(split, rows, selected.chosen[rows])[:, 0], kc)
    assert torch.equal(gather_keys(split, rows, selected.rejected[rows])[:, 0], kr)
    fq, fc, fr = split.q[rows] @ w.T, kc @ w.T, kr @ w.T
    want = simpo_loss((fq * fc).sum(-1) / math.sqrt(3), (fq * fr).sum(-1) / math.sqrt(3), **PAPER["simpo"].loss)
    got = _pair_step("simpo", w, split, rows, selected, PAPER["simpo"])
    assert float(got) == pytest.approx(float(want), rel=1e-6)


def test_a_diverged_or_empty_fit_is_an_error_not_the_starting_projection(monkeypatch):
    """A non-finite loss, or no training step at all, is a one-line DimPOError naming the layer (before: the
    untrained starting W was returned, saved and reported as the method's)."""
    from neox_dar.dimpo import methods

    split, hyper = manual_split(group=1), PAPER["dimpo"]
    pairs = key_pairs(split, PairSelection(), block=8, seed=0)

    def fit(step):
        monkeypatch.setattr(methods, "_dimpo_step", step)
        return methods.train_projection("dimpo", hyper, split, split, 3, 2, None, torch.Generator().manual_seed(0),
                                        8, "layer 0", pairs)

    w, log = fit(methods._dimpo_step)
    assert log["best_epoch"] is not None and w.shape == (3, 6)
    with pytest.raises(DimPOError, match=r"^layer 0: dimpo's loss is nan at step 1: the fit diverged"):
        fit(lambda w, *_: (w * float("nan")).sum())
    with pytest.raises(DimPOError, match="^layer 0: no training instance has a pair of keys"):
        fit(lambda *_: None)


def test_identity_projection_reproduces_attention(trained):
    model = load_for_eval(trained[0]).model
    test = capture_split(model, 0, splits(trained[1])["test"], every_query=True, keep_values=True, desc="t")
    got = evaluate(test, {"eye": torch.eye(16)}, block=64)["eye"]
    assert got["kl"] < 1e-6 and got["mse"] < 1e-9


# ---- Table 1


def fit(trained, out, methods, dims, epochs=1, lr_scale=1.0, max_steps=None):
    loaded = load_for_eval(trained[0])
    docs = splits(trained[1])
    hyper = {m: PAPER[m] for m in methods if m in PAPER}
    hyper = {m: dataclasses.replace(h, lr=h.lr * lr_scale) for m, h in hyper.items()}
    settings = fit_settings(loaded.info, loaded.cfg, docs, methods, dims, hyper, epochs, max_steps, 0)
    return run_fit(loaded.model, settings, docs, hyper, out, block=256)


@pytest.fixture(scope="module")
def table1_fit(trained, tmp_path_factory):
    """Random, PCA and DimPO at d' = d_h / 4 = 4 on both layers (``(out, results)``). The 512 training instances
    per layer are 80 times fewer than the paper's 40,960, so DimPO runs 8 epochs at 10x Table 6's learning rate:
    the paper's learning rate x steps (1e-4 x 40,960 = 4.1; here 1e-3 x 8 x 512 = 4.1)."""
    out = tmp_path_factory.mktemp("table1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return out, fit(trained, out, ["random", "pca", "dimpo"], [4], epochs=8, lr_scale=10.0)
    finally:
        torch.set_num_threads(threads)


def test_table1_ordering_dimpo_below_pca_below_random(table1_fit):
    """The ordering of the paper's Table 1 (mean test KL over the layers)."""
    out, results = table1_fit
    kl = {m: np.mean([results["layers"][str(l)]["results"][m]["4"]["test"]["kl"] for l in range(2)])
          for m in ("random", "pca", "dimpo")}
    assert kl["dimpo"] < kl["pca"] < kl["random"], kl
    dimpo = results["layers"]["1"]["results"]["dimpo"]["4"]["fit"]
    assert dimpo["steps"] == 8 * 4 * SEQ and len(dimpo["epochs"]) == 8
    assert results["complete"] and results["layers"]["0"]["instances"] == {"train": 512, "valid": 256, "test": 1024}
    proj = load_projections(projection_path(out, "dimpo", 4))
    assert proj.method == "dimpo" and proj.d_proj == 4 and sorted(proj.weights) == [0, 1]
    assert proj.shape == {"num_layers": 2, "num_heads": 4, "num_kv_heads": 4, "head_dim": 16}
    table = table1(str(out))
    assert [r[0] for r in table.rows] == ["Rand", "PCA", "DimPO"] and table.columns == ["Method", "4 KL", "4 MSE"]
    assert table.rows[2][1] == f"{kl['dimpo']:.2f}"


def test_a_stopped_fit_resumes_at_its_first_unfinished_layer(trained, tmp_path, monkeypatch, one_thread):
    import neox_dar.dimpo.fit as fit_module

    real = fit_module.evaluate
    calls = []

    def failing(split, projections, block):
        calls.append(len(split))
        if len(calls) == 3:  # layer 0: valid, test; layer 1: valid -> stop
            raise KeyboardInterrupt
        return real(split, projections, block)

    monkeypatch.setattr(fit_module, "evaluate", failing)
    with pytest.raises(KeyboardInterrupt):
        fit(trained, tmp_path, ["random", "pca"], [4, 2])
    saved = load_results(tmp_path)
    assert list(saved["layers"]) == ["0"] and not saved["complete"]
    assert sorted(load_projections(projection_path(tmp_path, "pca", 2)).weights) == [0]
    monkeypatch.setattr(fit_module, "evaluate", real)
    done = fit(trained, tmp_path, ["random", "pca"], [4, 2])
    assert done["complete"] and done["layers"]["0"] == saved["layers"]["0"]
    assert sorted(load_projections(projection_path(tmp_path, "pca", 2)).weights) == [0, 1]
    with pytest.raises(DimPOError, match="holds a fit with other settings \\(dims differ\\)"):
        fit(trained, tmp_path, ["random", "pca"], [4])


# ---- command line


def run_cli(args, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_errors_are_one_line(trained, tmp_path, capsys):
    ckpt, data = trained
    base = ["fit", ckpt, "--train", data, "--out", tmp_path / "o", "--seq-len", SEQ, "--methods", "pca"]
    cases = [
        (["--dims", "32"], "error: d' must be in 1..16 (the head dim), got 32"),
        (["--seq-len", "100000"], "exceeds the model's max_position_embeddings"),
        (["--beta", "2"], "error: --beta applies to none of the chosen methods (pca)"),
        (["--lr", "1", "--lr-scale", "2"], "error: give --lr or --lr-scale, not both"),
        (["--lr", "-1"], "error: --lr must be a finite number > 0, got -1.0"),  # Adam's traceback before
        (["--beta", "nan"], "error: --beta must be a finite number > 0, got nan"),  # fitted nothing before
        (["--beta", "0"], "error: --beta must be a finite number > 0, got 0.0"),
        (["--gamma", "-3"], "error: --gamma must be a finite number >= 0, got -3.0"),
        (["--margin", "-5"], "error: --margin must be a finite number >= 0, got -5.0"),
        (["--device", "gpu"], "error: --device 'gpu' is not a device"),  # torch's RuntimeError traceback before
    ]
    for extra, message in cases:
        code, _, err = run_cli(base + extra, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
        assert message in err
    code, _, err = run_cli(["fit", ckpt, "--train", data, "--out", tmp_path / "o", "--seq-len", "2000",
                            "--train-docs", "190"], capsys)
    assert code == 2 and "documents of at least 2000 tokens; the train split needs 190 (documents" in err
    assert len(err.splitlines()) == 1
    (tmp_path / "a-file").write_text("x")  # --out a file: a FileExistsError traceback once the data was read
    for argv in (["fit", ckpt, "--train", data, "--seq-len", SEQ], ["apply", ckpt, "--projections", "p", "--layers",
                                                                     "1"]):
        code, _, err = run_cli([*argv, "--out", tmp_path / "a-file"], capsys)
        assert code == 2 and err == f"error: --out {tmp_path / 'a-file'} is a file: name a folder to write\n", err
    code, _, err = run_cli(["table", tmp_path / "nothing"], capsys)
    assert code == 2 and err.strip().endswith("holds neither results.json (written by fit) nor grid.json (written by "
                                              "tasks)")
    swa = tmp_path / "swa"
    save_weights(build_model(config(num_layers=2, hidden_size=64, num_attention_heads=4, attention_type="swa",
                                    window_size=8).model), config(num_layers=2, hidden_size=64, num_attention_heads=4,
                                                                  attention_type="swa", window_size=8).model, swa)
    code, _, err = run_cli(["fit", swa, "--train", data, "--out", tmp_path / "o", "--seq-len", SEQ], capsys)
    assert code == 2 and err.strip() == "error: layer 0 uses 'swa' attention; DimPO projects vanilla softmax attention"


def test_fit_warns_of_data_tokenized_with_another_tokenizer(trained, tmp_path, capsys):
    """Data whose manifest names another tokenizer than the checkpoint's (token ids that mean other words to the
    model): a warning line, as train.py and data.check give (the fit ran silently before)."""
    import json
    import shutil

    trained_ckpt, data = trained
    from tokenizers import Tokenizer, models

    ckpt = tmp_path / "ckpt"  # the model with a tokenizer beside its weights (bench/dimpo_small.py's has none)
    shutil.copytree(trained_ckpt, ckpt)
    Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(str(ckpt / "tokenizer.json"))
    other = tmp_path / "other"
    for suffix in (".bin", ".idx"):
        shutil.copy(data + suffix, f"{other}{suffix}")
    Path(f"{other}.manifest.json").write_text(json.dumps({"tokenizer": {"path": "another/tokenizer.json",
                                                                         "sha256": "0" * 64}}))
    base = ["fit", ckpt, "--out", tmp_path / "o", "--seq-len", SEQ, "--methods", "pca", "--dims", "4",
            "--train-docs", "1", "--valid-docs", "1", "--test-docs", "1"]
    code, _, err = run_cli([*base, "--train", other], capsys)
    assert code == 0 and err.count("warning: ") == 1, err
    assert f"warning: {other} was tokenized with another/tokenizer.json (sha256 000000000000), not the model's " \
           "tokenizer" in err
    code, _, err = run_cli([*base, "--train", data, "--out", tmp_path / "o2"], capsys)
    assert code == 0 and "warning" not in err, err


def test_fit_command_then_python_m_table(trained, table1_fit, tmp_path, capsys):
    ckpt, data = trained
    code, out, _ = run_cli(["fit", ckpt, "--train", data, "--out", tmp_path, "--seq-len", "64", "--train-docs", "2",
                            "--valid-docs", "1", "--test-docs", "1", "--methods", "random,pca", "--dims", "8,2",
                            "--device", "cpu"], capsys)
    assert code == 0 and "| PCA |" in out and load_results(tmp_path)["complete"]
    r = subprocess.run([sys.executable, "-m", "neox_dar.dimpo", "table", str(table1_fit[0]), "--layer", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "| Method | 4 KL | 4 MSE |" in r.stdout and r"\begin{tabular}{lrr}" in r.stdout and "layer 1" in r.stdout
