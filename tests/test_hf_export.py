"""``to-hf`` of variant models: a folder that ``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)``
loads (the code of ``neox_dar/standalone`` copied beside the weights, ``auto_map`` in config.json), with our logits,
our greedy generations (``generate()`` on the variant's own cache, batches left-padded), also in a fresh process that
cannot import neox_dar; vanilla models keep exporting the family's class; ``from-hf`` reads an export back."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from tokenizers import Tokenizer
from test_generate import family_model
from transformers import AutoModelForCausalLM

from neox_dar.attention import build_attention
from neox_dar.config import ConfigError
from neox_dar.variants import variants
from neox_dar.convert import main as convert_main
from neox_dar.hf import REMOTE_FILES, from_hf, to_hf
from neox_dar.generate import Sampling, generate
from neox_dar.tokenizer import DEFAULT_TOKENIZER

pytestmark = pytest.mark.usefixtures("one_thread")

CASES = [("gpt_neox", "dar"), ("qwen3", "uniform"), ("llama", "swa"), ("qwen2", "mswa"), ("olmo2", "aha"),
         ("llama", "linear"), ("qwen3", "mixed"), ("olmo2", "dar"), ("qwen2", "dimpo")]


def export(tmp_path, family, variant, seed=0, **keys):
    model = family_model(family, variant, seed=seed, **keys)
    return model, to_hf(model, model.cfg, tmp_path / f"{family}-{variant}", DEFAULT_TOKENIZER)  # presets name none


def load_remote(folder):
    return AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()


def feeds(hf) -> list[tuple[int, bool]]:
    """Record each forward ``hf.generate()`` makes: (new tokens, whether it got the caches back); filled as it runs."""
    calls, forward = [], hf.forward

    def recorded(input_ids, *args, **kwargs):
        given = kwargs.get("cache", kwargs.get("past_key_values"))
        calls.append((input_ids.shape[1], given is not None))
        return forward(input_ids, *args, **kwargs)

    hf.forward = recorded
    return calls


def caches(out):
    """The caches a ``generate(..., return_dict_in_generate=True)`` returned (recent transformers: ``cache``)."""
    return out.cache if "cache" in out else out.past_key_values


@pytest.mark.parametrize("family, variant", CASES, ids=[f"{f}-{v}" for f, v in CASES])
def test_export_loads_with_our_logits_and_generations(tmp_path, family, variant):
    model, folder = export(tmp_path, family, variant)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["NeoxDarForCausalLM"] and set(config["auto_map"]) == {
        "AutoConfig", "AutoModelForCausalLM"}
    assert all((folder / name).is_file() for name in REMOTE_FILES)
    hf = load_remote(folder)
    assert type(hf).__name__ == "NeoxDarForCausalLM"
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 30), generator=g)
    with torch.inference_mode():
        ours, theirs = model(ids), hf(ids).logits
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4 * ours.abs().max().item())
    # greedy generate() of a left-padded batch of unequal prompts: our tokens, row by row
    prompts = [ids[0, :11], ids[1, :4]]
    mine = [c.token_ids for c in generate(model, prompts, 24)]
    batch = torch.zeros(2, 11, dtype=torch.long)
    mask = torch.zeros(2, 11, dtype=torch.long)
    for b, p in enumerate(prompts):
        batch[b, 11 - p.numel():], mask[b, 11 - p.numel():] = p, 1
    fed = feeds(hf)
    out = hf.generate(batch, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=None,
                      pad_token_id=0, return_dict_in_generate=True)
    assert out.sequences[:, 11:].tolist() == mine
    assert fed == [(11, False)] + [(1, True)] * 23  # one token a step through the caches (not the whole sequence)
    # sampling with either's defaults (transformers': top_k 50): the same tokens for the same seed
    torch.manual_seed(3)
    sampled = hf.generate(ids[:1, :7], max_new_tokens=12, do_sample=True, temperature=1.5, eos_token_id=None,
                          pad_token_id=0)[0, 7:].tolist()
    assert generate(model, [ids[0, :7]], 12, sampling=Sampling(1.5), seeds=[3])[0].token_ids == sampled
    # the variant's own caches (classes of the folder's copy of inference.py), not a DynamicCache
    with torch.inference_mode():
        ours = model.new_cache([11, 4], 24)
    assert type(caches(out)).__name__ == "ModelCache"
    assert [type(c).__name__ for c in caches(out).layers] == [type(c).__name__ for c in ours.layers]


@pytest.mark.parametrize("mode", ["keys", "latent"])
def test_dar_export_decodes_through_the_compressed_cache(tmp_path, mode):
    """generate() of the export keeps DAR's cache: k_loc, v_loc of the window and dar_down(h) per token (and the
    far keys' rotated dims unless ``dar_inference_cache: latent``), the bytes ``neox_dar.generate`` keeps for the
    same tokens."""
    model, folder = export(tmp_path, "llama", "dar", dar_inference_cache=mode)
    hf = load_remote(folder)
    prompt = torch.arange(10, 30)[None]
    fed = feeds(hf)
    out = hf.generate(prompt, max_new_tokens=9, do_sample=False, eos_token_id=None, return_dict_in_generate=True)
    assert fed == [(20, False)] + [(1, True)] * 8  # each step reads the cache the step before wrote
    layers = caches(out).layers
    assert all(type(c).__name__ == "DARCache" for c in layers)
    columns = caches(out).layout.length  # the last token is never fed back
    assert columns == 20 + 8
    ours = model.new_cache([columns - 1], 1)
    assert [c.near.nbytes() for c in layers] == [c.near.nbytes() for c in ours.layers]
    assert all(c.far.data["c"].shape[-1] == model.cfg.attention.dar_d_down for c in layers)
    assert all(set(c.far.data) == ({"c", "k"} if mode == "keys" else {"c"}) for c in layers)


def test_generate_continues_from_the_caches_it_returned(tmp_path):
    """A left-padded batch generated in two calls, the second given the first's caches back (``cache=``, or
    ``past_key_values=`` under transformers' older name), gives the tokens of one call; the second call feeds one
    token a step into those caches (it raised transformers' errors before: the caches lacked what generate() asks)."""
    _, folder = export(tmp_path, "llama", "dar")
    hf = load_remote(folder)
    batch = torch.tensor([[0, 0, 5, 9, 13, 2], [7, 3, 8, 1, 4, 6]])
    mask = (torch.arange(6) >= torch.tensor([[2], [0]])).long()
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    whole = hf.generate(batch, attention_mask=mask, max_new_tokens=10, **kw)
    first = hf.generate(batch, attention_mask=mask, max_new_tokens=4, return_dict_in_generate=True, **kw)
    longer = torch.cat([mask, torch.ones(2, 4, dtype=torch.long)], 1)
    fed = feeds(hf)
    name = "cache" if "cache" in first else "past_key_values"
    more = hf.generate(first.sequences, attention_mask=longer, max_new_tokens=6, **{name: caches(first)}, **kw)
    assert more.tolist() == whole.tolist()
    assert fed == [(1, True)] * 6


@pytest.mark.parametrize("name", sorted(variants()))
def test_each_variant_is_the_layer_type_it_exports_as(name):
    """One implementation: a built-in variant's module is an instance of the exported layer type its entry of
    ``neox_dar_layers`` names, so the export builds, caches and decodes with the code ``neox_dar.generate`` runs."""
    from builders import model_config

    from neox_dar.standalone.modeling_neox_dar import LAYER_TYPES

    layer = build_attention(model_config(num_layers=2, hidden_size=64, num_attention_heads=4, window_size=4,
                                         attention_type=name), 1)
    layer_type = LAYER_TYPES[layer.export_spec()["type"]]
    assert isinstance(layer, layer_type) and type(layer).decode is layer_type.decode


def test_every_layer_type_of_the_package_is_known_without_a_list():
    """The layer types an export may name are those the modules of ``neox_dar/standalone`` define, found there:
    every registered variant's, and nothing else."""
    from builders import model_config

    from neox_dar.standalone.layer_types import LAYER_TYPES

    exported = {build_attention(model_config(num_layers=2, hidden_size=64, num_attention_heads=4, window_size=4,
                                             attention_type=name), 1).export_spec()["type"] for name, spec in variants().items()
                if spec.__module__.startswith("neox_dar.")}  # the shipped variants
    assert set(LAYER_TYPES) == exported
    assert all(cls.__module__ == f"neox_dar.standalone.{cls.__module__.rpartition('.')[2]}"
               for cls in LAYER_TYPES.values())


def test_the_export_imports_its_layer_types_by_name(tmp_path):
    """An exported folder's ``layer_types.py`` imports, by name, the module of every layer type of the package (what
    transformers copies beside ``modeling_neox_dar.py``), so exports of different layer types hold the same code and
    load in one process (transformers reuses the model class of a config class it has loaded); the model loaded
    from it has its layers' classes."""
    from neox_dar.hf.remote import layer_types_source
    from neox_dar.standalone.layer_types import LAYER_TYPES

    model, folder = export(tmp_path, "qwen3", "mixed")
    layers = json.loads((folder / "config.json").read_text())["neox_dar_layers"]
    source = (folder / "layer_types.py").read_text()
    assert source == layer_types_source(layers)
    assert sorted(line for line in source.splitlines() if line.startswith("from .")) == sorted(
        f"from .{cls.__module__.rpartition('.')[2]} import {cls.__name__}" for cls in LAYER_TYPES.values())
    hf = load_remote(folder)
    assert [type(layer.attn).__name__ for layer in hf.model.layers] == [
        "LinearLayer", "WindowedLayer", "DARLayer", "AHALayer"]
    other_model = family_model("qwen3", "dimpo")  # another model, its folder of the same name, in this process
    other = to_hf(other_model, other_model.cfg, tmp_path / "again" / folder.name, DEFAULT_TOKENIZER)
    assert (other / "layer_types.py").read_text() == source
    assert type(load_remote(other).model.layers[0].attn).__name__ == "DimPOLayer"
    with pytest.raises(ConfigError, match="layer type 'toy' is defined by no module of neox_dar/standalone"):
        layer_types_source([{"type": "toy"}])


# config.json's neox_dar_block of two exports, as exports have written it (the names of BlockShape's fields, in order)
BLOCK_JSON = {
    "gpt_neox": '{"family": "gpt_neox", "names": {"decoder": "gpt_neox", "embed": "embed_in", "final_norm": '
                '"final_layer_norm", "head": "embed_out", "attention": "attention"}, "norm": "layernorm", "norm_eps": '
                '1e-05, "rms_weight_in_float32": false, "norm_position": "pre", "parallel_residual": true, "qk_norm": '
                '"none", "activation": "gelu", "fused_qkv": true, "qkv_bias": true, "attention_out_bias": true, '
                '"mlp_bias": true, "rotary_ndims": 4, "rope_theta": 10000, "rope_scaling": null}',
    "llama": '{"family": "llama", "names": {"decoder": "model", "embed": "embed_tokens", "final_norm": "norm", "head": '
             '"lm_head", "attention": "self_attn"}, "norm": "rmsnorm", "norm_eps": 1e-05, "rms_weight_in_float32": '
             'false, "norm_position": "pre", "parallel_residual": false, "qk_norm": "none", "activation": "swiglu", '
             '"fused_qkv": false, "qkv_bias": false, "attention_out_bias": false, "mlp_bias": false, "rotary_ndims": '
             '16, "rope_theta": 500000, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, '
             '"high_freq_factor": 4.0, "original_max_position_embeddings": 64}}',
}
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize("family", sorted(BLOCK_JSON))
def test_the_block_record_keeps_config_json_as_exports_wrote_it(tmp_path, family):
    """``neox_dar_block`` is one typed record (:class:`~neox_dar.standalone.block.BlockShape`) that the export writes
    and the exported model reads: the export writes it as before, key order included, with the fields added since
    at the end (``rotary_in_float32``), and a folder whose ``config.json`` holds the block as written before (text
    replaced) loads with our logits, the new fields at their defaults."""
    from neox_dar.standalone.block import BlockShape

    model, folder = export(tmp_path, family, "dar", **({"rope_scaling": LLAMA3} if family == "llama" else {}))
    config = json.loads((folder / "config.json").read_text())
    now = BLOCK_JSON[family][:-1] + ', "rotary_in_float32": false}'
    assert json.dumps(config["neox_dar_block"]) == now
    text = json.dumps({**config, "neox_dar_block": "BLOCK"}, indent=2).replace('"BLOCK"', BLOCK_JSON[family])
    (folder / "config.json").write_text(text)
    block = BlockShape.from_json(json.loads(BLOCK_JSON[family]))
    assert json.dumps(block.to_json()) == now
    hf = load_remote(folder)
    assert type(hf.config.block).__name__ == "BlockShape" and hf.config.block.to_json() == block.to_json()
    ids = torch.arange(20)[None]
    with torch.inference_mode():
        ours = model(ids)
        torch.testing.assert_close(hf(ids).logits, ours, rtol=1e-4, atol=1e-4 * ours.abs().max().item())
    with pytest.raises(TypeError, match="unexpected keyword argument 'norm_epsilon'"):
        BlockShape.from_json({**json.loads(BLOCK_JSON[family]), "norm_epsilon": 1e-5})


def test_fresh_process_without_neox_dar_generates_our_tokens(tmp_path):
    """The exported DAR folder in a new interpreter where ``import neox_dar`` fails: transformers loads it from
    the saved files alone and greedy generate() gives our tokens. Its tokenizer loads without running the folder's
    code, with ``trust_remote_code=False`` or unset (no terminal: transformers' question defaults to no)."""
    model, folder = export(tmp_path, "gpt_neox", "dar", seed=3)
    prompt = list(range(100, 113))
    ours = generate(model, [prompt], 32, eos_ids=(0,))[0].token_ids
    expected_ids = Tokenizer.from_file(str(DEFAULT_TOKENIZER)).encode("The cat").ids
    script = textwrap.dedent(f"""
        import json, sys
        sys.modules["neox_dar"] = None  # any import of neox_dar fails
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        # the tokenizer needs no remote code: refused explicitly, or left unset with no terminal to ask on
        for kwargs in ({{"trust_remote_code": False}}, {{}}):
            tokenizer = AutoTokenizer.from_pretrained({str(folder)!r}, **kwargs)
            assert tokenizer("The cat").input_ids == {expected_ids}, tokenizer("The cat").input_ids
        assert not any(name.startswith("transformers_modules") for name in sys.modules)
        print()  # transformers' unanswered question ends without a newline
        model = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        out = model.generate(torch.tensor([{prompt}]), max_new_tokens=32, do_sample=False)
        assert not any(name.startswith("neox_dar") for name in sys.modules if sys.modules[name] is not None)
        print(json.dumps({{"ids": out[0, {len(prompt)}:].tolist(), "class": type(model).__module__}}))
    """)
    env = {"PATH": "/usr/bin:/bin", "HF_HOME": str(tmp_path / "hf_home"), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["ids"] == ours and result["class"].startswith("transformers_modules.")


def test_vanilla_exports_the_family_class_and_variants_read_back(tmp_path, capsys):
    """Vanilla: the family's own class, no modeling code. A variant export read by ``from-hf`` is our model again;
    the command line exports a DAR run."""
    model, folder = export(tmp_path, "qwen3", "vanilla")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and "auto_map" not in config
    assert not any((folder / name).exists() for name in REMOTE_FILES)
    model, folder = export(tmp_path, "olmo2", "mixed")
    back, cfg = from_hf(folder)
    assert cfg.attention.attention_type == model.cfg.attention.attention_type
    ids = torch.arange(40)[None]
    with torch.inference_mode():
        torch.testing.assert_close(back.eval()(ids), model(ids))
    from builders import saved_run

    saved_run(tmp_path / "run", "attention_type=dar", "window_size=4")
    assert convert_main(["to-hf", str(tmp_path / "run"), str(tmp_path / "run_hf")]) == 0
    assert json.loads((tmp_path / "run_hf" / "config.json").read_text())["neox_dar_layers"][0] == {
        "type": "dar", "window": 4, "d_down": 16, "cache": "keys"}
    assert json.loads((tmp_path / "run_hf" / "generation_config.json").read_text())["suppress_tokens"] == list(
        range(50277, 50304))


def test_an_export_changed_by_transformers_imports_as_transformers_runs_it(tmp_path):
    """transformers keeps ``neox_dar_config`` when it saves a folder it loaded, and runs its own keys: those win on
    import, each with a warning. (Before: after ``resize_token_embeddings`` the import failed on the head's shape,
    and an edited ``rms_norm_eps`` was ignored: logits off by 2.6.)"""
    _, folder = export(tmp_path, "llama", "vanilla", vocab_size=261)
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    hf.resize_token_embeddings(264, mean_resizing=False)
    hf.config.rms_norm_eps = 0.1
    hf.save_pretrained(tmp_path / "changed")
    assert "neox_dar_config" in json.loads((tmp_path / "changed" / "config.json").read_text())
    with pytest.warns(UserWarning) as seen:
        back, cfg = from_hf(tmp_path / "changed")
    said = sorted(str(w.message).split(": ", 1)[1].split(" but")[0] for w in seen)
    assert said == ["rms_norm_eps is 0.1", "vocab_size is 264"]
    assert (cfg.padded_vocab_size, cfg.rms_norm_epsilon) == (264, 0.1)
    ids = torch.arange(30)[None] * 8
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "changed")  # its modules built with the new eps
    with torch.inference_mode():
        torch.testing.assert_close(back.eval()(ids), reloaded(ids).logits)
    # a key the command line sets is neither an edit of the folder nor warned (it said "rope_theta is 10000 but
    # its neox_dar_config says 500 (the folder was changed after its export...)" for the user's own override),
    # while the folder's real edits still are
    with pytest.warns(UserWarning) as seen:
        _, cfg = from_hf(tmp_path / "changed", overrides={"rotary_emb_base": 500.0, "rms_norm_epsilon": 0.2})
    assert [str(w.message).split(": ", 1)[1].split(" but")[0] for w in seen] == ["vocab_size is 264"]
    assert (cfg.rotary_emb_base, cfg.rms_norm_epsilon, cfg.padded_vocab_size) == (500.0, 0.2, 264)


def test_from_hf_takes_a_layer_layout_alone(tmp_path):
    """``attention_config`` on the command line replaces the import's layout: it is not refused for conflicting
    with the ``attention_type`` of the folder (a vanilla class's, or an export's ``neox_dar_config``)."""
    from builders import hf_folder

    hf_folder(tmp_path / "hf", "llama")
    _, folder = export(tmp_path, "qwen3", "vanilla")
    for source in (tmp_path / "hf", folder):
        _, cfg = from_hf(source, overrides={"attention_config": [[["dar", "swa"], 1]]})
        assert cfg.attention.attention_type == "dar+swa"
