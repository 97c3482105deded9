"""The command line of the Hugging Face bridge (:mod:`neox_dar.hf`, where the conversion and its rules are).

    python -m neox_dar.convert to-hf CHECKPOINT OUT_DIR [--tokenizer tokenizer.json]
    python -m neox_dar.convert from-hf HF_DIR OUT_DIR [key=value ...]   # model.safetensors + model.yml + tokenizer

``key=value`` overrides of ``from-hf`` add a variant on top of the imported model (``attention_type=dar``), read as
train.py reads them. ``OUT_DIR`` must be new, empty, or an earlier output of the same command for a model of the
same config, which is then replaced whole; anything else is a one-line error, and nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .saved_model import load_model, read_model_config, save_weights
from .config.files import parse_override
from .hf import check_out_dir, from_hf, to_hf
from .rundir import held_checkpoint, staged_dir
from .evaluation.loading import DTYPES
from .tokenizer import check_fits, check_tokenizer_json, copy_tokenizer_files, tokenizer_file
from .notices import one_line_notices


def main(argv: list[str] | None = None) -> int:
    one_line_notices()  # this package's warnings as `warning: ...`, one line
    parser = argparse.ArgumentParser(prog="python -m neox_dar.convert", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="direction", required=True)
    p = sub.add_parser("to-hf", help="neox-dar checkpoint -> Hugging Face folder (weights, config, tokenizer)")
    p.add_argument("checkpoint", help="run directory, its checkpoints/ directory, or one step directory")
    p.add_argument("out_dir")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.json to export (default: the checkpoint's, as evaluation resolves it)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="the exported weights' dtype (default float32: a checkpoint's master weights as they are)")
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
                to_hf(model, cfg, out, tokenizer_file(cfg, args.tokenizer, step_dir), DTYPES[args.dtype])
        else:
            tokenizer = Path(args.hf_dir) / "tokenizer.json"
            if tokenizer.is_file():  # before anything is read or written
                check_tokenizer_json(tokenizer)
            model, cfg = from_hf(args.hf_dir, overrides=_parse_overrides(args.overrides))
            if tokenizer.is_file():  # every later command would refuse it: data tokenized with it cannot be read
                check_fits(tokenizer, cfg)
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
