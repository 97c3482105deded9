"""The lm-eval model ``neox_dar``: same log-likelihoods and greedy generations as lm-eval's HFLM on the
exported Hugging Face model (also as lm-eval's ``hf`` model loads the export by itself); runs a (local) lm-eval
task on an AHA checkpoint and reports mu_f over real tokens; falls back to the CPU without CUDA."""

import json
import sys

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from lm_eval.models.huggingface import HFLM
from builders import saved_run
from test_eval_perplexity import SEQ
from transformers import GPTNeoXForCausalLM

from eval.lm_eval_model import NeoxDarLM
from neox_dar.hf import to_hf
from neox_dar.evaluation.corpora import load_local
from neox_dar.tokenizer import DEFAULT_TOKENIZER, hf_tokenizer

LL = [("The capital of France is", " Paris"), ("Water boils at", " one hundred degrees Celsius at sea level"),
      ("", "An empty context uses the prefix token.")]
ROLLING = ["Rolling windows over a text longer than the window: " + "lorem ipsum dolor sit amet " * 12]
GEN = [("Question: what is two plus two?\nAnswer:", {"until": ["\n\n", "Question:"], "max_gen_toks": 6}),
       ("Hi", {"until": ["."], "max_gen_toks": 4})]


def _requests(kind, args):
    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


@pytest.fixture(scope="module")
def vanilla(tmp_path_factory):
    root = tmp_path_factory.mktemp("vanilla")
    model, cfg = saved_run(root, seed=3)
    hf_dir = to_hf(model, cfg, root / "hf")
    return root, hf_dir


def test_matches_hflm_on_exported_model(vanilla):
    root, hf_dir = vanilla
    ours = NeoxDarLM(checkpoint=str(root), device="cpu", batch_size=2)
    hf = HFLM(pretrained=GPTNeoXForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval(),
              tokenizer=hf_tokenizer(DEFAULT_TOKENIZER), max_length=SEQ, batch_size=1, device="cpu")
    assert ours.max_length == SEQ and ours.prefix_token_id == 0
    for kind, args in (("loglikelihood", LL), ("loglikelihood_rolling", [(t,) for t in ROLLING])):
        mine = getattr(ours, kind)(_requests(kind, args), disable_tqdm=True)
        ref = getattr(hf, kind)(_requests(kind, args), disable_tqdm=True)
        if kind == "loglikelihood":
            assert [g for _, g in mine] == [g for _, g in ref]
            mine, ref = [x for x, _ in mine], [x for x, _ in ref]
        assert mine == pytest.approx(ref, rel=1e-4)
    mine = ours.generate_until(_requests("generate_until", GEN), disable_tqdm=True)
    ref = hf.generate_until(_requests("generate_until", GEN), disable_tqdm=True)
    assert mine == ref and any(mine)


def _local_task(folder, name, rows, spec):
    """A local lm-eval task ``name`` over ``rows`` (a JSON-lines test split); ``spec`` is the rest of its YAML."""
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {folder / f'{name}.jsonl'}\ntest_split: test\n{spec}")


def _choice_task(folder, name="neox_dar_smoke"):
    rows = [{"question": f"Is {i} smaller than {i + 3}?", "choices": ["no", "yes", "it depends on the base"],
             "label": 1} for i in range(4)]
    _local_task(folder, name, rows, 'output_type: multiple_choice\ndoc_to_text: "{{question}}"\n'
                'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\nmetric_list:\n  - metric: acc\n')


def _evaluate(folder, model, model_args, tasks, batch_size=2):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(model=model, model_args=model_args, tasks=tasks, log_samples=True, device="cpu",
                           task_manager=TaskManager(include_path=str(folder), include_defaults=False),
                           batch_size=batch_size)


def test_hf_model_on_the_export_alone_matches_neox_dar(vanilla, tmp_path):
    """lm-eval's own ``hf`` model on the to-hf folder, with nothing but ``pretrained=`` (tokenizer included), gives
    the per-sample log-likelihoods of our ``neox_dar`` model: within 1e-5 for multiple choice, and within 1e-7
    relative for whole-document rolling sums (hundreds of float32 log-probabilities: a float32 ulp of -4400 is 5e-4)."""
    root, hf_dir = vanilla
    _choice_task(tmp_path)
    texts = [d.text for d in load_local("c4")[:3]]
    _local_task(tmp_path, "neox_dar_rolling", [{"text": t} for t in texts],
                'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
                "metric_list:\n  - metric: word_perplexity\n")
    tasks = ["neox_dar_smoke", "neox_dar_rolling"]
    theirs = _evaluate(tmp_path, "hf", f"pretrained={hf_dir},max_length={SEQ}", tasks)
    ours = _evaluate(tmp_path, "neox_dar", f"checkpoint={root}", tasks)
    for task in tasks:
        a = sorted(theirs["samples"][task], key=lambda x: x["doc_id"])
        b = sorted(ours["samples"][task], key=lambda x: x["doc_id"])
        assert [x["doc_id"] for x in a] == [x["doc_id"] for x in b] and a
        for x, y in zip(a, b):
            lls = [r[0][0] if isinstance(r[0], (list, tuple)) else r[0] for r in x["resps"]]
            mine = [r[0][0] if isinstance(r[0], (list, tuple)) else r[0] for r in y["resps"]]
            assert mine == (pytest.approx(lls, abs=1e-5, rel=0) if task == "neox_dar_smoke"
                            else pytest.approx(lls, rel=1e-7))


def test_cuda_device_without_cuda_falls_back_to_the_cpu(vanilla, monkeypatch):
    """lm-eval passes device="cuda" by default; without CUDA, neox_dar warns and runs on the CPU (as hf does)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    root, _ = vanilla
    with pytest.warns(UserWarning, match="CUDA is not available; running on the CPU"):
        lm = NeoxDarLM(checkpoint=str(root), device="cuda")
    assert lm.device.type == "cpu" and lm._lm.embed_out.weight.device.type == "cpu"
    assert len(lm.loglikelihood(_requests("loglikelihood", LL[:1]), disable_tqdm=True)) == 1


def test_mu_f_counts_real_tokens_only(tmp_path):
    """lm-eval right-pads a batch; mu_f must be the same whatever the batching (batch size 1 has no padding),
    and generation counts one position per generated token (AHA's Eq. 8: the prompt's last position, then each
    token fed back), not the prompt's other positions."""
    saved_run(tmp_path, "attention_type=aha", "window_size=4", seed=5)
    requests = LL + [("A much longer context, so that the other rows of its batch are mostly padding: " * 2, " end")]
    stats = {}
    for batch_size in (1, 4):
        lm = NeoxDarLM(checkpoint=str(tmp_path), device="cpu", batch_size=batch_size)
        lm.loglikelihood(_requests("loglikelihood", requests), disable_tqdm=True)
        stats[batch_size] = lm.attention_stats()
    assert 0 < stats[1]["mu_f"] < 1
    assert stats[4]["attention_stats"].keys() == stats[1]["attention_stats"].keys()
    for key, per_head in stats[1]["attention_stats"].items():
        assert stats[4]["attention_stats"][key] == pytest.approx(per_head, abs=1e-12), key
    assert stats[4]["mu_f"] == pytest.approx(stats[1]["mu_f"], abs=1e-12)

    lm = NeoxDarLM(checkpoint=str(tmp_path), device="cpu")
    prompt = torch.tensor([[5, 6, 7, 8, 9]])
    out = lm._model_generate(prompt, max_length=8, stop=[])
    assert out.shape == (1, 8)
    assert {int(c) for c in lm._stats.counts.values()} == {3}  # 3 generated tokens: the prompt's last, 2 fed back
    # the same gates as the full forward of prompt + generated tokens at positions 4, 5, 6 (not 0..3, nor 7)
    lm._lm(out)
    gates = {key: value[0, 4:7].double().mean(0).tolist() for key, value in lm._stats.current().items()}
    assert gates.keys() == lm._stats.result().keys()
    for key, per_head in lm._stats.result().items():
        assert per_head == pytest.approx(gates[key], abs=1e-12), key


def test_lm_eval_task_on_aha_reports_mu_f(tmp_path):
    run = tmp_path / "aha"
    saved_run(run, "attention_type=aha", "window_size=8", seed=5)
    _choice_task(tmp_path)
    out = _evaluate(tmp_path, "neox_dar", f"checkpoint={run}", ["neox_dar_smoke"])
    assert 0.0 <= out["results"]["neox_dar_smoke"]["acc,none"] <= 1.0
    config = out["config"]
    assert config["neox_dar_attention_type"] == "aha" and config["neox_dar_step"] == 7
    assert 0.0 <= config["mu_f"] <= 1.0
    assert sorted(config["attention_stats"]) == ["layer0/mu_f", "layer1/mu_f"]
    assert all(len(v) == 4 and all(0.0 <= x <= 1.0 for x in v) for v in config["attention_stats"].values())


def test_cli_wrapper_registers_the_model(monkeypatch):
    import lm_eval.__main__

    from eval import lm_eval_cli

    seen = {}
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: seen.setdefault("cls", get_model("neox_dar")))
    monkeypatch.setattr(sys, "argv", ["neox-dar-lm-eval", "--model", "neox_dar"])
    lm_eval_cli.main()
    assert seen["cls"] is NeoxDarLM


def test_cli_and_model_refuse_bad_counts_and_unknown_model_args(monkeypatch, capsys):
    """A negative --num_fewshot (run as 0-shot and recorded as -1), --limit 0 (lm-eval: "did not find any docs!"),
    an unknown task (lm-eval's ValueError traceback) and a model_args key neox_dar does not know (HFLM ignored it: a
    misspelt dtype ran in float32) are one line, exit 2."""
    import lm_eval.__main__

    from eval import lm_eval_cli

    with pytest.raises(ValueError, match="model_args of neox_dar: unknown dtpye"):
        NeoxDarLM(checkpoint="never-read", dtpye="bfloat16")
    # a TypeError traceback each, before: no checkpoint= (path= instead), a number lm-eval left as text
    with pytest.raises(ValueError, match="model_args of neox_dar: checkpoint=PATH is needed"):
        NeoxDarLM()
    with pytest.raises(ValueError, match="model_args of neox_dar: max_length must be a whole number >= 1, got 'abc'"):
        NeoxDarLM(checkpoint="never-read", max_length="abc")
    with pytest.raises(ValueError, match="dimpo_layers must be a whole number >= 0, got 'x'"):
        NeoxDarLM(checkpoint="never-read", dimpo_layers="x")

    def unknown_task():
        raise ValueError("Tasks not found: nosuchtask")

    def device_twice():  # what lm-eval raises for device= in --model_args beside its own --device
        raise TypeError("__init__() got multiple values for keyword argument 'device'")

    for words, said, run in ((["--num_fewshot", "-1"], "--num_fewshot must be >= 0, got -1", unknown_task),
                             (["--limit", "0"], "--limit must be > 0", unknown_task),
                             (["--tasks", "nosuchtask"], "Tasks not found: nosuchtask", unknown_task),
                             (["--model_args", "checkpoint=x,device=cpu"], "device is given twice", device_twice)):
        monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", run)
        monkeypatch.setattr(sys, "argv", ["neox-dar-lm-eval", "--model", "neox_dar", *words])
        with pytest.raises(SystemExit) as stop:
            lm_eval_cli.main()
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err == f"eval.lm_eval_cli: error: {said}" + err.split(said, 1)[1], err
        assert err.count("\n") == 1
