"""Tiny random Hugging Face models of each family, built by transformers' own classes: stand-ins for pretrained
checkpoints (OLMo-2-0425-1B-SFT, Llama, Qwen) when trying the import, fine-tuning and evaluation pipeline on a
laptop, and the models the tests convert.

    python -m neox_dar.tiny_hf_model olmo2 runs/demo/olmo2-hf  # config.json, safetensors shards, tokenizer, template

The folder holds a 2-layer, d = 64 model (4 query heads over 2 key/value heads; OLMo-2's and Qwen3's q/k norms,
Qwen2's q/k/v biases, Llama-3's rope scaling, Qwen3's head_dim 32 != d / H) with every parameter random (norm
weights around 1, biases around 0, so each one matters to the logits), saved with ``save_pretrained`` in several
shards, plus the Pythia tokenizer (vocabulary 50,304 by default, so the shipped tokenized samples fit; or
``--tokenizer data/byte_tokenizer.json --vocab 257``, a tokenizer other than the bundled one) with a
``tokenizer_config.json`` naming its special tokens and the Tülu-format chat template (``data/chat/tulu.jinja``).
A ``--vocab`` smaller than the tokenizer's ids is refused (the model could not embed them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from .families import FAMILIES
from .rundir import RunFileError, check_own_folder, staged_dir
from .tokenizer import check_tokenizer_json

REPO_ROOT = Path(__file__).resolve().parents[1]


def tiny_hf_model(family: str, seed: int = 0, tie: bool = False, vocab: int = 96, max_pos: int = 512, **extra):
    """The tiny ``*ForCausalLM`` of ``family`` (eval mode, float32) described in the module docstring: the shared
    shape plus the family record's ``tiny`` keys; ``extra``: more config keys of the family's config class."""
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r} (choose from {', '.join(FAMILIES)})")
    hf_cfg = transformers.AutoConfig.for_model(
        family, vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=max_pos, tie_word_embeddings=tie, attn_implementation="eager", bos_token_id=1,
        eos_token_id=2, pad_token_id=None, **{**FAMILIES[family].tiny, **extra})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model


def write_tokenizer_files(out: Path, chat_template: Path | None = REPO_ROOT / "data" / "chat" / "tulu.jinja",
                          tokenizer: Path = REPO_ROOT / "data" / "20B_tokenizer.json") -> None:
    """``tokenizer`` (default: Pythia's; ``data/byte_tokenizer.json`` also has ``<|endoftext|>``) with a
    ``tokenizer_config.json``: bos = eos = ``<|endoftext|>`` and ``chat_template``."""
    shutil.copyfile(tokenizer, out / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
              "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "clean_up_tokenization_spaces": False}
    if chat_template is not None:
        config["chat_template"] = Path(chat_template).read_text()
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m neox_dar.tiny_hf_model", description=__doc__.split("\n\n")[0])
    p.add_argument("family", choices=FAMILIES)
    p.add_argument("out")
    p.add_argument("--vocab", type=int, default=50304, help="vocabulary (default 50304: the Pythia tokenizer's ids)")
    p.add_argument("--tokenizer", default=str(REPO_ROOT / "data" / "20B_tokenizer.json"),
                   help="tokenizer.json to ship (default: Pythia's; data/byte_tokenizer.json with --vocab 257)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tie", action="store_true", help="tie the input and output embeddings")
    p.add_argument("--shard", default="2MB", help="max size of one safetensors shard (default 2MB)")
    args = p.parse_args(argv)
    out = Path(args.out)
    try:
        ids = check_tokenizer_json(args.tokenizer).get_vocab_size(with_added_tokens=True)
    except ValueError as e:
        print(f"error: --tokenizer: {e}", file=sys.stderr)
        return 2
    if args.vocab < ids:  # the model could not embed the ids its own tokenizer gives
        print(f"error: --vocab {args.vocab} is smaller than the {ids} ids of --tokenizer {args.tokenizer}: pass "
              f"--vocab {ids} or more, or a tokenizer with fewer ids", file=sys.stderr)
        return 2
    try:  # a file, an unwritable place or a folder of other files: a traceback, or shards mixed with another model's
        check_own_folder(out, "OUT", "config.json", "a Hugging Face model folder")
        with staged_dir(out) as stage:  # an earlier model's folder is replaced whole, never mixed
            tiny_hf_model(args.family, seed=args.seed, tie=args.tie, vocab=args.vocab).save_pretrained(
                stage, max_shard_size=args.shard)
            write_tokenizer_files(stage, tokenizer=Path(args.tokenizer))
    except (RunFileError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote a tiny random {args.family} model and its tokenizer to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
