"""lm-eval's ``generate_until`` through the project's model (``--model neox_dar``) decodes with the variants'
inference caches: a small local generation task on DAR and AHA checkpoints gives, per sample, our own greedy
completion cut at the task's stop string, the same completions as lm-eval's ``hf`` model on the ``to-hf`` export
(``trust_remote_code``), and AHA's mu_f over the generated tokens."""

import pytest
from builders import saved_run
from test_eval_lm_eval import _evaluate, _local_task

from neox_dar.hf import to_hf
from neox_dar.generate import generate, load
from neox_dar.model import CausalLM

pytestmark = pytest.mark.usefixtures("one_thread")

QUESTIONS = ["Question: what is two plus two?\nAnswer:", "The capital of France is", "Water boils at",
             "Once upon a time"]


def _generation_task(folder, name="neox_dar_gen"):
    rows = [{"question": q, "answer": "four"} for q in QUESTIONS]
    _local_task(folder, name, rows, 'output_type: generate_until\ndoc_to_text: "{{question}}"\n'
                'doc_to_target: "{{answer}}"\ngeneration_kwargs:\n  until: ["\\n", "."]\n  max_gen_toks: 12\n'
                '  do_sample: false\nmetric_list:\n  - metric: exact_match\n')
    return name


@pytest.mark.parametrize("variant", [["attention_type=dar", "window_size=4", "dar_d_down=16"],
                                     ["attention_type=aha", "window_size=4"]], ids=["dar", "aha"])
def test_generate_until_decodes_through_the_caches(tmp_path, variant, monkeypatch):
    run = tmp_path / "run"
    saved_run(run, *variant, seed=13)
    task = _generation_task(tmp_path)
    steps = []
    decode = CausalLM.decode
    monkeypatch.setattr(CausalLM, "decode", lambda self, ids, cache: steps.append(ids.shape) or decode(self, ids, cache))
    out = _evaluate(tmp_path, "neox_dar", f"checkpoint={run}", [task], batch_size=4)
    assert steps and all(shape == (4, 1) for shape in steps)  # the 4 requests decode together, one token a step
    monkeypatch.undo()
    samples = sorted(out["samples"][task], key=lambda x: x["doc_id"])
    gen = load(run, "cpu")
    for sample, question in zip(samples, QUESTIONS):
        ids = generate(gen.model, [gen.encode(question)], 12, gen.eos_ids)[0].token_ids
        expected = gen.tokenizer.decode(ids)
        for stop in ("\n", "."):
            expected = expected.split(stop)[0]
        assert sample["resps"][0][0] == expected
    assert any(s["resps"][0][0] for s in samples)
    if "attention_type=aha" in variant:
        assert 0.0 < out["config"]["mu_f"] < 1.0
    theirs = _evaluate(tmp_path, "hf", f"pretrained={to_hf(gen.model, gen.model.cfg, tmp_path / 'hf', gen.info['tokenizer'])},"
                       "trust_remote_code=True,max_length=32", [task], batch_size=4)
    assert [s["resps"] for s in sorted(theirs["samples"][task], key=lambda x: x["doc_id"])] == [
        s["resps"] for s in samples]
