"""Convert between neox-dar checkpoints and Hugging Face ``GPTNeoXForCausalLM`` folders.

    python -m neox_dar.convert to-hf CHECKPOINT OUT_DIR [--tokenizer tokenizer.json]
    python -m neox_dar.convert from-hf HF_DIR OUT_DIR        # model.safetensors + model.yml (+ tokenizer files)

``to-hf`` writes a complete Hugging Face folder: ``config.json``, ``model.safetensors``, the run's tokenizer
(``tokenizer.json`` copied byte for byte from the config's ``vocab_file``, as :func:`neox_dar.tokenizer.tokenizer_file`
resolves it; the bundled Pythia tokenizer when unset), ``tokenizer_config.json`` and ``special_tokens_map.json``
(bos = eos = unk = ``<|endoftext|>``, as the models use them) and ``generation_config.json``, so
``AutoTokenizer``, lm-eval's ``hf`` model and vLLM-style loaders need nothing else. ``from-hf`` copies the
folder's tokenizer files beside the imported weights, where evaluation finds them.

Parameter names are shared, so nothing is renamed except the output head: exports write ``embed_out.weight``
(the published Pythia name, which transformers 5 maps to ``lm_head.weight`` on load); imports accept both.
Variant models export their extra weights (under ``attention.``) and their resolved model config under
``neox_dar_config`` in ``config.json``; plain transformers ignores both, so only vanilla models are
``GPTNeoXForCausalLM``-equivalent.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import GenerationConfig

from .checkpoint import load_model, save_weights
from .config import ConfigError, ModelConfig, model_config_from_flat, model_flat
from .config.schema import key_sections
from .model import CausalLM, build_model
from .rundir import resolve_checkpoint
from .tokenizer import SPECIAL_TOKENS, special_token_id, tokenizer_file

# Buffers that some published GPT-NeoX checkpoints carry and that hold no learned state.
_IGNORED_SUFFIXES = (".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq", "rotary_emb.inv_freq")
# A Hugging Face folder's tokenizer files (fast and slow formats), copied by ``from-hf``.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt")


def hf_config_dict(cfg: ModelConfig, special_id: int = 0) -> dict:
    """The ``config.json`` of a ``GPTNeoXForCausalLM`` equal to ``cfg``'s vanilla model; ``special_id`` is the
    tokenizer's ``<|endoftext|>`` (bos and eos; 0 in the Pythia tokenizer)."""
    return {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "vocab_size": cfg.padded_vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "intermediate_size": 4 * cfg.hidden_size,
        "hidden_act": "gelu",
        "rotary_pct": cfg.rotary_pct,
        "rotary_emb_base": cfg.rotary_emb_base,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(cfg.rotary_emb_base),
                            "partial_rotary_factor": cfg.rotary_pct},
        "max_position_embeddings": cfg.max_position_embeddings,
        "layer_norm_eps": cfg.layernorm_epsilon,
        "use_parallel_residual": cfg.gpt_j_residual,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "attention_dropout": cfg.attention_dropout,
        "hidden_dropout": cfg.hidden_dropout,
        "initializer_range": cfg.init_method_std,
        "bos_token_id": special_id,
        "eos_token_id": special_id,
        "torch_dtype": "float32",
        "neox_dar_config": model_flat(cfg),
    }


def write_tokenizer(tokenizer_json: str | Path, cfg: ModelConfig, out: Path) -> int:
    """Copy ``tokenizer_json`` to ``out/tokenizer.json`` and write ``tokenizer_config.json``,
    ``special_tokens_map.json`` and ``generation_config.json``; returns the ``<|endoftext|>`` id.

    The tokenizer file is the run's own, unchanged, so every ``tokenizers`` version that read it reads it;
    ``PreTrainedTokenizerFast`` is the class name that transformers 4 and 5 both load from it."""
    special_id = special_token_id(tokenizer_json)
    shutil.copyfile(tokenizer_json, out / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **SPECIAL_TOKENS,
              "model_max_length": cfg.max_position_embeddings, "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS, indent=2) + "\n")
    GenerationConfig(bos_token_id=special_id, eos_token_id=special_id).save_pretrained(out)
    return special_id


def to_hf(model: CausalLM, cfg: ModelConfig, out_dir: str | Path, tokenizer_json: str | Path | None = None) -> Path:
    """Write ``out_dir/config.json``, ``out_dir/model.safetensors`` (float32) and the tokenizer
    (:func:`write_tokenizer`; ``tokenizer_json`` defaults to ``cfg``'s: :func:`neox_dar.tokenizer.tokenizer_file`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    special_id = write_tokenizer(tokenizer_json or tokenizer_file(cfg), cfg, out)
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config_dict(cfg, special_id), indent=2) + "\n")
    return out


def copy_tokenizer_files(hf_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Copy the :data:`TOKENIZER_FILES` that ``hf_dir`` holds into ``out_dir``; returns their names."""
    present = [name for name in TOKENIZER_FILES if (Path(hf_dir) / name).is_file()]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for name in present:
        shutil.copyfile(Path(hf_dir) / name, Path(out_dir) / name)
    return present


def config_from_hf(hf: dict) -> ModelConfig:
    """Our :class:`ModelConfig` for a Hugging Face GPT-NeoX ``config.json`` (ours round-trips exactly; exports of
    older versions carry the whole run config there, whose non-model keys are dropped)."""
    if "neox_dar_config" in hf:
        sections = key_sections()
        keys = {k: v for k, v in hf["neox_dar_config"].items() if sections.get(k) in ("model", "attention")}
        return model_config_from_flat(keys, source="config.json:neox_dar_config")
    if hf.get("model_type") != "gpt_neox":
        raise ConfigError(f"config.json has model_type {hf.get('model_type')!r}, expected 'gpt_neox'")
    d = hf["hidden_size"]
    if hf.get("intermediate_size", 4 * d) != 4 * d:
        raise ConfigError(f"intermediate_size {hf['intermediate_size']} != 4 * hidden_size; not a Pythia-shaped model")
    if hf.get("tie_word_embeddings", False):
        raise ConfigError("tie_word_embeddings: true is not supported (Pythia unties embeddings)")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise ConfigError(f"hidden_act {hf['hidden_act']!r} is not supported (only exact 'gelu')")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    vocab = hf["vocab_size"]
    return model_config_from_flat(
        {
            "num_layers": hf["num_hidden_layers"],
            "hidden_size": d,
            "num_attention_heads": hf["num_attention_heads"],
            "max_position_embeddings": hf.get("max_position_embeddings", 2048),
            "seq_length": min(2048, hf.get("max_position_embeddings", 2048)),
            "rotary_pct": hf.get("rotary_pct", rope.get("partial_rotary_factor", 0.25)),
            "rotary_emb_base": int(hf.get("rotary_emb_base", rope.get("rope_theta", 10000))),
            "layernorm_epsilon": hf.get("layer_norm_eps", 1e-5),
            "gpt_j_residual": hf.get("use_parallel_residual", True),
            "vocab_size": vocab,
            "make_vocab_size_divisible_by": 128 if vocab % 128 == 0 else 1,
            "attention_type": "vanilla",
        },
        source="config.json",
    )


def _read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a Hugging Face folder: ``model.safetensors``, a sharded safetensors index, or
    ``pytorch_model.bin`` (loaded with ``weights_only=True``)."""
    single = hf_dir / "model.safetensors"
    index = hf_dir / "model.safetensors.index.json"
    legacy = hf_dir / "pytorch_model.bin"
    if single.is_file():
        return load_file(str(single))
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(str(hf_dir / shard)).items()}
    if legacy.is_file():
        return torch.load(legacy, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no model.safetensors, model.safetensors.index.json or pytorch_model.bin in {hf_dir}")


def from_hf(hf_dir: str | Path, attention_impl: str | None = None) -> tuple[CausalLM, ModelConfig]:
    """Load a Hugging Face GPT-NeoX folder (Pythia or one written by :func:`to_hf`) as ``(model, model config)``;
    ``attention_impl`` (reference, sdpa, triton) replaces the attention path."""
    hf_dir = Path(hf_dir)
    config_path = hf_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no config.json in {hf_dir}")
    cfg = config_from_hf(json.loads(config_path.read_text()))
    if attention_impl is not None:
        cfg.attention = dataclasses.replace(cfg.attention, attention_impl=attention_impl)
    state = {}
    for name, tensor in _read_hf_weights(hf_dir).items():
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        state["embed_out.weight" if name == "lm_head.weight" else name] = tensor.float()
    with torch.device("meta"):
        model = build_model(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"{hf_dir}: weights do not match the config (missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]})")
    return model, cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neox_dar.convert", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="direction", required=True)
    p = sub.add_parser("to-hf", help="neox-dar checkpoint -> Hugging Face folder (weights, config, tokenizer)")
    p.add_argument("checkpoint", help="run directory, its checkpoints/ directory, or one step directory")
    p.add_argument("out_dir")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.json to export (default: the checkpoint's, as evaluation resolves it)")
    p = sub.add_parser("from-hf", help="Hugging Face GPT-NeoX folder -> neox-dar weights + model.yml (+ tokenizer)")
    p.add_argument("hf_dir")
    p.add_argument("out_dir")
    args = parser.parse_args(argv)
    try:
        if args.direction == "to-hf":
            step_dir = resolve_checkpoint(args.checkpoint)
            model, cfg = load_model(step_dir)
            to_hf(model, cfg, args.out_dir, tokenizer_file(cfg, args.tokenizer, step_dir))
        else:
            model, cfg = from_hf(args.hf_dir)
            copy_tokenizer_files(args.hf_dir, args.out_dir)  # first: the checkpoint's manifest lists them
            save_weights(model, cfg, args.out_dir)
    except (FileNotFoundError, ConfigError, ValueError) as e:
        print(f"convert error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
