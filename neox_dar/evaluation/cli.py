"""Rolling-window perplexity of a checkpoint on FineWeb-Edu, C4 and WikiText-103 (and enwik8's test split).

    python -m eval.perplexity CHECKPOINT [--corpora fineweb_edu,c4,wikitext103] [--source local|hub]
        [--max-docs N | --max-docs NAME=N ...] [--max-length L] [--stride S] [--batch-size B] [--device D]
        [--dtype float32] [--manifest m.json | --sweep-manifest] [--out results.json]
    torchrun --nproc_per_node 8 -m eval.perplexity CHECKPOINT ...      # every GPU of the node, same results

CHECKPOINT is a run directory, its ``checkpoints`` directory, one step directory, or a Hugging Face GPT-NeoX
folder. By default every token is scored once with lm-evaluation-harness's ``loglikelihood_rolling`` windows
(``max_length`` = the model's ``seq_length``); ``--stride S`` < L gives every later window ``L - S`` tokens
of re-read context (the Hugging Face stride recipe). The default corpora are the small local samples in
``data/eval`` (offline, for tests); sweeps evaluate on the Hub corpora (``--source hub``). enwik8 is scored on
request: ``--corpora enwik8 --corpus-path enwik8=PREFIX_test.raw`` (``python -m data_prep.enwik8`` writes it); every
corpus reports bits per character and per byte. Under a launcher (torchrun, or srun with one task per GPU), each
rank scores its share of the windows on its own GPU and rank 0 writes the results, which are those of one process
(:mod:`neox_dar.evaluation.parallel`). See docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TypeVar

import torch
from tokenizers import Tokenizer

from ..attention.triton_bridge import AttentionImplError
from ..devices import check_device
from ..provenance import provenance
from ..rundir import check_writable, held_checkpoint, is_hf_folder, uninterrupted, write_output
from ..tokenizer import load_tokenizer, prefix_token_id, tokenizer_file, tokenizer_sha256
from .corpora import ALL_CORPORA, CORPORA, CorpusError, Document, manifest_hash
from .loading import DTYPES, LoadedModel, load_for_eval
from .parallel import EvalGroup, start_group
from .perplexity import SWEEP_MANIFEST, load_corpora, pinned_corpora, score_corpus, sweep_manifest_path
from ..notices import one_line_notices


def _parse_paths(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or name not in ALL_CORPORA:
            raise ValueError(f"--corpus-path wants NAME=PATH with NAME in {', '.join(ALL_CORPORA)}, got '{item}'")
        out[name] = path
    return out


def parse_max_docs(items: list[str], names: list[str]) -> dict[str, int | None]:
    """``--max-docs`` values applied in order: ``N`` sets every corpus, ``NAME=N`` one corpus; ``all`` for N is
    no limit."""
    out: dict[str, int | None] = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        if sep and name not in ALL_CORPORA:
            raise ValueError(f"--max-docs: unknown corpus '{name}' in '{item}'; choose from {', '.join(ALL_CORPORA)}")
        if value == "all":
            count = None
        elif value.isdigit() and int(value) >= 1:
            count = int(value)
        else:
            raise ValueError(f"--max-docs wants N or NAME=N with N >= 1 or 'all', got '{item}'")
        out.update({name: count} if sep else dict.fromkeys(names, count))
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eval.perplexity", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="run dir, checkpoints dir, step dir, or Hugging Face GPT-NeoX folder")
    ap.add_argument("--corpora", default=",".join(CORPORA),
                    help=f"comma-separated subset of {','.join(ALL_CORPORA)} (default: %(default)s)")
    ap.add_argument("--max-docs", action="append", default=[], metavar="N|NAME=N",
                    help="score only the first N documents of every corpus, or of corpus NAME (repeatable, applied "
                         "in order; N = all: no limit)")
    ap.add_argument("--max-length", type=int, default=None, help="window length L (default: the model's seq_length)")
    ap.add_argument("--stride", type=int, default=None, help="new tokens scored per later window (default L)")
    ap.add_argument("--batch-size", type=int, default=8, help="windows per forward")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="model dtype (log-probs are float32)")
    ap.add_argument("--attention-impl", default=None, choices=["reference", "sdpa", "triton"],
                    help="override the checkpoint's attention_impl")
    ap.add_argument("--source", default="local", choices=["local", "hub"], help="local files or the Hugging Face Hub")
    ap.add_argument("--data-dir", default=None, help="directory holding the local corpora (default: data/eval)")
    ap.add_argument("--corpus-path", action="append", default=[], metavar="NAME=PATH",
                    help="file or directory for one corpus (repeatable)")
    ap.add_argument("--manifest", default=None, help="score exactly the documents of this manifest JSON")
    ap.add_argument("--sweep-manifest", action="store_true",
                    help=f"CHECKPOINT is a sweep run directory: score the documents of <sweep dir>/{SWEEP_MANIFEST}, "
                         "or write it from this run's documents when it does not exist yet")
    ap.add_argument("--write-manifest", default=None, help="write the manifest of the scored documents here")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the config's vocab_file)")
    ap.add_argument("--prefix-token", default=None,
                    help="token that precedes every document (default: as lm-eval, the tokenizer's bos, else its eos)")
    ap.add_argument("--per-document", action="store_true", help="also write each document's NLL and tokens")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--no-wandb", action="store_true",
                    help="do not add the results to the training run's W&B run (by default they are when the run "
                         "trained with use_wandb: eval/<corpus>/<metric> against eval/step)")
    ap.add_argument("--out", default=None, help="write the results JSON here (default: print it)")
    return ap


class AgreedError(Exception):
    """An error that every rank of the evaluation stops on together; rank 0 prints it."""


# one line each: RunWriteError is an OSError, RunFileError a ValueError; AttentionImplError: --attention-impl triton
# where it cannot run
EXPLAINED = (OSError, CorpusError, ValueError, AttentionImplError)
T = TypeVar("T")


def _agreed(group: EvalGroup, fn: Callable[[], T], here: bool) -> T | None:
    """``fn()`` where ``here``; an error it raises (:data:`EXPLAINED`) on any rank raises :class:`AgreedError` on
    every rank (a collective: every rank calls this)."""
    found = failure = None
    if here:
        try:
            found = fn()
        except EXPLAINED as e:
            failure = str(e)
    first = group.first_error(failure)
    if first is not None:
        raise AgreedError(first)
    return found


def on_main(group: EvalGroup, fn: Callable[[], T]) -> T:
    """``fn()`` on rank 0, its result on every rank (:func:`_agreed`)."""
    return group.share(_agreed(group, fn, group.is_main))


def on_every(group: EvalGroup, fn: Callable[[], T]) -> T:
    """``fn()`` on every rank, each its own result; any rank's error stops all (:func:`_agreed`)."""
    return _agreed(group, fn, True)


def main(argv: list[str] | None = None, group: EvalGroup | None = None, load=None) -> int:
    """The command; ``group``: the ranks of a caller that has started them (default: :func:`.parallel.start_group`,
    closed at the end); ``load``: a caller's :func:`load_checkpoint` (one that keeps what it loaded for its own
    use after this)."""
    one_line_notices()  # this package's warnings as `warning: ...`, one line
    args = build_parser().parse_args(argv)
    try:
        check_device(args.device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    own = group is None
    group = group or start_group(args.device)
    try:
        return _evaluate(args, group, load or load_checkpoint)
    except AgreedError as e:
        if group.is_main:
            print(f"error: {e}", file=sys.stderr)
        return 2
    except EXPLAINED as e:
        print(f"error: {'' if group.is_main else f'rank {group.rank}: '}{e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if group.is_main:
            print("error: interrupted (Ctrl-C): nothing was written", file=sys.stderr)
        return 130
    finally:
        if own:
            group.close()


def _documents(args: argparse.Namespace) -> tuple[list[str], dict[str, list[Document]], dict[str, dict]]:
    """The corpora's names, documents and manifest entries (the arguments checked first: the window's sizes, the
    output paths, the corpora)."""
    for flag, path in (("--out", args.out), ("--write-manifest", args.write_manifest)):
        if path:
            check_writable(path, flag)
    for flag in ("max_length", "stride", "batch_size"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    names = list(dict.fromkeys(c.strip() for c in args.corpora.split(",") if c.strip()))  # c4,c4: scored once
    unknown = [c for c in names if c not in ALL_CORPORA]
    if unknown or not names:
        raise ValueError(f"--corpora: unknown {unknown or 'empty list'}; choose from {', '.join(ALL_CORPORA)}")
    if args.manifest and args.sweep_manifest:
        raise ValueError("--manifest and --sweep-manifest exclude each other")
    corpus_args = (names, args.source, args.data_dir, _parse_paths(args.corpus_path),
                   parse_max_docs(args.max_docs, names))
    if args.sweep_manifest:
        return names, *pinned_corpora(sweep_manifest_path(args.checkpoint), *corpus_args)
    return names, *load_corpora(*corpus_args, read_manifest(args.manifest) if args.manifest else None)


def read_manifest(path: str) -> dict:
    """A ``--write-manifest`` file, checked: ValueError (one line naming it) for a missing file, one that is not
    JSON, or not ``{"corpora": {name: {"documents": [...], ...}}}`` (an empty one pinned nothing, silently)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"--manifest {path}: no such file") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"--manifest {path}: not readable JSON ({e})") from None
    corpora = data.get("corpora") if isinstance(data, dict) else None
    if not isinstance(corpora, dict) or not corpora or not all(
            isinstance(e, dict) and isinstance(e.get("documents"), list) for e in corpora.values()):
        raise ValueError(f"--manifest {path}: not a corpus manifest "
                         '({"corpora": {name: {"documents": [...], ...}}}, as --write-manifest writes it)')
    return data


def _evaluate(args: argparse.Namespace, group: EvalGroup, load) -> int:
    device = group.device(args.device)
    names, docs, entries = on_main(group, lambda: _documents(args))  # rank 0 reads them (and pins a sweep's)
    loaded, tokenizer, prefix = load(args, group, device)
    max_length = loaded.cfg.seq_length if args.max_length is None else args.max_length
    if max_length > loaded.cfg.max_position_embeddings:
        raise AgreedError(f"--max-length {max_length} exceeds max_position_embeddings "
                          f"{loaded.cfg.max_position_embeddings}")
    corpora = {name: score_corpus(loaded.model, tokenizer, docs[name], max_length, prefix, args.stride,
                                  args.batch_size, device, not args.no_progress and group.is_main, name,
                                  args.per_document, group)
               for name in names}
    if not group.is_main:
        return 0
    for name in names:
        corpora[name]["manifest_sha256"] = entries[name]["sha256"]
        corpora[name]["source"] = entries[name]["source"]
    results = {**loaded.info, "manifest_hash": manifest_hash(entries), "max_length": max_length,
               "stride": args.stride or max_length, "prefix_token": prefix, "dtype": args.dtype,
               "device": str(args.device),
               "ranks": group.world_size, "provenance": provenance(), "corpora": corpora}
    text = json.dumps(results, indent=2)
    with uninterrupted():  # no signal between the two writes; the result first, then the manifest that pins it
        if args.out:
            write_output(args.out, text + "\n")
        if args.write_manifest:
            write_output(args.write_manifest, json.dumps({"corpora": entries}, indent=1))
    if args.out:
        for name, r in corpora.items():
            print(f"{name}: token ppl {r['token_perplexity']:.3f}  word ppl {r['word_perplexity']:.3f}  "
                  f"bits/byte {r['bits_per_byte']:.4f}  bits/char {r['bits_per_char']:.4f}  "
                  f"({r['documents']} docs, {r['tokens']} tokens)")
    else:
        print(text)
    if not args.no_wandb:
        log_to_wandb(Path(loaded.info["checkpoint"]), results)
    return 0


def load_checkpoint(args: argparse.Namespace, group: EvalGroup, device: str) -> tuple[LoadedModel, Tokenizer, int]:
    """The model of ``args.checkpoint`` on every rank (the checkpoint rank 0 chooses: a run's newest when it names a
    run, held while every rank reads its weights and tokenizer), its tokenizer and prefix token."""
    with ExitStack() as held:
        where = on_main(group, lambda: args.checkpoint if is_hf_folder(args.checkpoint)
                        else str(held.enter_context(held_checkpoint(args.checkpoint))))

        def read() -> tuple[LoadedModel, Tokenizer, int]:
            if not group.is_main and not is_hf_folder(where):
                held.enter_context(held_checkpoint(where))
            loaded = load_for_eval(where, device, args.dtype, args.attention_impl)
            tokenizer_path = tokenizer_file(loaded.cfg, args.tokenizer, loaded.model_dir)
            loaded = dataclasses.replace(loaded, info={**loaded.info,
                                                       "tokenizer_sha256": tokenizer_sha256(tokenizer_path)})
            return loaded, load_tokenizer(path=tokenizer_path), prefix_token_id(tokenizer_path, args.prefix_token)

        return on_every(group, read)  # no rank lets the checkpoint go before every rank has read it


def log_to_wandb(checkpoint: Path, results: dict) -> None:
    """Add the results to the W&B run of the training run that wrote ``checkpoint`` (a step directory of a run
    directory holding ``wandb_run_id``, trained with ``use_wandb``): ``eval/<corpus>/<metric>`` against the
    checkpoint's step as ``eval/step``."""
    from ..config import load_config
    from ..rundir import CONFIG, WANDB_ID
    from .tables import METRICS

    run_dir = checkpoint.parent.parent
    if not (run_dir / WANDB_ID).is_file() or not (run_dir / CONFIG).is_file():
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = load_config(run_dir / CONFIG).run
    if not cfg.use_wandb:
        return
    import wandb

    run = wandb.init(project=cfg.wandb_project, entity=cfg.wandb_team, group=cfg.wandb_group,
                     name=cfg.wandb_run_name, id=(run_dir / WANDB_ID).read_text().strip(), resume="allow",
                     dir=str(run_dir))
    run.define_metric("eval/step")
    run.define_metric("eval/*", step_metric="eval/step")
    run.log({"eval/step": results["step"], **{f"eval/{name}/{m}": r[m] for name, r in results["corpora"].items()
                                              for m in METRICS if m in r}})
    run.finish()
    print(f"logged to W&B run {run.id} ({cfg.wandb_project}/{cfg.wandb_group or ''}/{cfg.wandb_run_name or ''})",
          file=sys.stderr)  # stdout is the results JSON


if __name__ == "__main__":
    sys.exit(main())
