"""Generate text with a checkpoint of any attention variant and model family, through each variant's inference cache.

    python -m neox_dar.generate runs/dar-70m --prompt "The capital of France is" --max-new-tokens 32
    python -m neox_dar.generate runs/aha-70m --prompts prompts.jsonl --max-new-tokens 64 --temperature 0.8 \\
        --top-p 0.95 --seed 1 --batch-size 16 --out completions.jsonl

``RUN_OR_CHECKPOINT`` is a run directory (its newest complete checkpoint, verified), a checkpoint step directory, a
folder written by ``convert from-hf``, or a Hugging Face folder. A prompt file has one JSON object per line with a
``"prompt"`` string (other fields are copied to the output) or one JSON string. ``--temperature 0`` (the default) is
greedy decoding. ``--chat`` renders each prompt as a user turn with the checkpoint's chat template (the one it was
trained with, from its recorded tokenizer files) and the template's generation prompt. ``--out`` writes one JSON
line per prompt (``prompt``, ``completion``, ``token_ids``: the generated ids, an ending eos included,
``finish_reason``: ``eos`` or ``length``; ``chat_prompt`` with ``--chat``), into ``FILE.jsonl.partial`` as each batch
finishes, renamed to ``FILE.jsonl`` once every prompt is done: an earlier ``FILE.jsonl`` stays as it was until then
(a Ctrl-C, a crash or an error leaves it, and the ``.partial`` file holds the prompts finished before); without it a
single ``--prompt`` streams its completion to stdout and a prompt file prints the JSON lines there.

The decoding itself is :mod:`neox_dar.generate`'s (docs/inference.md). AHA models report ``mu_f``, the share of open
gates over the generated tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from ..attention.triton_bridge import AttentionImplError
from ..config import ConfigError
from ..devices import check_device
from ..evaluation.loading import DTYPES
from ..evaluation.scoring import AttentionStatsMean, overall_means
from ..progress import progress_bar
from ..rundir import CheckpointError, check_writable
from ..tokenizer import check_tokenizer_json
from ..variants.registry import stat_names
from . import GenerationError, Sampling, check_prompts, generate, load
from ..notices import one_line_notices


def read_prompts(path: Path) -> list[dict]:
    """The prompt file's records (``{"prompt": str, ...}``); a line may also be a bare JSON string."""
    if not path.is_file():
        raise GenerationError(f"prompt file not found: {path}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GenerationError(f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as e:
            raise GenerationError(f"{path}:{n}: not valid JSON ({e})") from None
        except RecursionError:
            raise GenerationError(f"{path}:{n}: not valid JSON (nested too deeply)") from None
        if isinstance(item, str):
            item = {"prompt": item}
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise GenerationError(f"{path}:{n}: expected a JSON string or an object with a \"prompt\" string")
        try:  # its fields are copied to --out: each must be writable as UTF-8
            json.dumps(item, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise GenerationError(f"{path}:{n}: holds a lone surrogate ({e.object[e.start]!r}), which is not "
                                  "Unicode text") from None
        records.append(item)
    if not records:
        raise GenerationError(f"{path} holds no prompts")
    return records


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m neox_dar.generate", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", metavar="RUN_OR_CHECKPOINT")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="one prompt")
    source.add_argument("--prompts", type=Path, metavar="FILE.jsonl", help="one JSON prompt per line")
    ap.add_argument("--max-new-tokens", type=int, required=True, metavar="N")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    ap.add_argument("--top-k", type=int, default=None,
                    help="sample from the K most likely tokens (default 50, as transformers' generate; 0: all)")
    ap.add_argument("--top-p", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0, help="sampling seed of the first prompt (prompt i: seed + i)")
    ap.add_argument("--batch-size", type=int, default=8, help="prompts decoded together (default 8)")
    ap.add_argument("--out", type=Path, default=None, metavar="FILE.jsonl", help="write one JSON line per prompt")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES))
    ap.add_argument("--attention-impl", default=None, choices=["reference", "sdpa", "triton"],
                    help="the prefill's attention path (default: the checkpoint's)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the checkpoint's)")
    ap.add_argument("--chat", action="store_true",
                    help="render each prompt as a user turn with the checkpoint's chat template and its generation "
                         "prompt (--out records the rendering as chat_prompt)")
    return ap


def _check_args(args) -> Sampling:
    """The sampling settings; a GenerationError for any bad setting, device, output or tokenizer file, before
    anything is loaded."""
    if args.max_new_tokens < 1:
        raise GenerationError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.batch_size < 1:
        raise GenerationError(f"--batch-size must be >= 1, got {args.batch_size}")
    if not 0 <= args.seed < 2 ** 63:
        raise GenerationError(f"--seed must be in [0, 2**63), got {args.seed}")
    if args.prompt is not None and args.prompt == "":
        raise GenerationError("--prompt is empty")
    if args.prompt is not None:
        try:
            args.prompt.encode("utf-8")
        except UnicodeEncodeError as e:  # surrogateescape keeps a byte the command line could not decode as U+DCxx
            code = ord(e.object[e.start])
            raise GenerationError("--prompt is not UTF-8 text (" + (f"byte 0x{code - 0xdc00:02x}" if code >= 0xdc80
                                  else f"a lone surrogate {e.object[e.start]!r}") + ")") from None
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    check_device(args.device)
    if args.out is not None:
        check_writable(args.out, "--out")
        if args.prompts is not None and Path(args.prompts).resolve() == args.out.resolve():
            raise GenerationError(f"--out {args.out} is the --prompts file: it would be replaced by the completions")
    if args.tokenizer is not None and Path(args.tokenizer).is_file():
        check_tokenizer_json(args.tokenizer)
    return sampling


def partial_path(out: Path) -> Path:
    """Where ``--out FILE`` is written until every prompt is done: ``FILE.partial`` beside it."""
    return out.with_name(out.name + ".partial")


def run(args) -> None:
    sampling = _check_args(args)
    records = [{"prompt": args.prompt}] if args.prompt is not None else read_prompts(args.prompts)
    for i, r in enumerate(records):
        if r["prompt"] == "":
            raise GenerationError(f"prompt {i} is empty")
    gen = load(args.checkpoint, args.device, args.dtype, args.attention_impl, args.tokenizer)
    if args.chat:
        rendered = [gen.chat(r["prompt"]) for r in records]
        records = [{**r, "chat_prompt": text} for r, (text, _) in zip(records, rendered)]
        prompts = [ids for _, ids in rendered]
    else:
        prompts = [gen.encode(r["prompt"]) for r in records]
    check_prompts(prompts, gen.model.cfg.max_position_embeddings)
    room = min(gen.model.cfg.max_position_embeddings - len(p) for p in prompts)
    if room < args.max_new_tokens:
        print(f"note: a prompt leaves room for only {room} new tokens before max_position_embeddings="
              f"{gen.model.cfg.max_position_embeddings}; its completion stops there", file=sys.stderr)
    streamer = None
    if args.prompt is not None and args.out is None:
        from transformers import TextStreamer

        streamer = TextStreamer(gen.tokenizer, skip_special_tokens=True)
    stats = AttentionStatsMean(gen.model)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    sink = partial_path(args.out).open("w", encoding="utf-8") if args.out is not None else sys.stdout
    try:
        with progress_bar(total=len(records), desc="generating", unit="prompt",
                          disable=len(records) == 1 or not args.out) as bar:
            for lo in range(0, len(records), args.batch_size):
                batch = range(lo, min(lo + args.batch_size, len(records)))
                done = generate(gen.model, [prompts[i] for i in batch], args.max_new_tokens, gen.eos_ids, sampling,
                                seeds=[args.seed + i for i in batch],
                                on_token=None if streamer is None else
                                (lambda b, t: streamer.put(torch.tensor([t]))), stats=stats)
                if streamer is not None:
                    streamer.end()
                    continue
                for i, c in zip(batch, done):
                    line = {**records[i], "completion": gen.decode(c.token_ids), "token_ids": c.token_ids,
                            "finish_reason": c.finish_reason}
                    sink.write(json.dumps(line, ensure_ascii=False) + "\n")
                sink.flush()
                bar.update(len(batch))
    finally:
        if sink is not sys.stdout:
            sink.close()
    if args.out is not None:
        os.replace(partial_path(args.out), args.out)
    meanings = stat_names()
    for name, value in overall_means(stats.result()).items():
        print(f"{name} = {value:.4f} over the generated tokens, mean over layers and heads ({meanings.get(name, name)})",
              file=sys.stderr)
    if args.out is not None:
        print(f"wrote {len(records)} completion{'' if len(records) == 1 else 's'} to {args.out}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    one_line_notices()  # this package's warnings as `warning: ...`, one line
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except (GenerationError, CheckpointError, ConfigError, OSError, ValueError, AttentionImplError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        kept = (f": {partial_path(args.out)} holds the prompts finished before; {args.out} is left as it was"
                if args.out is not None and partial_path(args.out).exists() else "")
        print(f"interrupted (Ctrl-C){kept}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
