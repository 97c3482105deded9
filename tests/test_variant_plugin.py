"""A new attention variant is one module plus one registration: the toy variant of docs/adding_a_variant.md, built
from the page's own snippets (its module and its registration line), goes through the config (its own key, a typo
in it, its rule), the model, a training step of train.py, ``describe``, a sweep plan, an evaluation and the report,
with no other file edited. The page's shipped toy (its three modules and its registration, written into a copy of
the package) exports to a folder that transformers loads, with our logits and tokens."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
import torch
import yaml

from neox_dar.config import ConfigError, load_config
from neox_dar.describe import describe
from neox_dar.model import build_model
from neox_dar.tokenizer import DEFAULT_TOKENIZER
from neox_dar.variants import unregister

from trainrun import ROOT, status, train_env


# the variant exactly as docs/adding_a_variant.md writes it: the page's first snippet is the plug-in's module
# (toy.py), written to a folder of its own and imported from there; its second is the one registration line
PAGE = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "adding_a_variant.md").read_text(), re.S)
assert PAGE[0].startswith("# toy.py (your own code)\n") and PAGE[1].rstrip().endswith("register(ToyAttention)")


def _page_module(source: str) -> ModuleType:
    """The page's ``toy.py``, written to a temporary folder and imported from that file."""
    with tempfile.TemporaryDirectory(prefix="adding_a_variant-") as folder:
        path = Path(folder) / "toy.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("toy", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


ToyAttention = _page_module(PAGE[0]).ToyAttention


@pytest.fixture(autouse=True)
def toy_registered():
    exec(PAGE[1], {"ToyAttention": ToyAttention})  # the page's registration line
    yield
    unregister(ToyAttention.spec.name)


TOY = ["configs/tiny.yml", "attention_type=toy", "toy_scale=2.0"]


def test_config_knows_the_toy_key_its_typos_rule_and_where_it_has_no_effect():
    cfg = load_config(ROOT / TOY[0], overrides=TOY[1:])
    assert cfg.model.attention.attention_type == "toy" and cfg.model.attention.toy_scale == 2.0
    with pytest.raises(ConfigError, match=r"unknown key 'toy_scael' in the command line; did you mean 'toy_scale'\?"):
        load_config(ROOT / TOY[0], overrides=["attention_type=toy", "toy_scael=2"])
    with pytest.raises(ConfigError, match=r"invalid value for 'toy_scale' in the command line: -1\.0 \(must be > 0\)"):
        load_config(ROOT / TOY[0], overrides=["attention_type=toy", "toy_scale=-1.0"])
    with pytest.warns(UserWarning, match="'toy_scale' is set but attention_type is 'vanilla' .*read only by toy"):
        load_config(ROOT / TOY[0], overrides=["toy_scale=3.0"])
    with pytest.raises(ConfigError, match="choose one of .*toy.*did you mean 'toy'"):
        load_config(ROOT / TOY[0], overrides=["attention_type=tyo"])
    from neox_dar.config import reference_markdown

    assert "### `toy` (read by toy)" in reference_markdown() and "`toy_scale`" in reference_markdown()


def test_model_builds_and_describe_reads_the_variant():
    cfg = load_config(ROOT / TOY[0], overrides=TOY[1:])
    model = build_model(cfg.model)
    assert torch.equal(model.gpt_neox.layers[1].attention.scale, torch.full((4,), 2.0))
    logits = model(torch.randint(0, 100, (2, 9)))
    assert logits.shape == (2, 9, cfg.model.padded_vocab_size)
    assert model.attention_stats()["layer0/toy_scale_now"].tolist() == [2.0] * 4
    text = describe(cfg)
    assert "attention_type: toy" in text and "toy: queries scaled per head, starting at 2.0" in text
    assert "extra parameters: 8 (4 per layer" in text
    # its attention is not plain windowed softmax: no decoding by the base class's cache until it implements decode
    with pytest.raises(ConfigError, match="attention_type 'toy' has no incremental decoding"):
        model.new_cache([3], 2)
    with pytest.raises(ConfigError, match="attention_type 'toy' has no Hugging Face export"):
        model.attention_modules()[0].export_spec()


_TRAIN = """
import sys
sys.path.insert(0, "tests")
import test_variant_plugin
from neox_dar.variants import register
register(test_variant_plugin.ToyAttention)
import train
sys.exit(train.main(sys.argv[1:]))
"""


def test_train_sweep_evaluation_and_report(byte_tokenized_sample, tmp_path):
    """train.py steps the toy model (its parameter is optimised and its statistic logged), a sweep names and plans
    runs by its key's label, the evaluation averages its statistic, and the report shows it. (On the
    byte-tokenized sample: the variant's path through them is what is checked.)"""
    from trainrun import BYTE_TOKENIZER

    from neox_dar.evaluation.perplexity import score_corpus
    from neox_dar.evaluation.corpora import load_local
    from neox_dar.evaluation.loading import load_for_eval
    from neox_dar.report import build_table, collect
    from neox_dar.report.figures import draw_all
    from neox_dar.sweep.__main__ import main as sweep_main
    from neox_dar.tokenizer import load_tokenizer

    sweep = {"name": "toy", "configs": [TOY[0]],
             "set": {"attention_type": "toy", "seq_length": 32, "train_iters": 3, "train_batch_size": 8,
                     "train_micro_batch_size_per_gpu": 4, "log_interval": 1, "eval_interval": 0,
                     "checkpoint_factor": 3, "precision": "fp32", "data_path": byte_tokenized_sample,
                     "vocab_file": str(BYTE_TOKENIZER), "vocab_size": 257},
             "grid": {"toy_scale": [1.0, 2.0]}, "eval": False, "report": {"baseline": {"run": "s1"}}}
    path = tmp_path / "toy.yml"
    path.write_text(yaml.safe_dump(sweep))
    out = tmp_path / "runs"
    assert sweep_main([str(path), "plan", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir() if (p / "config.yml").is_file()) == ["s1", "s2"]

    for run in ("s2",):  # one trained run is enough; s1 stays planned only (missing in the table)
        proc = subprocess.run([sys.executable, "-c", _TRAIN, str(out / run / "config.yml")], cwd=ROOT,
                              env=train_env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert status(out / run)["state"] == "done"
        rows = [json.loads(line) for line in (out / run / "metrics.jsonl").read_text().splitlines()]
        assert len(rows[-1]["toy_scale_now/layer0"]) == 4 and "toy_scale_now" in rows[-1]
        loaded = load_for_eval(out / run)
        scale = loaded.model.gpt_neox.layers[0].attention.scale
        assert not torch.equal(scale, torch.full((4,), float(run[1:])))  # trained
        docs = load_local("c4")[:2]
        result = score_corpus(loaded.model, load_tokenizer(loaded.cfg), docs, 32, 0, progress=False)
        (out / run / "eval").mkdir()
        every_layer = torch.stack([m.scale for m in loaded.model.attention_modules()])
        assert result["toy_scale_now"] == pytest.approx(every_layer.mean().item())  # means over real tokens
        evaluation = {"step": 3, "corpora": {c: result for c in ("fineweb_edu", "c4", "wikitext103")}}
        (out / run / "eval" / "perplexity.json").write_text(json.dumps(evaluation))

    runs, spec, _ = collect(out)
    table = build_table(runs, spec.report)
    assert "toy_scale_now (%)" in table.columns
    toy_col = table.columns.index("toy_scale_now (%)")
    expect = runs[1].stat_mean("toy_scale_now") * 100
    assert table.rows[1][toy_col] == pytest.approx(expect) and expect > 100  # started at 2.0
    files, _ = draw_all(runs, table, spec.report, tmp_path / "report")
    assert (tmp_path / "report" / "toy_toy_scale_now_heatmap.png") in files


def test_plan_lists_the_variants_summary(capsys, tmp_path, tokenized_sample):
    from neox_dar.sweep.__main__ import main as sweep_main

    path = tmp_path / "toy.yml"
    path.write_text(yaml.safe_dump({"name": "toy", "configs": [TOY[0]],
                                    "set": {"attention_type": "toy", "data_path": tokenized_sample},
                                    "grid": {"toy_scale": [0.5, 3.0]}, "eval": False}))
    assert sweep_main([str(path), "plan", "--out", str(tmp_path / "runs")]) == 0
    text = capsys.readouterr().out
    assert "s0.5" in text and "s3" in text and "toy scale=0.5" in text and "toy scale=3" in text
    assert Path(tmp_path / "runs" / "s3" / "config.yml").is_file()


# the shipped toy as the page writes it: each block that starts with "# neox_dar/<path>" is that file (the
# registration block is added to the end of neox_dar/variants/__init__.py)
SHIPPED = {block.split(":", 1)[0][2:]: block for block in PAGE if re.match(r"# neox_dar/[\w/]+\.py", block)}
assert sorted(SHIPPED) == ["neox_dar/attention/toy.py", "neox_dar/standalone/toy.py", "neox_dar/variants/__init__.py",
                           "neox_dar/variants/toy.py"]

_SHIPPED_RUN = """
import json, sys
import torch
from transformers import AutoModelForCausalLM
import neox_dar
from neox_dar.config import load_config
from neox_dar.generate import generate
from neox_dar.hf import to_hf
from neox_dar.model import build_model

package, config, tokenizer, out = sys.argv[1:]
assert neox_dar.__file__.startswith(package), neox_dar.__file__
cfg = load_config(config, overrides=["attention_type=toy", "toy_scale=2.0"]).model
torch.manual_seed(0)
model = build_model(cfg).eval()
folder = to_hf(model, cfg, out, tokenizer)
hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    ours, theirs = model(ids), hf(ids).logits
torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4 * ours.abs().max().item())
mine = generate(model, [ids[0, :5]], 6)[0].token_ids
out = hf.generate(ids[:1, :5], max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
print(json.dumps({"tokens": out[0, 5:].tolist() == mine, "scale": model.attention_modules()[0].scale.tolist(),
                  "layers": hf.config.neox_dar_layers, "layer_class": type(hf.gpt_neox.layers[0].attn).__name__}))
"""


def test_the_shipped_toy_exports_to_transformers(tmp_path):
    """The page's shipped toy in a copy of the package (its three modules written there, its registration added to
    ``neox_dar/variants/__init__.py``, nothing else edited): the model of ``attention_type: toy`` exports to a folder
    that transformers loads with ``trust_remote_code``, and gives our logits and greedy tokens."""
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "neox_dar", copy / "neox_dar", ignore=shutil.ignore_patterns("__pycache__"))
    for path, block in SHIPPED.items():
        target = copy / path
        target.write_text(target.read_text() + "\n" + block if target.exists() else block)
    env = {**train_env(), "PYTHONPATH": str(copy), "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", _SHIPPED_RUN, str(copy / "neox_dar"), str(ROOT / TOY[0]),
                           str(DEFAULT_TOKENIZER), str(tmp_path / "toy_hf")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"tokens": True, "scale": [2.0] * 4, "layers": [{"type": "toy"}] * 2, "layer_class": "ToyLayer"}
    assert "from .toy import ToyLayer" in (tmp_path / "toy_hf" / "layer_types.py").read_text()
