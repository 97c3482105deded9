"""Model families (Llama, OLMo-2, Qwen2, Qwen3, GPT-NeoX) against transformers' own classes: published preset
shapes, logits of imported tiny models, exports that the same class loads, variants on top of an import, one-line
errors for folders we cannot honour, and the memory a sharded import takes."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from builders import FAMILY_PRESETS, ROOT, TINY_FAMILY, TINY_FAMILY_KEYS, config, hf_folder

from neox_dar.config import ConfigError, model_config_diff
from neox_dar.convert import main
from neox_dar.hf import config_from_hf, from_hf, to_hf
from neox_dar.families import FAMILIES
from neox_dar.model import build_model, count_parameters
from neox_dar.rundir import CheckpointError
from neox_dar.tokenizer import DEFAULT_TOKENIZER, prefix_token_id, special_token_ids

PRESETS = ["llama-3.2-1b", "llama-2-7b", "olmo-2-0425-1b", "qwen2.5-0.5b", "qwen3-0.6b"]
PUBLISHED = ROOT / "tests" / "fixtures" / "hf_configs"


def hf_meta_count(hf: dict) -> int:
    """Parameters of the transformers class built on the meta device from a ``config.json`` dict."""
    hf = dict(hf)
    cfg = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_is_the_published_model(preset):
    """The preset's parameter count (meta device) equals the transformers class's for the published config.json,
    and the published config.json converts to the preset's architecture."""
    published = json.loads((PUBLISHED / f"{preset}.json").read_text())
    ours = config(f"configs/{preset}.yml").model
    with torch.device("meta"):
        model = build_model(ours)
    assert count_parameters(model)["total"] == hf_meta_count(published)
    assert model_config_diff(config_from_hf(published, preset), ours) == {}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    """family -> (sharded Hugging Face folder, the transformers model it holds); Qwen2 and Qwen3 tie embeddings."""
    out = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(family)
        out[family] = path, hf_folder(path, family, tie=family in ("qwen2", "qwen3"))
    return out


def ids(T: int, vocab: int = 96, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (2, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_from_hf_logits_equal_transformers(folders, family):
    """A sharded tiny model (GQA, q/k norms, Qwen2 bias, Llama-3 rope scaling) imports to the same logits, float32,
    at T = 37 and T = 300."""
    path, hf = folders[family]
    assert len(list(path.glob("model-*.safetensors"))) >= 2
    model, cfg = from_hf(path)
    assert cfg.model_family == family and not any(p.is_meta for p in model.parameters())
    if family != "gpt_neox":
        assert cfg.num_kv_heads == 2
    model.eval()
    for T in (37, 300):
        x = ids(T)
        with torch.no_grad():
            theirs, ours = hf(x).logits, model(x)
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_to_hf_loads_in_the_same_class(folders, family, tmp_path):
    """Import, export: the same transformers class loads the folder to our logits and to the original weights."""
    path, hf = folders[family]
    model, cfg = from_hf(path)
    out = to_hf(model.eval(), cfg, tmp_path / "export", DEFAULT_TOKENIZER)  # the folder ships no tokenizer
    again = type(hf).from_pretrained(out, attn_implementation="eager").float().eval()
    assert again.config.tie_word_embeddings == hf.config.tie_word_embeddings
    original = hf.state_dict()
    for name, tensor in again.state_dict().items():
        if name in original:
            assert torch.equal(tensor, original[name]), name
    x = ids(37, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(again(x).logits, model(x), atol=1e-5, rtol=0)


def test_command_line_round_trip_with_the_tokenizer(folders, tmp_path, capsys):
    """``from-hf`` copies the folder's tokenizer files; ``to-hf`` of the result writes them back with the folder's
    own bos/eos (Llama-3 style: bos differs from eos), and the prefix token is lm-eval's (the bos). The tokenizer
    fits the tiny model's 96 embedding rows (a word-level one of 29 ids: the Pythia tokenizer would be refused)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    src = tmp_path / "hf"
    shutil.copytree(folders["llama"][0], src)
    vocab = {"<|endoftext|>": 0, "<|padding|>": 1, **{chr(97 + i): 2 + i for i in range(26)}, "[UNK]": 28}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|padding|>", "eos_token": "<|endoftext|>"}))
    # the command (python -m neox_dar.convert) by its main, in this process
    assert main(["from-hf", str(src), str(tmp_path / "ours")]) == 0, capsys.readouterr().err
    assert (tmp_path / "ours" / "tokenizer_config.json").is_file()
    assert special_token_ids(tmp_path / "ours" / "tokenizer.json") == {"bos": 1, "eos": 0}
    assert prefix_token_id(tmp_path / "ours" / "tokenizer.json") == 1
    assert main(["to-hf", str(tmp_path / "ours"), str(tmp_path / "back")]) == 0, capsys.readouterr().err
    exported = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (exported["bos_token_id"], exported["eos_token_id"]) == (1, 0)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert (tok.bos_token, tok.eos_token) == ("<|padding|>", "<|endoftext|>")
    again = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "back", attn_implementation="eager").eval()
    x = ids(37, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(again(x).logits, folders["llama"][1](x).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["llama", "olmo2", "qwen3"])
@pytest.mark.parametrize("variant", ["dar", "swa", "mswa", "aha"])
def test_variant_on_an_import_is_vanilla_when_unused(folders, family, variant):
    """A variant added on an import (new parameters initialised, present but unused): DAR, SWA and MSWA with every
    window >= T, and AHA with its gate forced to full (router 0, threshold below sigmoid(0)), give the imported
    vanilla model's logits, under grouped-query attention and the families' key norms."""
    path, _ = folders[family]
    vanilla, _ = from_hf(path)
    keys = {"dar": dict(attention_type="dar", window_size=64, dar_d_down=16),
            "swa": dict(attention_type="swa", window_size=64),
            "mswa": dict(attention_type="mswa", window_size=2048),
            "aha": dict(attention_type="aha", window_size=4, aha_threshold=0.4)}[variant]
    model, cfg = from_hf(path, overrides=keys)
    new = set(model.weights()) - set(vanilla.weights())
    assert new or variant in ("swa", "mswa")
    for name in new:  # initialised as documented: init_method (normal, init_method_std) for matrices, then the
        # variant's own start: AHA's router at 0 (aha_router_init: zeros, the default; it was left at init_method)
        assert (model.weights()[name].abs().sum() == 0) == (variant == "aha"), name
    x = ids(37, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), vanilla.eval()(x), atol=1e-5, rtol=0)
    if variant == "aha":
        assert all(bool(m.stats["mu_f"].eq(1).all()) for m in model.attention_modules())


def test_an_import_adding_a_variant_takes_its_start_or_refuses_one_that_needs_data(folders):
    """The variant's start keys apply on an import as when finetuning adds the variant: ``aha_router_init: random``
    keeps init_method; ``dar_init: pca`` (computed on training data) is refused in one line, naming the way that
    works (it was a random bottleneck recorded as pca)."""
    path, _ = folders["llama"]
    model, _ = from_hf(path, overrides=dict(attention_type="aha", window_size=4, aha_router_init="random"))
    assert all(m.router.weight.abs().sum() > 0 for m in model.attention_modules())
    with pytest.raises(ConfigError, match=r"^dar_init=pca computes DAR's start on training data, .* finetune=true "):
        from_hf(path, overrides=dict(attention_type="dar", window_size=4, dar_init="pca"))


@pytest.mark.parametrize("decoder", [False, True])
def test_special_tokens_of_the_older_format_are_read_as_transformers_reads_them(tmp_path, decoder):
    """A folder whose ``tokenizer_config.json`` names no special tokens and whose ``special_tokens_map.json`` does
    (the older format; an import of it failed later with "neither a bos nor an eos token"): the tokens are those
    transformers' AutoTokenizer gives, also when an ``added_tokens_decoder`` makes it ignore the older file."""
    from tokenizers import Tokenizer, models

    vocab = {"<|endoftext|>": 0, "<s>": 1, "a": 2, "[UNK]": 3}
    Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<s>"}
    if decoder:
        config["added_tokens_decoder"] = {"0": {"content": "<|endoftext|>", "special": True}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": {"content": "<|endoftext|>"}, "eos_token": "<|endoftext|>"}))
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert special_token_ids(tmp_path / "tokenizer.json") == {"bos": hf.bos_token_id, "eos": hf.eos_token_id}
    assert hf.eos_token_id == (1 if decoder else 0)


def test_dar_global_keys_take_the_key_norm(folders):
    """Decision (docs/models.md): OLMo-2's key norm applies to ``k_glob`` as to ``k``. With the bottleneck set to
    the identity (d_down = d), ``k_glob`` equals ``k``: so a DAR model at any window equals vanilla."""
    path, _ = folders["olmo2"]
    vanilla, _ = from_hf(path)
    model, _ = from_hf(path, overrides=dict(attention_type="dar", window_size=4, dar_d_down=64))
    with torch.no_grad():
        for m in model.attention_modules():
            m.dar_down.weight.copy_(torch.eye(64))
            m.dar_up.weight.copy_(torch.eye(64))
    x = ids(37, seed=4)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), vanilla.eval()(x), atol=1e-5, rtol=0)


def _edit_config(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("family, changes, message", [
    ("llama", {"architectures": ["MistralForCausalLM"]}, "architectures ['MistralForCausalLM'] is not supported"),
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window"),
    ("qwen3", {"layer_types": ["sliding_attention", "full_attention"]}, "sliding_attention"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}}, "rope type 'yarn'"),
    ("olmo2", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("llama", {"intermediate_size": 128}, "implies"),
])
def test_unusable_folders_are_one_line_errors(folders, tmp_path, capsys, family, changes, message):
    """A class or setting we cannot honour, or weights that do not fit config.json: exit 2, one line naming the
    file (and key or tensor), before any weight is read."""
    path = _edit_config(folders[family][0], tmp_path / "hf", **changes)
    assert main(["from-hf", str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err and str(path) in err, err
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_missing_shard_is_named(folders, tmp_path, capsys):
    path = shutil.copytree(folders["qwen2"][0], tmp_path / "hf")
    gone = sorted(path.glob("model-*.safetensors"))[1]
    gone.unlink()
    assert main(["from-hf", str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and gone.name in err and "model.safetensors.index.json" in err


def test_override_that_breaks_the_import_is_a_config_error(folders):
    with pytest.raises(ConfigError, match="num_kv_heads"):
        from_hf(folders["llama"][0], overrides={"num_kv_heads": 3})
    with pytest.raises(CheckpointError, match="shape"):
        from_hf(folders["llama"][0], overrides={"intermediate_size": 64})


RSS_SCRIPT = """
import sys, torch
from neox_dar.hf import from_hf
def status_kb(field):  # this process's own memory; ru_maxrss would count the parent's pages from before exec
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
from_hf(sys.argv[2])  # a tiny import first: the libraries it pages in are not the checkpoint's memory
before = status_kb("VmRSS")
model, cfg = from_hf(sys.argv[1])
with torch.no_grad():
    for p in model.parameters():
        p.sum()  # every weight page touched: what a forward pass holds
peak = status_kb("VmHWM")
print((peak - before) * 1024, sum(p.numel() * p.element_size() for p in model.parameters()))
"""


def test_sharded_import_peak_memory_is_one_model(folders, tmp_path):
    """A ~220 MB random Llama in 4 shards imports with peak RSS growth < 1.3x its size on disk (tensors are
    memory-mapped and assigned, never copied)."""
    folder = tmp_path / "big"
    cfg = transformers.LlamaConfig(vocab_size=8000, hidden_size=768, intermediate_size=2048, num_hidden_layers=6,
                                   num_attention_heads=12, num_key_value_heads=4, tie_word_embeddings=False)
    with torch.no_grad():  # made here: the import is measured in a process of its own (below)
        transformers.LlamaForCausalLM(cfg).save_pretrained(folder, max_shard_size="60MB")
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    disk = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    assert disk > 200e6 and len(list(folder.glob("*.safetensors"))) >= 3
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, folder, folders["llama"][0]], check=True, cwd=ROOT, env=env,
                         capture_output=True, text=True)
    grew, held = map(int, out.stdout.split()[-2:])
    assert held == pytest.approx(disk, rel=0.01)
    assert grew < 1.3 * disk, f"peak RSS grew {grew / 1e6:.0f} MB for {disk / 1e6:.0f} MB on disk"



def test_an_import_shows_its_progress_in_bytes_only_when_it_takes_a_while(tmp_path, monkeypatch, capsys):
    """from_hf reports the bytes of the weight files read, file by file up to their sum; a quick import (under 2 s,
    every test's) prints nothing."""
    import io

    from neox_dar.hf import folders
    from neox_dar.progress import LogProgress

    hf_folder(tmp_path / "hf", "llama", shard="20KB")
    files = sorted((tmp_path / "hf").glob("*.safetensors"))
    assert len(files) >= 3
    capsys.readouterr()  # save_pretrained's own bar
    from_hf(tmp_path / "hf")
    assert capsys.readouterr().err == ""
    log, shown, totals = io.StringIO(), [], []

    class EveryUpdate(LogProgress):  # a line at every update, each count recorded
        def _write(self):
            shown.append(self.n)
            super()._write()

    monkeypatch.setattr(folders, "progress_bar",
                        lambda **kw: totals.append(kw["total"]) or EveryUpdate(file=log, interval=0, **kw))
    from_hf(tmp_path / "hf")
    assert totals == [sum(f.stat().st_size for f in files)]
    assert len(shown) > len(files) and shown == sorted(shown) and shown[-1] == totals[0]
    assert log.getvalue().splitlines()[-1].startswith("reading hf: 100%")

def _llama_with_tokenizer(path: Path) -> Path:
    """A tiny Llama over the Pythia vocabulary whose tokenizer, like Llama-3's, has a bos distinct from eos
    (``<|padding|>`` = 1, ``<|endoftext|>`` = 0)."""
    hf_folder(path, "llama", vocab=50304, shard="2MB")
    shutil.copyfile(ROOT / "data" / "20B_tokenizer.json", path / "tokenizer.json")
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|padding|>", "eos_token": "<|endoftext|>"}))
    return path


def test_rolling_perplexity_of_an_import_equals_lm_eval(tmp_path):
    """lm-eval's HFLM on the transformers model and our rolling scorer on the same folder give the same document
    log-likelihoods: same tokenizer, same prefix token (the bos, as lm-eval picks it), same windows."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from neox_dar.evaluation.corpora import load_local
    from neox_dar.evaluation.loading import load_for_eval
    from neox_dar.evaluation.perplexity import score_corpus
    from neox_dar.tokenizer import load_tokenizer

    path = _llama_with_tokenizer(tmp_path / "llama")
    docs = [d for d in load_local("c4") if 250 <= len(d.text) <= 700][:3]
    hf = transformers.LlamaForCausalLM.from_pretrained(path, attn_implementation="eager").float().eval()
    lm = HFLM(pretrained=hf, tokenizer=transformers.AutoTokenizer.from_pretrained(path), max_length=32,
              batch_size=4, device="cpu")
    assert lm.prefix_token_id == prefix_token_id(path / "tokenizer.json") == 1
    requests = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(d.text,), idx=i)
                for i, d in enumerate(docs)]
    reference = lm.loglikelihood_rolling(requests, disable_tqdm=True)
    loaded = load_for_eval(path)
    tok = load_tokenizer(loaded.cfg, model_dir=loaded.model_dir)
    ours = score_corpus(loaded.model, tok, docs, 32, prefix_token_id(path / "tokenizer.json"), batch_size=4,
                        progress=False, per_document=True)
    for ll, row in zip(reference, ours["per_document"]):
        assert row["tokens"] > 32
        assert -row["nll"] == pytest.approx(ll, rel=1e-4, abs=0)


@pytest.fixture(scope="module")
def byte_data(byte_tokenized_sample) -> str:
    return byte_tokenized_sample


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt_neox"])  # Pythia's: the training tests
def test_family_trains_resumes_exactly_and_evaluates(family, byte_data, tmp_path):
    """A tiny model of the family's preset trains under DeepSpeed ZeRO-1; a second run started from the first's
    step-3 checkpoint (``load=``) repeats its steps 4-6 bit for bit; rolling perplexity of the result is finite.
    (On the byte-tokenized sample, trainrun.BYTES: the family's architecture is what is checked, and a 257-token
    vocabulary makes its steps and checkpoints cheap.)"""
    from trainrun import BYTES, losses, train

    from eval.perplexity import main as perplexity

    keys = [FAMILY_PRESETS[family], *TINY_FAMILY, *BYTES, "zero_optimization.stage=1"]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    train(full, byte_data, *keys)
    train(resumed, byte_data, *keys, f"load={full / 'checkpoints' / 'step_00000003'}")
    reference = losses(full)
    assert losses(resumed) == {s: v for s, v in reference.items() if s > 3} and len(reference) == 6
    out = tmp_path / "ppl.json"
    assert perplexity([str(resumed), "--corpora", "c4", "--max-docs", "2", "--max-length", "32", "--no-progress",
                       "--no-wandb", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert math.isfinite(result["corpora"]["c4"]["word_perplexity"]) and result["corpora"]["c4"]["tokens"] > 0


def test_data_prep_follows_the_tokenizers_conventions(tmp_path):
    """``--tokenizer DIR``: a tokenizer.json whose post-processor prepends a BOS (as Llama-3's does) starts every
    document with it, and a vocabulary without ``<|endoftext|>`` ends documents with the folder's eos_token."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    from data_prep.tokenize import run
    from neox_dar.data.indexed import IndexedDataset

    raw = json.loads((ROOT / "data" / "20B_tokenizer.json").read_text())
    raw["added_tokens"] = [t for t in raw["added_tokens"] if t["content"] != "<|endoftext|>"]
    del raw["model"]["vocab"]["<|endoftext|>"]
    folder = tmp_path / "llama3-like"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(raw))
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.post_processor = TemplateProcessing(single="<|padding|> $A", special_tokens=[("<|padding|>", 1)])
    tok.add_special_tokens(["<|end_of_text|>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|padding|>",
                                                              "eos_token": "<|end_of_text|>"}))
    eos = tok.token_to_id("<|end_of_text|>")
    texts = ["first document", "a second, longer document"]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    manifest = run([str(source), "--tokenizer", str(folder), "--out", str(tmp_path / "out"), "--workers", "1",
                    "--no-progress"])
    assert (manifest["bos_id"], manifest["eod_id"]) == (1, eos)
    data = IndexedDataset(str(tmp_path / "out"))
    docs = sorted((data[i].tolist() for i in range(len(data))), key=len)
    for doc, text in zip(docs, texts):
        assert doc == [1, *tok.encode(text, add_special_tokens=False).ids, eos]


GQA_VARIANTS = [("vanilla", {}), ("dar", {"window_size": 3, "dar_d_down": 8}), ("swa", {"window_size": 3}),
                ("mswa", {"window_size": 8, "num_layers": 4}), ("aha", {"window_size": 3, "aha_threshold": 0.5})]


def _family_attention(family: str, variant: str, keys: dict, impl: str, num_kv_heads: int):
    """Layer 1's attention module of a tiny ``family`` model (4 query heads of 16 dims) with ``variant``."""
    from neox_dar.attention import build_attention

    cfg = config(FAMILY_PRESETS[family], **{**TINY_FAMILY_KEYS, "num_kv_heads": num_kv_heads,
                                            "attention_type": variant, "attention_impl": impl, **keys}).model
    return cfg, build_attention(cfg, 1)


@pytest.mark.parametrize("family", ["olmo2", "qwen3"])
@pytest.mark.parametrize("variant, keys", GQA_VARIANTS, ids=[v for v, _ in GQA_VARIANTS])
def test_grouped_query_attention_is_repeated_key_value_heads(family, variant, keys):
    """A GQA module (2 key/value heads for 4 query heads, the family's q/k norms) equals the full multi-head module
    whose key/value projections (and per-head key norms) are the GQA ones repeated per group; outputs and input
    gradients, on the reference and SDPA paths, for every variant (DAR's global keys included)."""
    from neox_dar.attention import RotaryEmbedding

    for impl in ("reference", "sdpa"):
        cfg, gqa = _family_attention(family, variant, keys, impl, num_kv_heads=2)
        _, mha = _family_attention(family, variant, keys, impl, num_kv_heads=4)
        torch.manual_seed(5)
        with torch.no_grad():
            for name, p in gqa.named_parameters():
                p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name else torch.randn_like(p) * 0.2)
            state = {}
            for name, p in gqa.named_parameters():
                repeat = name.startswith(("k_proj", "v_proj")) or (name == "k_norm.weight"
                                                                    and cfg.qk_norm == "projection")
                state[name] = p.view(2, 16, *p.shape[1:]).repeat_interleave(2, dim=0).flatten(0, 1) if repeat else p
            mha.load_state_dict(state)
        a = torch.randn(2, 13, 64)
        cos, sin = RotaryEmbedding(cfg.rotary_ndims, cfg.rotary_emb_base)(13, torch.float32, a.device)
        outs = []
        for module in (gqa, mha):
            x = a.clone().requires_grad_(True)
            out = module(x, cos, sin)
            out.square().sum().backward()
            outs.append((out, x.grad))
        torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(outs[0][1], outs[1][1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant, keys", GQA_VARIANTS[1:], ids=[v for v, _ in GQA_VARIANTS[1:]])
def test_triton_path_reads_the_key_value_heads_directly(variant, keys):
    """Under grouped-query attention the module hands the kernels ``k``/``v`` with ``H_kv`` heads (no repeat): the
    Triton path (CPU interpreter, float32) equals the reference path in outputs and input gradients."""
    from neox_dar.attention import RotaryEmbedding

    results = []
    for impl in ("reference", "triton"):
        cfg, module = _family_attention("qwen3", variant, keys, impl, num_kv_heads=2)
        torch.manual_seed(6)
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.ndim == 1 else 0.0))
        a = torch.randn(1, 13, 64, generator=torch.Generator().manual_seed(7)).requires_grad_(True)
        cos, sin = RotaryEmbedding(cfg.rotary_ndims, cfg.rotary_emb_base)(13, torch.float32, a.device)
        out = module(a, cos, sin)
        out.square().sum().backward()
        results.append((out.detach(), a.grad))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(results[1][1], results[0][1], atol=1e-3, rtol=1e-3)
