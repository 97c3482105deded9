"""The lm-eval model ``neox_dar``: same log-likelihoods and greedy generations as lm-eval's HFLM on the
exported Hugging Face model; runs a (local) lm-eval task on an AHA checkpoint and reports mu_f."""

import json
import sys

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from lm_eval.models.huggingface import HFLM
from transformers import GPTNeoXForCausalLM

from eval.lm_eval_model import NeoxDarLM, pythia_hf_tokenizer
from neox_dar.convert import to_hf
from test_eval_perplexity import SEQ, make_checkpoint

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
    model, cfg = make_checkpoint(root, seed=3)
    hf_dir = to_hf(model, cfg, root / "hf")
    return root, hf_dir


def test_matches_hflm_on_exported_model(vanilla):
    root, hf_dir = vanilla
    ours = NeoxDarLM(checkpoint=str(root), device="cpu", batch_size=2)
    hf = HFLM(pretrained=GPTNeoXForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval(),
              tokenizer=pythia_hf_tokenizer(), max_length=SEQ, batch_size=1, device="cpu")
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


def test_lm_eval_task_on_aha_reports_mu_f(tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    run = tmp_path / "aha"
    make_checkpoint(run, overrides=["attention_type=aha", "window_size=8"], seed=5)
    rows = [{"question": f"Is {i} smaller than {i + 3}?", "choices": ["no", "yes"], "label": 1} for i in range(4)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "smoke.yaml").write_text(
        "task: neox_dar_smoke\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path / 'data.jsonl'}\ntest_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\n'
        "metric_list:\n  - metric: acc\n")
    out = simple_evaluate(model="neox_dar", model_args=f"checkpoint={run}", tasks=["neox_dar_smoke"],
                          task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
                          device="cpu", batch_size=2)
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
