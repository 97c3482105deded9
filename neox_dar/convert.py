"""Convert between neox-dar checkpoints and Hugging Face folders of the families' classes (:mod:`neox_dar.families`:
``GPTNeoXForCausalLM``, ``LlamaForCausalLM``, ``Olmo2ForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``).

    python -m neox_dar.convert to-hf CHECKPOINT OUT_DIR [--tokenizer tokenizer.json]
    python -m neox_dar.convert from-hf HF_DIR OUT_DIR [key=value ...]   # model.safetensors + model.yml + tokenizer

Parameter names are each class's own (:mod:`neox_dar.model`), so nothing is renamed except GPT-NeoX's output head:
exports write ``embed_out.weight`` (the published Pythia name, which transformers 5 maps to ``lm_head.weight`` on
load); imports accept both. ``from-hf`` maps ``config.json`` to our model config (one-line errors for a class or a
setting we cannot honour, or sizes the weight files cannot hold, before any tensor is read; weights only from inside
the folder, and only finite floating-point tensors), builds the model on the meta device and assigns the tensors of
one safetensors shard at a time, memory-mapped (a checkpoint loads in about one model's worth of memory, in its own
dtype), and copies the folder's tokenizer files. ``key=value`` overrides add a variant on top of the imported model
(``attention_type=dar``): its new parameters get the model's ``init_method`` (docs/models.md).

``to-hf`` writes a complete folder: ``config.json``, ``model.safetensors``, the run's tokenizer (the tokenizer
files beside the checkpoint, else the config's ``vocab_file``, else the bundled Pythia tokenizer), the tokenizer's
``tokenizer_config.json``/``special_tokens_map.json`` (imported ones are kept; otherwise bos = eos = unk =
``<|endoftext|>``) and ``generation_config.json`` (which suppresses the vocabulary's padding ids). A vanilla model
exports as the family's class; a model with any other attention layer as ``NeoxDarForCausalLM``, whose code
(every module of :mod:`neox_dar.standalone`: ``modeling_neox_dar.py``, ``configuration_neox_dar.py`` and the
inference code they import, one module per attention layer type) is copied into the folder and named by
``auto_map`` in ``config.json``, for ``from_pretrained(..., trust_remote_code=True)``
(docs/inference.md). Both carry the model config under ``neox_dar_config``, which ``from-hf`` reads back.

``OUT_DIR`` must be new, empty, or an earlier output of the same command for a model of the same config (a newer
checkpoint of the same run exported again), which is then replaced; a run directory, a folder of other files or
another model's export or import is a one-line error naming it (:func:`check_out_dir`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pickle
import shutil
import sys
from pathlib import Path, PurePosixPath

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from transformers import GenerationConfig

from .checkpoint import load_model, read_model_config, save_weights
from .config import ConfigError, ModelConfig, model_config_from_flat, model_flat
from .config.files import parse_override
from .config.schema import key_sections
from .families import FAMILIES
from .model import CausalLM, build_model, init_weights
from .rundir import CHECKPOINTS, CONFIG, MODEL_CONFIG, STATE, CheckpointError, held_checkpoint, staged_dir
from .tokenizer import SPECIAL_TOKENS, TOKENIZER_FILES, copy_tokenizer, special_token_ids, tokenizer_file

# Buffers that some published GPT-NeoX checkpoints carry and that hold no learned state.
_IGNORED_SUFFIXES = (".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq", "rotary_emb.inv_freq")


# ----------------------------------------------------------------------------------------------
# config.json <-> model config


LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _rope(hf: dict, where: str) -> tuple[float, dict | None, float | None]:
    """``(theta, llama3 scaling or None, partial rotary factor or None)`` from transformers 5's
    ``rope_parameters`` or transformers 4's ``rope_theta``/``rope_scaling``."""
    params, scaling = hf.get("rope_parameters") or {}, hf.get("rope_scaling") or {}
    for key, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {key!r} must be a mapping, got {value!r}")
    scaling = scaling or params
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    theta = params.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10000)))
    if kind not in ("default", "llama3"):
        raise ConfigError(f"{where}: rope type {kind!r} is not supported (default, llama3)")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < math.inf:
        raise ConfigError(f"{where}: rope_theta must be a positive number, got {theta!r}")
    llama3 = None
    if kind == "llama3":
        if missing := [k for k in LLAMA3_KEYS if k not in scaling]:
            raise ConfigError(f"{where}: llama3 rope scaling lacks {', '.join(map(repr, missing))}")
        llama3 = {k: scaling[k] for k in LLAMA3_KEYS}
    theta = int(theta) if float(theta).is_integer() else theta  # rotary_emb_base is GPT-NeoX's int
    return theta, llama3, params.get("partial_rotary_factor")


def _size(hf: dict, key: str, where: str, default: int | None = None) -> int:
    """``hf[key]`` (``default`` when absent or null) as a positive int (``1e7`` reads as 10000000); a ConfigError
    when it is missing or not a positive whole number."""
    value = hf.get(key)
    value = default if value is None else value
    if value is None:
        raise ConfigError(f"{where}: {key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1 \
            or (isinstance(value, float) and not value.is_integer()):
        raise ConfigError(f"{where}: {key!r} must be a positive integer, got {value!r}")
    return int(value)


def _check_size(keys: dict, weight_bytes: int | None, where: str) -> None:
    """ConfigError when the model of ``keys`` (flat, before validation) holds more parameters than ``weight_bytes``
    of weight files can store (one byte each at the least): wrong sizes are caught before anything is built.

    The bound counts only what every family has: the embedding (vocab x hidden) and, per layer, the query
    projection (hidden x heads * head_dim) and the MLP (hidden x intermediate); a size that is absent or not a
    positive int counts as 1 (the config's own validation reports it)."""
    def n(key: str) -> int:
        value = keys.get(key)
        return value if type(value) is int and value > 0 else 1

    width = n("num_attention_heads") * n("head_dim") if keys.get("head_dim") else n("hidden_size")
    least = n("vocab_size") * n("hidden_size") + n("num_layers") * n("hidden_size") * (width + n("intermediate_size"))
    if weight_bytes is not None and least > weight_bytes:
        raise ConfigError(f"{where} describes a model of at least {least:,} parameters, but its weight files hold "
                          f"{weight_bytes:,} bytes: its sizes (num_hidden_layers, hidden_size, vocab_size, ...) are "
                          "wrong")


def config_from_hf(hf: dict, where: str = "config.json", overrides: dict | None = None,
                   weight_bytes: int | None = None) -> ModelConfig:
    """Our model config for a Hugging Face ``config.json`` (``overrides``: flat keys on top, e.g. a variant).
    Exports of this project carry their own model config (``neox_dar_config``); exports of older versions carried
    the whole run config there, whose non-model keys are dropped. ``weight_bytes``: the size of the folder's weight
    files, which must be able to hold the model (:func:`_check_size`, before the config is validated)."""
    overrides = overrides or {}
    if not isinstance(hf, dict):
        raise ConfigError(f"{where} must hold a JSON object, not a {type(hf).__name__}")
    if "neox_dar_config" in hf:
        if not isinstance(hf["neox_dar_config"], dict):
            raise ConfigError(f"{where}: 'neox_dar_config' must be a mapping of model config keys, got "
                              f"{hf['neox_dar_config']!r}")
        sections = key_sections()
        keys = {k: v for k, v in hf["neox_dar_config"].items() if sections.get(k) in ("model", "attention")}
        _check_size({**keys, **overrides}, weight_bytes, where)
        return model_config_from_flat({**keys, **overrides}, source=f"{where}:neox_dar_config")
    # a config.json without architectures (older Pythia ones) is the family its model_type names
    typed = FAMILIES.get(hf["model_type"]) if isinstance(hf.get("model_type"), str) else None
    archs = hf.get("architectures") or [typed.hf_class if typed else "?"]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ConfigError(f"{where}: 'architectures' must be a list of class names such as [\"LlamaForCausalLM\"], "
                          f"got {archs!r}")
    family = next((f for f in FAMILIES.values() if f.hf_class == archs[0]), None)
    if family is None:
        raise ConfigError(f"{where}: architectures {archs} is not supported (supported: "
                          f"{', '.join(f.hf_class for f in FAMILIES.values())})")
    theta, llama3, partial = _rope(hf, where)
    vocab, hidden, heads = (_size(hf, k, where) for k in ("vocab_size", "hidden_size", "num_attention_heads"))
    positions = _size(hf, "max_position_embeddings", where, 2048)
    keys = {
        "model_family": family.name,
        "num_layers": _size(hf, "num_hidden_layers", where),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": _size(hf, "num_key_value_heads", where, heads),
        "intermediate_size": _size(hf, "intermediate_size", where, 4 * hidden),
        "max_position_embeddings": positions,
        "seq_length": min(2048, positions),
        "rotary_emb_base": theta,
        "rope_scaling": llama3,
        "vocab_size": vocab,
        "make_vocab_size_divisible_by": 128 if vocab % 128 == 0 else 1,
        "no_weight_tying": not hf.get("tie_word_embeddings", False),
        "init_method_std": hf.get("initializer_range", 0.02),
        "attention_type": "vanilla",
    }
    if hf.get("head_dim"):
        keys["head_dim"] = hf["head_dim"]
    _check_size({**keys, **overrides}, weight_bytes, where)
    act = hf.get("hidden_act", family.hidden_act)
    if act != family.hidden_act:
        raise ConfigError(f"{where}: hidden_act {act!r} is not supported for {family.hf_class} (only "
                          f"{family.hidden_act!r})")
    layer_types = hf.get("layer_types") or ()
    windowed = hf.get("use_sliding_window", hf.get("sliding_window") is not None)  # Qwen's switch, else the window
    if windowed or "sliding_attention" in (layer_types if isinstance(layer_types, list) else ()):
        raise ConfigError(f"{where}: sliding_window (use_sliding_window) / sliding_attention layers are not "
                          "supported; use our attention_type: swa on a full-attention import instead")
    keys.update(family.fixed, **family.import_keys)
    if partial is not None:  # transformers 5's partial_rotary_factor; GPT-NeoX's own rotary_pct comes first
        keys["rotary_pct"] = partial
    for key in family.hf_keys:
        for ours in key.ours if key.read else ():
            keys[ours] = hf[key.hf] if key.hf in hf else keys.get(ours, key.default)
    return model_config_from_flat({**keys, **overrides}, source=where)


def export_problems(cfg: ModelConfig) -> list[str]:
    """What the family's Hugging Face class cannot express of ``cfg`` (empty when the export is faithful)."""
    family = FAMILIES[cfg.model_family]
    problems = [f"{k}={getattr(cfg, k)!r} (the class needs {v!r})" for k, v in family.fixed.items()
                if getattr(cfg, k) != v]
    for key in family.hf_keys:
        if len({getattr(cfg, ours) for ours in key.ours}) > 1:
            problems.append(f"{' != '.join(key.ours)} (the class has one {key.hf})")
    return problems


REMOTE_CODE = Path(__file__).resolve().parent / "standalone"
REMOTE_FILES = tuple(sorted(p.name for p in REMOTE_CODE.glob("*.py") if p.name != "__init__.py"))  # all of it


def shape_keys(cfg: ModelConfig, special_ids: dict[str, int | None]) -> dict:
    """The ``config.json`` keys of every export: sizes, tying, the tokenizer's bos/eos ids, dtype, and our model
    config (``neox_dar_config``, which ``from-hf`` reads back)."""
    return {
        "vocab_size": cfg.padded_vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": not cfg.no_weight_tying,
        "initializer_range": cfg.init_method_std,
        "bos_token_id": special_ids["bos"],
        "eos_token_id": special_ids["eos"],
        "torch_dtype": "float32",
        "neox_dar_config": model_flat(cfg),
    }


def remote_config_dict(cfg: ModelConfig, layers: list[dict], special_ids: dict[str, int | None]) -> dict:
    """The ``config.json`` of ``NeoxDarForCausalLM`` (:mod:`neox_dar.standalone`) for ``cfg`` and its layers'
    :meth:`~neox_dar.attention.Attention.export_spec` descriptions."""
    scaling = None if cfg.rope_scaling is None else dataclasses.asdict(cfg.rope_scaling)
    rms = cfg.norm == "rmsnorm"
    family = FAMILIES[cfg.model_family]
    return {
        "architectures": ["NeoxDarForCausalLM"],
        "model_type": "neox_dar",
        "auto_map": {"AutoConfig": "configuration_neox_dar.NeoxDarConfig",
                     "AutoModelForCausalLM": "modeling_neox_dar.NeoxDarForCausalLM"},
        **shape_keys(cfg, special_ids),
        "neox_dar_block": {
            "family": family.name, "names": dataclasses.asdict(family.names), "norm": cfg.norm,
            "norm_eps": cfg.rms_norm_epsilon if rms else cfg.layernorm_epsilon,
            "rms_weight_in_float32": family.rms_weight_in_float32, "norm_position": cfg.norm_position,
            "parallel_residual": cfg.gpt_j_residual, "qk_norm": cfg.qk_norm, "activation": cfg.activation,
            "fused_qkv": cfg.fused_qkv, "qkv_bias": cfg.qkv_bias, "attention_out_bias": cfg.attention_out_bias,
            "mlp_bias": cfg.mlp_bias, "rotary_ndims": cfg.rotary_ndims, "rope_theta": cfg.rotary_emb_base,
            "rope_scaling": scaling},
        "neox_dar_layers": layers,
    }


def hf_config_dict(cfg: ModelConfig, special_ids: dict[str, int | None] | None = None) -> dict:
    """The ``config.json`` of the family's Hugging Face class equal to ``cfg``'s vanilla model; ``special_ids``:
    the tokenizer's ``{"bos", "eos"}`` ids (default: ``<|endoftext|>`` = 0 of the Pythia tokenizer)."""
    special_ids = special_ids or {"bos": 0, "eos": 0}
    family = FAMILIES[cfg.model_family]
    rope = {"rope_type": "default", "rope_theta": float(cfg.rotary_emb_base)}
    if cfg.rope_scaling is not None:
        rope = {**rope, **dataclasses.asdict(cfg.rope_scaling)}
    params = rope if "rotary_pct" in family.fixed else {**rope, "partial_rotary_factor": cfg.rotary_pct}
    return {
        "architectures": [family.hf_class],
        "model_type": family.name,
        **shape_keys(cfg, special_ids),
        "attention_dropout": cfg.attention_dropout,
        # transformers 4 reads rope_theta / rope_scaling, transformers 5 rope_parameters
        "rope_theta": float(cfg.rotary_emb_base),
        "rope_scaling": rope if cfg.rope_scaling is not None else None,
        "rope_parameters": params,
        "hidden_act": family.hidden_act,
        **{key.hf: getattr(cfg, key.ours[0]) for key in family.hf_keys},
        **family.hf_extra,
    }


# ----------------------------------------------------------------------------------------------
# tokenizer files


def write_tokenizer(tokenizer_json: str | Path, cfg: ModelConfig, out: Path) -> dict[str, int | None]:
    """Copy ``tokenizer_json`` to ``out/tokenizer.json`` with the files that travel with it
    (:func:`neox_dar.tokenizer.copy_tokenizer`: an imported or recorded model's ``tokenizer_config.json`` with its
    special tokens and chat template, ``chat_template.jinja``, ``special_tokens_map.json``), else Pythia's special
    tokens (bos = eos = unk = ``<|endoftext|>``); write ``generation_config.json`` (bos, eos, the padding ids
    suppressed); returns the ``{"bos", "eos"}`` ids for ``config.json``.

    The tokenizer files are the run's own, unchanged, so every ``tokenizers`` version that read them reads them;
    a ``tokenizer_config.json`` we write names ``PreTrainedTokenizerFast``, the class transformers 4 and 5 both load
    from it."""
    source = Path(tokenizer_json)
    ids = special_token_ids(source)  # the folder's special tokens (a tokenizer_config.json beside it), else Pythia's
    names = copy_tokenizer(source, out)
    if "tokenizer_config.json" not in names:
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **SPECIAL_TOKENS,
                  "model_max_length": cfg.max_position_embeddings, "clean_up_tokenization_spaces": False}
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        (out / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS, indent=2) + "\n")
    padding = list(range(cfg.vocab_size, cfg.padded_vocab_size))  # embedding rows no token uses
    GenerationConfig(bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                     suppress_tokens=padding or None).save_pretrained(out)
    return ids


def copy_tokenizer_files(hf_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Copy the :data:`TOKENIZER_FILES` that the Hugging Face folder ``hf_dir`` holds into ``out_dir``, names
    unchanged; returns their names (``convert from-hf``: the import keeps the folder's tokenizer as it is).

    Not :func:`neox_dar.tokenizer.copy_tokenizer`, which starts from one ``tokenizer.json`` that must exist and
    takes the files beside it only when a ``tokenizer_config.json`` is there: this copies whatever the folder
    holds, including nothing (a model folder without a tokenizer imports, as tests/test_finetune.py's does), the
    slow formats without a ``tokenizer.json`` (``tokenizer.model``, ``vocab.json`` and ``merges.txt``), and
    ``special_tokens_map.json`` and the rest with no ``tokenizer_config.json``."""
    present = [name for name in TOKENIZER_FILES if (Path(hf_dir) / name).is_file()]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for name in present:
        shutil.copyfile(Path(hf_dir) / name, Path(out_dir) / name)
    return present


# ----------------------------------------------------------------------------------------------
# export and import


def to_hf(model: CausalLM, cfg: ModelConfig, out_dir: str | Path, tokenizer_json: str | Path | None = None) -> Path:
    """Write ``out_dir/config.json``, ``out_dir/model.safetensors`` (float32; a tied head once, as Hugging Face
    writes it) and the tokenizer (:func:`write_tokenizer`; default: :func:`neox_dar.tokenizer.tokenizer_file`); for a
    model with non-vanilla layers also the code of :mod:`neox_dar.standalone` (``auto_map``). All of it goes into a
    folder beside ``out_dir`` that replaces it once complete (:func:`~neox_dar.rundir.staged_dir`): a failure or
    a kill part-way leaves an earlier export whole."""
    modules = model.attention_modules()
    layers = None
    if any(m.name != "vanilla" for m in modules):
        layers = [m.export_spec() for m in modules]
    elif problems := export_problems(cfg):
        raise ConfigError(f"{FAMILIES[cfg.model_family].hf_class} cannot express this model: {'; '.join(problems)}")
    out = Path(out_dir)
    with staged_dir(out) as stage:
        special_ids = write_tokenizer(tokenizer_json or tokenizer_file(cfg), cfg, stage)
        tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.weights().items()}
        save_file(tensors, str(stage / "model.safetensors"), metadata={"format": "pt"})
        config = hf_config_dict(cfg, special_ids) if layers is None else remote_config_dict(cfg, layers, special_ids)
        (stage / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for name in REMOTE_FILES if layers is not None else ():
            shutil.copyfile(REMOTE_CODE / name, stage / name)
    return out


def weight_files(hf_dir: Path) -> list[Path]:
    """The folder's weight files: ``model.safetensors``, or every shard its index lists (a missing one is an
    error), or ``pytorch_model.bin``."""
    single, index = hf_dir / "model.safetensors", hf_dir / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        data = _read_json(index)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(s, str) for s in weight_map.values()):
            raise CheckpointError(f"{index} is not a safetensors index (it needs a 'weight_map' of tensor names to "
                                  "file names)")
        shards = sorted(set(weight_map.values()))
        if outside := [s for s in shards if PurePosixPath(s).is_absolute() or ".." in PurePosixPath(s).parts]:
            raise CheckpointError(f"{index} names a file outside {hf_dir}: {outside[0]!r} (weights are read only from "
                                  "the folder itself)")
        missing = [s for s in shards if not (hf_dir / s).is_file()]
        if missing:
            raise CheckpointError(f"{index} lists {len(missing)} shard(s) that are not in {hf_dir}: "
                                  f"{', '.join(missing[:3])}")
        return [hf_dir / s for s in shards]
    if (hf_dir / "pytorch_model.bin").is_file():
        return [hf_dir / "pytorch_model.bin"]
    raise CheckpointError(f"no model.safetensors, model.safetensors.index.json or pytorch_model.bin in {hf_dir}")


def _our_name(name: str, model: CausalLM) -> str | None:
    """Our parameter name for a Hugging Face one (None: a buffer to ignore, or the tied head)."""
    if name.endswith(_IGNORED_SUFFIXES):
        return None
    if name == "lm_head.weight":  # transformers 5 names every head lm_head (GPT-NeoX's: embed_out)
        name = f"{FAMILIES[model.cfg.model_family].names.head}.weight"
    return None if name in model.tied_keys else name


def _read_json(path: Path) -> object:
    """The JSON value in ``path``; a CheckpointError when it is not valid JSON (nesting too deep included)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise CheckpointError(f"{path} is not valid JSON (nested too deeply)") from None
    except ValueError as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from None


def _tensors(path: Path):
    """``(name, shape, loader)`` of every tensor in one weight file; safetensors are memory-mapped. A ``.bin`` is
    read with ``weights_only=True``: one that needs more (code to run) or is not a state dict of tensors is
    refused."""
    if path.suffix == ".bin":
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
            raise CheckpointError(f"{path}: refused: torch.load(weights_only=True) cannot read it "
                                  f"({type(e).__name__}); convert it to safetensors with a tool you trust") from None
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise CheckpointError(f"{path}: refused: not a state dict of tensors")
        for name, t in state.items():
            yield name, tuple(t.shape), (lambda t=t: t)
        return
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            yield name, tuple(f.get_slice(name).get_shape()), (lambda name=name: f.get_tensor(name))


def from_hf(hf_dir: str | Path, attention_impl: str | None = None,
            overrides: dict | None = None) -> tuple[CausalLM, ModelConfig]:
    """Load a Hugging Face folder of a supported class as ``(model, model config)``, one file at a time onto a
    model built on the meta device (tensors keep their stored dtype). ``attention_impl`` replaces the attention
    path; ``overrides`` (flat keys) may add a variant, whose new parameters are initialised as in training."""
    hf_dir = Path(hf_dir)
    config_path = hf_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no config.json in {hf_dir}")
    hf = _read_json(config_path)
    files = weight_files(hf_dir)
    cfg = config_from_hf(hf, str(config_path), overrides, sum(f.stat().st_size for f in files))
    if attention_impl is not None:
        cfg.attention = dataclasses.replace(cfg.attention, attention_impl=attention_impl)
    with torch.device("meta"):
        model = build_model(cfg)
    expected = {k: tuple(v.shape) for k, v in model.weights().items()}
    loaded = set()
    try:
        for path in files:
            shard = {}
            for name, shape, load in _tensors(path):
                ours = _our_name(name, model)
                if ours is None:
                    continue
                if ours not in expected:
                    raise CheckpointError(f"{path}: {name} is not a parameter of the model {config_path} describes")
                if shape != expected[ours]:
                    raise CheckpointError(f"{path}: {name} has shape {shape}, {config_path} implies "
                                          f"{expected[ours]}")
                shard[ours] = _checked(load(), name, path)
            model.load_state_dict(shard, strict=False, assign=True)
            loaded |= set(shard)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{hf_dir}: unreadable weights ({e})") from None
    _initialise_new(model, cfg, set(expected) - loaded, hf_dir)
    model.tie_weights()
    return model, cfg


WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _checked(tensor: torch.Tensor, name: str, path: Path) -> torch.Tensor:
    """``tensor`` when it is of a :data:`WEIGHT_DTYPES` and finite; a CheckpointError naming it otherwise."""
    if tensor.dtype not in WEIGHT_DTYPES:
        raise CheckpointError(f"{path}: {name} is {str(tensor.dtype).removeprefix('torch.')}, not floating point "
                              "(float32, float16, bfloat16 or float64)")
    # min and max propagate NaN and hold any Inf, with no copy of the (memory-mapped) tensor
    if tensor.numel() and not all(torch.isfinite(x) for x in torch.aminmax(tensor)):
        raise CheckpointError(f"{path}: {name} holds NaN or Inf")
    return tensor


def check_tokenizer_json(path: str | Path) -> None:
    """A ValueError when the file ``path`` does not load with ``tokenizers`` (garbage, or another format)."""
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception for every parse failure
        raise ValueError(f"{path} is not a Hugging Face tokenizer.json that tokenizers can load "
                         f"({str(e).splitlines()[0][:200]})") from None


def _initialise_new(model: CausalLM, cfg: ModelConfig, missing: set[str], hf_dir: Path) -> None:
    """Parameters the folder does not hold: a variant's new ones (created and initialised as in training: the
    model's ``init_method``) are fine; a base-model parameter missing from the folder is an error."""
    base = vanilla_weight_names(cfg)
    absent = sorted(k for k in missing if k in base)
    if absent:
        raise CheckpointError(f"{hf_dir}: weights lack {len(absent)} parameter(s) of the model, e.g. {absent[0]}")
    modules = {name.rsplit(".", 1)[0] for name in missing}
    for name, module in model.named_modules():
        if name in modules:
            module.to_empty(device="cpu", recurse=False)
    init_weights(model, cfg, only=modules)


def vanilla_weight_names(cfg: ModelConfig) -> set[str]:
    """The parameter names of ``cfg``'s model with vanilla attention (what an imported folder must hold)."""
    vanilla = dataclasses.replace(cfg, attention=dataclasses.replace(
        cfg.attention, attention_type="vanilla", attention_config=None, hybrid=None))
    with torch.device("meta"):
        return set(build_model(vanilla).weights())


def folder_model(folder: Path, direction: str) -> ModelConfig | None:
    """The model config of an earlier ``direction`` output in ``folder`` (``to-hf``: its ``config.json``'s
    ``neox_dar_config``; ``from-hf``: the weights folder's ``model.yml``), or None when ``folder`` is no such output
    (a run directory, a training checkpoint, other files)."""
    if (folder / CONFIG).exists() or (folder / CHECKPOINTS).exists():
        return None
    try:
        if direction == "to-hf":
            hf = _read_json(folder / "config.json") if (folder / "config.json").is_file() else None
            ours = isinstance(hf, dict) and "neox_dar_config" in hf
            return config_from_hf(hf, str(folder / "config.json")) if ours else None
        ours = (folder / MODEL_CONFIG).is_file() and (folder / STATE).is_file()
        return read_model_config(folder) if ours else None
    except (ConfigError, CheckpointError):
        return None


def check_out_dir(out: Path, cfg: ModelConfig, direction: str) -> None:
    """ConfigError (one line naming ``out``) unless ``direction`` may write the model ``cfg`` into ``out``: missing,
    empty, or an earlier ``direction`` output of a model with the same config (a newer checkpoint of the same run,
    exported again), which is then replaced. A run directory, a folder of other files, another model's export or
    import is never overwritten."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file: name a folder to write")
    if not out.is_dir() or not any(out.iterdir()):
        return
    kind = "Hugging Face export (to-hf)" if direction == "to-hf" else "import (from-hf)"
    found = folder_model(out, direction)
    if found is None:
        raise ConfigError(f"{out} is not empty and is not an earlier {kind}: name a new or empty folder (nothing "
                          "was written)")
    if found != cfg:
        raise ConfigError(f"{out} holds the {kind} of another model (its config differs): name a new or empty "
                          "folder (nothing was written)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neox_dar.convert", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="direction", required=True)
    p = sub.add_parser("to-hf", help="neox-dar checkpoint -> Hugging Face folder (weights, config, tokenizer)")
    p.add_argument("checkpoint", help="run directory, its checkpoints/ directory, or one step directory")
    p.add_argument("out_dir")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.json to export (default: the checkpoint's, as evaluation resolves it)")
    p = sub.add_parser("from-hf", help="Hugging Face folder -> neox-dar weights + model.yml (+ tokenizer)")
    p.add_argument("hf_dir")
    p.add_argument("out_dir")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="model config keys on top of the import, e.g. attention_type=dar dar_d_down=512")
    args = parser.parse_args(argv)
    try:
        out = Path(args.out_dir)
        if args.direction == "to-hf":
            with held_checkpoint(args.checkpoint) as step_dir:  # its weights and tokenizer, whatever its run prunes
                check_out_dir(out, read_model_config(step_dir), args.direction)
                model, cfg = load_model(step_dir)
                to_hf(model, cfg, out, tokenizer_file(cfg, args.tokenizer, step_dir))
        else:
            if (Path(args.hf_dir) / "tokenizer.json").is_file():  # before anything is read or written
                check_tokenizer_json(Path(args.hf_dir) / "tokenizer.json")
            model, cfg = from_hf(args.hf_dir, overrides=_parse_overrides(args.overrides))
            check_out_dir(out, cfg, args.direction)
            with staged_dir(out) as stage:  # an earlier import is replaced whole, once the new one is written
                copy_tokenizer_files(args.hf_dir, stage)  # first: the checkpoint's manifest lists them
                save_weights(model, cfg, stage)
    except (OSError, ValueError) as e:  # ConfigError and CheckpointError are ValueErrors
        print(f"convert error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the output folder is replaced whole or not at all (staged_dir)
        print(f"convert: interrupted (Ctrl-C): {args.out_dir} is as it was", file=sys.stderr)
        return 130
    print(f"wrote {args.out_dir}")
    return 0


def _parse_overrides(items: list[str]) -> dict:
    """``key=value`` words as train.py reads them (:func:`~neox_dar.config.files.parse_override`: the value as YAML,
    a value YAML cannot take, such as a tag, kept as its text), as ``{key: value}``."""
    return {".".join(parts): value for parts, value in map(parse_override, items)}


if __name__ == "__main__":
    sys.exit(main())
