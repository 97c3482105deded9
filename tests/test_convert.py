"""Conversion command line: checkpoint -> Hugging Face (weights, config, tokenizer) -> checkpoint, and its errors."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import AutoTokenizer, GenerationConfig

from neox_dar.saved_model import load_model, save_weights
from neox_dar.config import ConfigError, load_config
from neox_dar.hf import config_from_hf, to_hf
from neox_dar.evaluation.corpora import load_local
from neox_dar.evaluation.loading import load_for_eval
from neox_dar.model import build_model

from builders import hf_folder, hf_tiny, saved_model
from neox_dar.tiny_hf_model import write_tokenizer_files
from neox_dar.tokenizer import load_tokenizer, tokenizer_file

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, "-m", "neox_dar.convert", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT)


def convert(capsys, *args) -> subprocess.CompletedProcess:
    """The same command as :func:`run` by its ``main`` in this process (no interpreter start-up): its exit status and
    what it printed."""
    from neox_dar.convert import main

    capsys.readouterr()
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["convert", *args], code, out.out, out.err)


def test_cli_round_trip_keeps_every_weight(tmp_path):
    cfg = load_config(ROOT / "configs/tiny.yml").model
    torch.manual_seed(1)
    model = build_model(cfg)
    save_weights(model, cfg, tmp_path / "ckpt")
    r = run("to-hf", tmp_path / "ckpt", tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    hf_config = json.loads((tmp_path / "hf/config.json").read_text())
    assert hf_config["vocab_size"] == 50304 and hf_config["rotary_pct"] == 0.25
    assert "embed_out.weight" in load_file(str(tmp_path / "hf/model.safetensors"))
    r = run("from-hf", tmp_path / "hf", tmp_path / "back")
    assert r.returncode == 0, r.stderr
    back, back_cfg = load_model(tmp_path / "back")
    assert back_cfg == cfg
    for (name, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), name


def test_to_hf_writes_the_dtype_asked_for(tmp_path, capsys):
    """``to-hf --dtype bfloat16``: the weights in bfloat16 (half the bytes; float32 by default) and config.json's
    torch_dtype saying so; transformers loads it, and from-hf takes the bfloat16 weights back as they are."""
    from transformers import GPTNeoXForCausalLM

    model, cfg = saved_model(tmp_path / "ckpt", seed=3)
    assert convert(capsys, "to-hf", tmp_path / "ckpt", tmp_path / "hf", "--dtype", "bfloat16").returncode == 0
    tensors = load_file(str(tmp_path / "hf/model.safetensors"))
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "hf/config.json").read_text())["torch_dtype"] == "bfloat16"
    theirs = GPTNeoXForCausalLM.from_pretrained(tmp_path / "hf")
    assert theirs.dtype == torch.bfloat16
    ours = dict(model.weights())
    assert all(torch.equal(t, ours[k].to(torch.bfloat16)) for k, t in tensors.items())
    assert convert(capsys, "from-hf", tmp_path / "hf", tmp_path / "back").returncode == 0
    back, _ = load_model(tmp_path / "back")
    assert all(torch.equal(t, tensors[k]) for k, t in back.weights().items())


def test_cli_errors_are_one_line(tmp_path):
    r = run("from-hf", tmp_path, tmp_path / "out")
    assert r.returncode == 2 and "no config.json" in r.stderr and r.stderr.strip().count("\n") == 0
    r = run("to-hf", tmp_path / "missing", tmp_path / "out")
    assert r.returncode == 2 and str(tmp_path / "missing") in r.stderr and r.stderr.strip().count("\n") == 0


def test_to_hf_writes_the_runs_tokenizer(tmp_path, capsys):
    """The export is complete for transformers: AutoTokenizer loads it, with the run's own tokenizer.json (byte for
    byte) and bos = eos = unk = <|endoftext|>; config.json and generation_config.json name its id."""
    saved_model(tmp_path / "ckpt", seed=2)
    r = convert(capsys, "to-hf", tmp_path / "ckpt", tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    hf = tmp_path / "hf"
    assert (hf / "tokenizer.json").read_bytes() == (ROOT / "data/20B_tokenizer.json").read_bytes()
    tok = AutoTokenizer.from_pretrained(hf)
    assert tok.bos_token == tok.eos_token == tok.unk_token == "<|endoftext|>" and tok.eos_token_id == 0
    assert tok.model_max_length == 2048
    raw = Tokenizer.from_file(str(ROOT / "data/20B_tokenizer.json"))
    texts = [d.text for d in load_local("c4")[:5]] + ["  two  spaces\n\ttab", "ünïcödé 日本 🙂", "<|endoftext|>x"]
    for text in texts:
        ids = raw.encode(text, add_special_tokens=False).ids
        assert tok(text)["input_ids"] == ids
        assert tok.decode(ids) == raw.decode(ids, skip_special_tokens=False)
    assert json.loads((hf / "special_tokens_map.json").read_text()) == {
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    config = json.loads((hf / "config.json").read_text())
    assert config["bos_token_id"] == config["eos_token_id"] == 0
    generation = GenerationConfig.from_pretrained(hf)
    assert generation.eos_token_id == 0 and generation.bos_token_id == 0


def test_to_hf_tokenizer_follows_the_config_and_the_command_line(tmp_path, capsys):
    other = tmp_path / "other.json"
    raw = json.loads((ROOT / "data/20B_tokenizer.json").read_text())
    raw["added_tokens"] = [t for t in raw["added_tokens"] if t["content"] != "<|endoftext|>"]
    del raw["model"]["vocab"]["<|endoftext|>"]
    other.write_text(json.dumps(raw))
    saved_model(tmp_path / "ckpt", f"vocab_file={tmp_path / 'gone.json'}", seed=2)
    r = convert(capsys, "to-hf", tmp_path / "ckpt", tmp_path / "hf")
    assert r.returncode == 2 and "gone.json" in r.stderr and r.stderr.strip().count("\n") == 0
    r = convert(capsys, "to-hf", tmp_path / "ckpt", tmp_path / "hf", "--tokenizer", other)
    assert r.returncode == 2 and "'<|endoftext|>' is not in the vocabulary" in r.stderr
    r = convert(capsys, "to-hf", tmp_path / "ckpt", tmp_path / "hf", "--tokenizer", ROOT / "data/20B_tokenizer.json")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "hf/tokenizer.json").is_file()


def test_from_hf_keeps_the_folders_tokenizer(tmp_path, capsys):
    """from-hf copies the folder's tokenizer files beside the weights, where evaluation finds them first."""
    _, cfg = saved_model(tmp_path / "ckpt", seed=2)
    model, _ = load_model(tmp_path / "ckpt")
    hf = tmp_path / "hf"
    to_hf(model, cfg, hf)
    raw = json.loads((hf / "tokenizer.json").read_text())
    raw["model"]["vocab"]["<|marker|>"] = len(raw["model"]["vocab"])  # a tokenizer other than the bundled one
    (hf / "tokenizer.json").write_text(json.dumps(raw))
    r = convert(capsys, "from-hf", hf, tmp_path / "back")
    assert r.returncode == 0, r.stderr
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / "back" / name).read_bytes() == (hf / name).read_bytes(), name
    loaded = load_for_eval(tmp_path / "back")
    assert tokenizer_file(loaded.cfg, model_dir=loaded.model_dir) == tmp_path / "back" / "tokenizer.json"
    assert load_tokenizer(loaded.cfg, model_dir=loaded.model_dir).token_to_id("<|marker|>") is not None


# ----------------------------------------------------------------------------------------------
# from-hf on bad folders: one line, exit 2, nothing written


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    """A tiny random Llama folder (six safetensors shards and their index) with the Pythia tokenizer (more ids than
    its 96 embedding rows: the tests change the folder before the import reaches that check)."""
    folder = tmp_path_factory.mktemp("llama_hf")
    hf_folder(folder, "llama", shard="60KB")
    write_tokenizer_files(folder)
    return folder


def _edit_config(edit):
    def apply(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(edit(config)))
    return apply


def _edit_tensor(name: str, change):
    """Rewrite the shard holding ``name`` with ``change(tensor)`` in its place."""
    def apply(folder: Path) -> None:
        shard = folder / json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][name]
        tensors = load_file(str(shard))
        tensors[name] = change(tensors[name])
        save_file(tensors, str(shard), metadata={"format": "pt"})
    return apply


def _edit_index(path: str):
    def apply(folder: Path) -> None:
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        index["weight_map"]["lm_head.weight"] = path
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return apply


class _Planted:
    def __reduce__(self):
        return (print, ("planted code ran",))


def _pickle_bin(folder: Path) -> None:
    """The folder's weights as a pytorch_model.bin with a planted object among them."""
    state = {"planted": _Planted()}
    for shard in folder.glob("model*.safetensors"):
        state.update(load_file(str(shard)))
    for shard in folder.glob("model*.safetensors*"):
        shard.unlink()
    torch.save(state, folder / "pytorch_model.bin")


def _with_nan(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t[3, 5] = float("nan")
    return t


def _with_inf(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t[0, 0] = float("-inf")
    return t


def _rope_without_factor(config: dict) -> dict:
    del config["rope_parameters"]["factor"]
    return config


def _bin_shards(folder: Path) -> None:
    """The folder's shards named as an older sharded ``.bin`` checkpoint (an index, no safetensors)."""
    index = folder / "model.safetensors.index.json"
    index.rename(folder / "pytorch_model.bin.index.json")
    for shard in folder.glob("model*.safetensors"):
        shard.rename(shard.with_suffix(".bin"))


BAD_FOLDERS = {
    "config-list": (_edit_config(lambda c: [c]), "must hold a JSON object, not a list"),
    "architectures-dict": (_edit_config(lambda c: {**c, "architectures": {"a": 1}}),
                           "'architectures' must be a list of class names"),
    "architectures-string": (_edit_config(lambda c: {**c, "architectures": "LlamaForCausalLM"}),
                             "'architectures' must be a list of class names"),
    "neox_dar_config-string": (_edit_config(lambda c: {**c, "neox_dar_config": "x"}),
                               "'neox_dar_config' must be a mapping"),
    "no-vocab_size": (_edit_config(lambda c: {k: v for k, v in c.items() if k != "vocab_size"}),
                      "'vocab_size' is missing"),
    "vocab_size-string": (_edit_config(lambda c: {**c, "vocab_size": "96"}),
                          "'vocab_size' must be a positive integer, got '96'"),
    "llama3-without-factor": (_edit_config(_rope_without_factor), "llama3 rope scaling lacks 'factor'"),
    "hidden_size-2^40": (_edit_config(lambda c: {**c, "hidden_size": 2 ** 40, "head_dim": 2 ** 38}),
                         "describes a model of at least"),
    "pickle-bin": (_pickle_bin, "pytorch_model.bin: refused"),
    "bool-tensor": (_edit_tensor("model.layers.0.mlp.up_proj.weight", lambda t: t > 0),
                    "model.layers.0.mlp.up_proj.weight is bool, not floating point"),
    "int32-tensor": (_edit_tensor("model.norm.weight", lambda t: t.to(torch.int32)),
                     "model.norm.weight is int32, not floating point"),
    "nan": (_edit_tensor("model.embed_tokens.weight", _with_nan), "model.embed_tokens.weight holds NaN or Inf"),
    "inf": (_edit_tensor("lm_head.weight", _with_inf), "lm_head.weight holds NaN or Inf"),
    "shard-outside": (_edit_index("../outside/x.safetensors"), "names a file outside"),
    "shard-absolute": (_edit_index("/etc/x.safetensors"), "names a file outside"),
    "garbage-tokenizer": (lambda f: (f / "tokenizer.json").write_text('{"model": 3}'),
                          "tokenizer.json is not a Hugging Face tokenizer"),
    "bin-shards": (_bin_shards, "holds .bin shards (pytorch_model.bin.index.json), which are not read"),
    # the folder as it is: Pythia's tokenizer beside a model of 96 embedding rows (imported, then refused by every
    # command that read it)
    "tokenizer-too-large": (lambda f: None, "has ids up to 50276, but the model has 96 embedding rows"),
}


@pytest.mark.parametrize("case", list(BAD_FOLDERS))
def test_from_hf_refuses_a_bad_folder_in_one_line(llama_folder, tmp_path, case, capsys):
    """Each bad folder is refused in one line naming what is wrong, before anything is written; weights from outside
    the folder are never read and a pickle never runs."""
    from neox_dar.convert import main

    folder = tmp_path / "hf"
    shutil.copytree(llama_folder, folder)
    edit, message = BAD_FOLDERS[case]
    edit(folder)
    code = main(["from-hf", str(folder), str(tmp_path / "out")])
    out = capsys.readouterr()
    assert code == 2 and message in out.err and out.err.count("\n") == 1, out.err
    assert "planted code ran" not in out.out + out.err and not (tmp_path / "out").exists()


def test_a_shape_an_override_changes_is_said_to_be_the_overrides(llama_folder, tmp_path, capsys):
    """from-hf with a size override the weights do not have: the line names the override with config.json (it
    blamed config.json alone)."""
    from neox_dar.convert import main

    assert main(["from-hf", str(llama_folder), str(tmp_path / "out"), "intermediate_size=64"]) == 2
    assert "config.json with intermediate_size=64 implies (64, 64)" in capsys.readouterr().err


def test_from_hf_checks_sizes_before_building_a_model(llama_folder, tmp_path):
    """A config.json of ten million layers is refused at once (it hung building the model on the meta device)."""
    folder = tmp_path / "hf"
    shutil.copytree(llama_folder, folder)
    _edit_config(lambda c: {**c, "num_hidden_layers": 1e7})(folder)
    r = subprocess.run([sys.executable, "-m", "neox_dar.convert", "from-hf", folder, tmp_path / "out"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "describes a model of at least" in r.stderr, r.stderr
    assert "its weight files are incomplete (a download cut short?) or its sizes" in r.stderr  # (said: sizes wrong)


CONFIG_VALUES = [None, "x", [], {}, -1, 0, 1.5, 2 ** 40, float("nan"), float("inf"), True, [1], {"a": 1}]


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_config_from_hf_answers_every_value_with_a_config_or_a_config_error(family):
    """Every key of a real config.json set to every kind of wrong value: a model config or a ConfigError, never
    another exception."""
    model = hf_tiny(family)
    hf, weight_bytes = model.config.to_dict(), 4 * sum(p.numel() for p in model.parameters())
    for key in list(hf):
        for value in CONFIG_VALUES:
            try:
                config_from_hf({**hf, key: value}, weight_bytes=weight_bytes)
            except ConfigError:
                pass


# ----------------------------------------------------------------------------------------------
# the output folder: only an export or import of the same model is replaced


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_convert_refuses_a_folder_that_is_not_an_export_of_the_same_model(tmp_path, capsys):
    """to-hf and from-hf into a run directory, a folder of other files, or an export/import of another model are
    one-line errors naming the folder (exit 2), the folder unchanged; an export or import of the same model is
    replaced (a newer checkpoint of the run exported again)."""
    from builders import saved_run
    from neox_dar.convert import main

    run_a, hf, back, other = tmp_path / "a", tmp_path / "hf", tmp_path / "back", tmp_path / "other"
    saved_run(run_a)
    saved_model(other, "num_layers=1")
    assert main(["to-hf", str(run_a), str(hf)]) == 0
    assert main(["to-hf", str(run_a), str(hf)]) == 0  # the same run's export, replaced
    assert main(["from-hf", str(hf), str(back)]) == 0
    assert main(["from-hf", str(hf), str(back)]) == 0  # the same import, replaced
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine\n")
    capsys.readouterr()
    for argv, folder in ((["from-hf", hf, run_a], run_a), (["to-hf", run_a, run_a], run_a),
                         (["to-hf", run_a, tmp_path / "notes"], tmp_path / "notes"), (["to-hf", other, hf], hf),
                         (["from-hf", hf, other], other)):
        before = _files(folder)
        assert main([str(a) for a in argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("convert error: ") and str(folder) in err and err.count("\n") == 1, err
        assert _files(folder) == before, argv



def test_to_hf_replaces_an_export_whole_or_not_at_all(tmp_path, monkeypatch, capsys):
    """to-hf writes into a folder beside OUT and renames it into place: a failure after the weights are written
    (a full disk before config.json) leaves the earlier export byte for byte and nothing beside it; the next
    export replaces it whole."""
    import errno

    import neox_dar.convert as convert
    import neox_dar.hf.folders as folders
    from builders import saved_run

    first, second, hf = tmp_path / "first", tmp_path / "second", tmp_path / "hf"
    saved_run(first, seed=0)
    saved_run(second, seed=1)  # the same model, other weights (a newer checkpoint)
    assert convert.main(["to-hf", str(first), str(hf)]) == 0
    before = _files(hf)

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(folders, "hf_config_dict", full_disk)
    capsys.readouterr()
    assert convert.main(["to-hf", str(second), str(hf)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert _files(hf) == before and sorted(p.name for p in tmp_path.iterdir()) == ["first", "hf", "second"]
    monkeypatch.undo()
    assert convert.main(["to-hf", str(second), str(hf)]) == 0
    assert _files(hf)["model.safetensors"] != before["model.safetensors"] and _files(hf).keys() == before.keys()


def test_the_tiny_model_command_writes_a_folder_whole_or_refuses_it(tmp_path, capsys):
    """python -m neox_dar.tiny_hf_model: a folder of other files is refused in one line (its save_pretrained wrote
    into it; a file was a traceback), and a second model into an earlier one's folder replaces it whole: no shard of
    the first is left beside the second's index."""
    from neox_dar.tiny_hf_model import main as tiny

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("x")
    assert tiny(["olmo2", str(tmp_path / "notes")]) == 2
    assert "is not empty and holds no config.json" in capsys.readouterr().err
    out = tmp_path / "model"
    byte = ["--vocab", "257", "--tokenizer", str(ROOT / "data" / "byte_tokenizer.json")]
    assert tiny(["olmo2", str(out), *byte, "--shard", "100KB"]) == 0
    assert len(list(out.glob("*.safetensors"))) > 1
    assert tiny(["llama", str(out), *byte]) == 0
    assert [p.name for p in out.glob("*.safetensors")] == ["model.safetensors"]
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    # a vocabulary too small for the tokenizer it ships (the default: Pythia's), or no tokenizer: refused, nothing
    # written (it wrote a 10-token model beside Pythia's 50k-id tokenizer)
    assert tiny(["llama", str(tmp_path / "small"), "--vocab", "10"]) == 2
    assert "--vocab 10 is smaller than the 50277 ids of --tokenizer" in capsys.readouterr().err
    assert tiny(["llama", str(tmp_path / "small"), *byte[:2], "--tokenizer", str(tmp_path / "none.json")]) == 2
    assert "none.json is not a Hugging Face tokenizer.json" in capsys.readouterr().err
    assert not (tmp_path / "small").exists()
