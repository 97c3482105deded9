"""eval.perplexity: per-document log-likelihoods equal lm-eval's HFLM.loglikelihood_rolling on a tiny random
vanilla model exported to Hugging Face; batching and strides never change which tokens are scored."""

import json
import math
from pathlib import Path

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from transformers import GPTNeoXForCausalLM, PreTrainedTokenizerFast

from eval.perplexity import main
from neox_dar.hf import to_hf
from neox_dar.evaluation.corpora import load_local
from neox_dar.evaluation.loading import load_for_eval
from neox_dar.evaluation.metrics import corpus_metrics
from neox_dar.evaluation.perplexity import score_corpus
from neox_dar.evaluation.scoring import score_documents
from neox_dar.tokenizer import DEFAULT_TOKENIZER, load_tokenizer, prefix_token_id

from builders import saved_run

SEQ = 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    model, cfg = saved_run(root)
    return root, model, cfg


@pytest.fixture(scope="module")
def docs():
    """Six short real documents (about 50-250 tokens: several windows each, cheap on CPU)."""
    short = [d for d in load_local("c4") + load_local("fineweb_edu") if 250 <= len(d.text) <= 1000]
    return short[:4] + short[-2:]


def test_nll_equals_lm_eval_hflm(tiny, docs, tmp_path):
    root, model, cfg = tiny
    hf_dir = to_hf(model, cfg, tmp_path / "hf")
    hf_model = GPTNeoXForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(DEFAULT_TOKENIZER), eos_token="<|endoftext|>",
                                     bos_token="<|endoftext|>")
    lm = HFLM(pretrained=hf_model, tokenizer=hf_tok, max_length=SEQ, batch_size=4, device="cpu")
    requests = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(d.text,), idx=i)
                for i, d in enumerate(docs)]
    reference = lm.loglikelihood_rolling(requests, disable_tqdm=True)

    for path in (root, hf_dir):   # our checkpoint, and the exported Hugging Face folder through from_hf
        loaded = load_for_eval(path)
        tok = load_tokenizer(loaded.cfg, model_dir=loaded.model_dir)
        ours = score_corpus(loaded.model, tok, docs, SEQ, prefix_token_id(DEFAULT_TOKENIZER), batch_size=5, progress=False,
                            per_document=True)
        for ll, row in zip(reference, ours["per_document"]):
            assert row["tokens"] > SEQ
            assert -row["nll"] == pytest.approx(ll, rel=1e-4, abs=0)


def test_batching_and_padding_do_not_change_scores(tiny, docs):
    _, model, _ = tiny
    tok = load_tokenizer()
    ids = [e.ids for e in tok.encode_batch([d.text for d in docs[:3]], add_special_tokens=False)]
    ids.append([])                                  # an empty document scores nothing
    one = score_documents(model, ids, SEQ, 0, batch_size=1, progress=False)
    many = score_documents(model, ids, SEQ, 0, batch_size=7, progress=False)
    assert one.tokens == many.tokens == [len(x) for x in ids]
    assert many.nll == pytest.approx(one.nll, rel=1e-5)
    assert one.nll[-1] == 0.0
    # a window's score is the sum of its targets' NLLs from a single unpadded forward
    doc = ids[0][:SEQ]
    logp = torch.log_softmax(model(torch.tensor([[0] + doc[:-1]])).double(), -1)[0]
    direct = -logp[torch.arange(len(doc)), torch.tensor(doc)].sum().item()
    assert score_documents(model, [doc], SEQ, 0, progress=False).nll[0] == pytest.approx(direct, rel=1e-5)


def test_stride_rescoring_uses_more_context(tiny, docs):
    _, model, _ = tiny
    tok = load_tokenizer()
    ids = [e.ids for e in tok.encode_batch([d.text for d in docs[:2]], add_special_tokens=False)]
    full = score_documents(model, ids, SEQ, 0, stride=SEQ, progress=False)
    strided = score_documents(model, ids, SEQ, 0, stride=SEQ // 4, batch_size=16, progress=False)
    assert strided.tokens == full.tokens
    assert strided.windows > full.windows
    assert all(math.isfinite(x) and x > 0 for x in strided.nll)
    assert strided.nll != pytest.approx(full.nll, rel=1e-6)   # other contexts, other scores


def test_metrics_formulas():
    m = corpus_metrics(nll=1000.0, tokens=400, words=250, n_bytes=1200, documents=3)
    assert m["token_perplexity"] == pytest.approx(math.exp(2.5))
    assert m["word_perplexity"] == pytest.approx(math.exp(4.0))
    assert m["byte_perplexity"] == pytest.approx(math.exp(1000 / 1200))
    assert m["bits_per_byte"] == pytest.approx(1000 / (1200 * math.log(2)))
    with pytest.raises(ValueError):
        corpus_metrics(1.0, 0, 1, 1, 1)


def test_cli_results_json_and_manifest(tiny, tmp_path, capsys, monkeypatch):
    root, _, cfg = tiny
    out, manifest = tmp_path / "res.json", tmp_path / "manifest.json"
    assert main([str(root), "--corpora", "c4,fineweb_edu", "--max-docs", "1", "--batch-size", "4",
                 "--no-progress", "--out", str(out), "--write-manifest", str(manifest)]) == 0
    res = json.loads(out.read_text())
    assert res["step"] == 7 and res["attention_type"] == "vanilla" and res["max_length"] == SEQ
    assert res["prefix_token"] == 0  # <|endoftext|>, lm-eval's prefix for the Pythia tokenizer
    assert len(res["config_hash"]) == 64 and len(res["manifest_hash"]) == 64
    assert set(res["corpora"]) == {"c4", "fineweb_edu"}
    assert res["corpora"]["c4"]["source"].startswith("data/eval/")  # the repository's place, not this machine's
    for entry in res["corpora"].values():
        assert entry["documents"] == 1
        assert entry["token_perplexity"] == pytest.approx(math.exp(entry["nll"] / entry["tokens"]))
        assert entry["bits_per_byte"] == pytest.approx(entry["nll"] / (entry["bytes"] * math.log(2)))
    # the same manifest scores the same documents again: same hash, same NLL
    out2 = tmp_path / "res2.json"
    assert main([str(root), "--corpora", "c4,fineweb_edu", "--manifest", str(manifest), "--no-progress",
                 "--out", str(out2)]) == 0
    res2 = json.loads(out2.read_text())
    assert res2["manifest_hash"] == res["manifest_hash"]
    assert res2["corpora"]["c4"]["nll"] == pytest.approx(res["corpora"]["c4"]["nll"], rel=1e-6)
    from neox_dar.tokenizer import tokenizer_file, tokenizer_sha256

    assert res["tokenizer_sha256"] == tokenizer_sha256(tokenizer_file(cfg, None, root / "checkpoints" / "step_7"))
    assert res["provenance"]["command"].startswith("python ") and "git_commit" in res["provenance"]
    # the checkpoint as a path relative to the directory the command ran in (not this machine's folders)
    monkeypatch.chdir(tmp_path.parent)
    assert main([str(root), "--corpora", "c4", "--max-docs", "1", "--no-progress", "--out", str(out2)]) == 0
    where = json.loads(out2.read_text())["checkpoint"]
    assert where == str(root.relative_to(tmp_path.parent) / "checkpoints" / "step_00000007"), where
    # clear one-line errors
    capsys.readouterr()
    (tmp_path / "empty.json").write_text("{}")  # before: pinned nothing, scored every document silently
    (tmp_path / "partial.json").write_text('{"corpora": {"c4": {"source": "x"}}}')  # before: a KeyError traceback
    for bad, said in (("empty.json", "not a corpus manifest"), ("partial.json", "not a corpus manifest"),
                      ("nope.json", "no such file")):
        assert main([str(root), "--corpora", "c4", "--manifest", str(tmp_path / bad), "--no-progress"]) == 2
        assert capsys.readouterr().err.startswith(f"error: --manifest {tmp_path / bad}: {said}")
    assert main([str(root), "--corpora", "c4", "--corpus-path", f"c4={tmp_path / 'missing.json.gz'}"]) == 2
    assert str(tmp_path / "missing.json.gz") in capsys.readouterr().err
    assert main([str(root), "--corpora", "c5"]) == 2
    assert main([str(tmp_path / "no_run"), "--corpora", "c4"]) == 2
    capsys.readouterr()
    for flag in ("--max-length", "--stride", "--batch-size"):  # (before: --max-length 0 scored at seq_length)
        assert main([str(root), "--corpora", "c4", flag, "0"]) == 2
        assert capsys.readouterr().err == f"error: {flag} must be >= 1, got 0\n"


@pytest.mark.parametrize("attention", ["dar", "uniform", "swa", "mswa", "aha"])
def test_every_variant_scores_independently_of_batching(attention, docs, tmp_path):
    """Right padding never reaches a scored position in any variant: batch size 1 and 3 give the same NLL."""
    overrides = {"uniform": ["window_size=0"], "mswa": ["window_size=8", "num_layers=4"]}.get(attention,
                                                                                             ["window_size=8"])
    saved_run(tmp_path, f"attention_type={attention}", *overrides, seed=11)
    loaded = load_for_eval(tmp_path)
    assert loaded.info["attention_type"] == attention
    tok = load_tokenizer(loaded.cfg)
    one = score_corpus(loaded.model, tok, docs[1:4], SEQ, 0, batch_size=1, progress=False, per_document=True)
    three = score_corpus(loaded.model, tok, docs[1:4], SEQ, 0, batch_size=3, progress=False, per_document=True)
    assert [r["nll"] for r in three["per_document"]] == pytest.approx([r["nll"] for r in one["per_document"]],
                                                                      rel=1e-5)
    assert ("attention_stats" in one) == (attention == "aha")


def test_mu_f_averages_real_positions_only(docs, tmp_path):
    """AHA's mu_f from the evaluation: the gate's mean over every real (non-padding) input position of every
    window, per layer and head, computed here from the routers' own outputs window by window; batching (right
    padding) changes nothing."""
    saved_run(tmp_path, "attention_type=aha", "window_size=4", seed=13)
    loaded = load_for_eval(tmp_path)
    model, cfg, tok = loaded.model, loaded.cfg, load_tokenizer(loaded.cfg)
    gates = {l: [] for l in range(cfg.num_layers)}
    hooks = [layer.attention.router.register_forward_hook(
        lambda m, args, out, l=l: gates[l].append(torch.sigmoid(out.float()) > cfg.attention.aha_threshold))
        for l, layer in enumerate(model.gpt_neox.layers)]
    one = score_corpus(model, tok, docs[:4], SEQ, 0, batch_size=1, progress=False)
    for h in hooks:
        h.remove()
    expect = {f"layer{l}/mu_f": torch.cat([g.reshape(-1, g.shape[-1]) for g in gs]).double().mean(0).tolist()
              for l, gs in gates.items()}
    packed = score_corpus(model, tok, docs[:4], SEQ, 0, batch_size=3, progress=False)
    assert packed["windows"] > 3  # several windows of unequal length per batch: real padding
    for result in (one, packed):
        assert result["attention_stats"].keys() == expect.keys()
        for key, per_head in expect.items():
            assert result["attention_stats"][key] == pytest.approx(per_head, abs=1e-12), key
        assert result["mu_f"] == pytest.approx(sum(map(sum, expect.values())) / (cfg.num_layers * 4), abs=1e-12)


def test_max_docs_per_corpus(tiny, tmp_path, capsys):
    root, _, _ = tiny
    out = tmp_path / "res.json"
    assert main([str(root), "--corpora", "c4,fineweb_edu", "--max-docs", "2", "--max-docs", "c4=1", "--no-progress",
                 "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["corpora"]["c4"]["documents"] == 1 and res["corpora"]["fineweb_edu"]["documents"] == 2
    assert main([str(root), "--corpora", "c4", "--max-docs", "c4=all", "--max-docs", "fineweb_edu=1", "--no-progress",
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["corpora"]["c4"]["documents"] == len(load_local("c4"))
    capsys.readouterr()
    for bad in ("c5=1", "0", "c4=-1", "many"):
        assert main([str(root), "--corpora", "c4", "--max-docs", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --max-docs") and err.count("\n") == 1, err


def test_outputs_are_checked_before_scoring_and_written_whole(tiny, tmp_path, capsys, monkeypatch):
    """An --out or --write-manifest that cannot be written (a directory, a path under a file) is a one-line error
    before any document is scored; a write that fails (here a file-size limit, as a full disk) is a one-line error
    that leaves the previous results file whole."""
    import resource
    import signal

    import neox_dar.evaluation.cli as cli

    root, _, _ = tiny
    scored = []
    monkeypatch.setattr(cli, "score_corpus", lambda *a, **k: scored.append(a) or {})
    (tmp_path / "README.md").write_text("a file\n")
    args = [str(root), "--corpora", "c4", "--max-docs", "1", "--no-progress", "--no-wandb"]
    for flag in ("--out", "--write-manifest"):
        for bad in (tmp_path / "README.md" / "x.json", tmp_path):
            assert main([*args, flag, str(bad)]) == 2
            err = capsys.readouterr().err
            assert err.startswith("error: ") and f"{flag} {bad}" in err and err.count("\n") == 1, err
    # a device this machine lacks or that is not one (an AssertionError or RuntimeError traceback before)
    cuda = "this machine has" if torch.cuda.is_available() else "CUDA is not available on this machine"
    for extra, said in ((["--device", "gpu"], "--device 'gpu' is not a device (cpu, cuda, cuda:N or mps)"),
                        (["--device", "cuda:7"], f"--device cuda:7: {cuda}")):
        assert main([*args, *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and said in err and err.count("\n") == 1, err
    assert not scored
    monkeypatch.undo()
    out = tmp_path / "run" / "eval" / "perplexity.json"
    assert main([*args, "--out", str(out)]) == 0
    before = out.read_text()
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, limits[1]))
    try:
        code = main([*args, "--max-docs", "2", "--out", str(out)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: cannot write {out}") and err.count("\n") == 1, err
    assert out.read_text() == before and sorted(p.name for p in out.parent.iterdir()) == ["perplexity.json"]


def test_a_run_is_scored_at_its_newest_checkpoint_beside_stale_root_weights(tmp_path, capsys):
    """eval.perplexity RUN scores the run's newest checkpoint even when the run's root holds weights (an older
    version's import or export into the run directory), never those."""
    from neox_dar.saved_model import save_weights

    from builders import tiny_model

    run = tmp_path / "run"
    saved_run(run)
    save_weights(*tiny_model(seed=3, seq_length=32), run)  # stale weights at the root
    out = tmp_path / "res.json"
    assert main([str(run), "--corpora", "c4", "--max-docs", "1", "--no-progress", "--no-wandb", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["step"] == 7 and res["checkpoint"].endswith("step_00000007")
