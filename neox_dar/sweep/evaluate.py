"""A sweep run's evaluation: ``python -m eval.perplexity`` on the run (when ``eval/perplexity.json`` is missing or
scored an older checkpoint than the newest), then the sweep's *extra* corpora (``eval: {extra: {NAME: PATH}}``):
local JSON-lines files of documents (one object per line with a ``text`` field; ``.jsonl`` or ``.jsonl.gz``), scored
on the same checkpoint with the same rolling windows and added to ``eval/perplexity.json`` under NAME, beside the
papers' three corpora (the report shows them as extra columns; Rel. (%) stays the papers' mean over their three).

    python -m neox_dar.sweep.evaluate RUN_DIR [--extra NAME=PATH ...] [eval.perplexity options ...]
    torchrun --nproc_per_node 8 -m neox_dar.sweep.evaluate RUN_DIR ...      # every GPU, the same results

`run --local` and the SLURM job both evaluate through this command: the job on every GPU of its nodes (started as
the training is, by slurm/launch_node.sh), `run --local` with its ``--nproc`` processes. An extra corpus already in
the file is not scored again; every document of its file is scored, and the entry records the documents' manifest
hash and the file, as the main evaluation does.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from ..evaluation.cli import AgreedError, build_parser, load_checkpoint, on_main
from ..evaluation.cli import main as perplexity_main
from ..evaluation.corpora import CorpusError, Document, corpus_manifest
from ..evaluation.parallel import EvalGroup, start_group
from ..evaluation.perplexity import score_corpus
from ..rundir import EVAL_DIR, FINAL_EVAL, read_json, write_text_atomic
from .extra import parse_extra
from .rundir import needs_eval
from ..notices import one_line_notices


def read_documents(path: str | Path) -> list[Document]:
    """Every document of a JSON-lines file (``text``; ``id`` or ``title`` name it, else its line number)."""
    p = Path(path)
    opener = gzip.open if p.name.endswith(".gz") else open
    docs, lineno = [], 0
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise CorpusError(f"{p}:{lineno}: no string 'text' field")
                doc_id = str(row.get("id") or row.get("title") or f"{p.name}:{lineno}")
                docs.append(Document(doc_id, row["text"], row["text"]))
    except json.JSONDecodeError as e:
        raise CorpusError(f"{p}:{lineno}: not JSON ({e})") from None
    if not docs:
        raise CorpusError(f"{p} holds no documents")
    return docs


def score_extra(run_dir: Path, corpora: dict[str, str], options: list[str], group: EvalGroup | None = None,
                load=load_checkpoint) -> list[str]:
    """Score the ``corpora`` that ``{run}/eval/perplexity.json`` lacks, on the checkpoint it scored, with its windows
    and the batch size, dtype, device and attention path of the eval.perplexity ``options``; add each to the file
    (atomically, rank 0). With a ``group`` of several ranks each scores its share. Returns the names scored."""
    group = group or EvalGroup()
    path = Path(run_dir) / EVAL_DIR / FINAL_EVAL
    results = on_main(group, lambda: read_json(path))
    todo = [n for n in corpora if n not in results.get("corpora", {})]
    if not todo:
        return []
    args = build_parser().parse_args([str(run_dir), *options])
    device = group.device(args.device)
    loaded, tokenizer, prefix = load(args, group, device)
    if loaded.info["step"] != results.get("step"):
        raise AgreedError(f"{path} scored step {results.get('step')}, but the run's newest checkpoint is step "
                          f"{loaded.info['step']}")
    for name in todo:
        docs = on_main(group, lambda: read_documents(corpora[name]))
        entry = score_corpus(loaded.model, tokenizer, docs, results["max_length"], prefix, results.get("stride"),
                             args.batch_size, device, not args.no_progress and group.is_main, name, group=group)
        if not group.is_main:
            continue
        manifest = corpus_manifest(docs, str(corpora[name]))
        entry.update(manifest_sha256=manifest["sha256"], source=manifest["source"])
        results["corpora"][name] = entry
        write_text_atomic(path, json.dumps(results, indent=2) + "\n")
        print(f"{name}: token ppl {entry['token_perplexity']:.3f}  ({entry['documents']} docs, {entry['tokens']} "
              f"tokens) -> {path}")
    return todo


def evaluate(run_dir: Path, options: list[str], extra: dict[str, str], group: EvalGroup | None = None) -> int:
    """eval.perplexity when the run's evaluation is missing or stale, then the extra corpora (on the checkpoint it
    loaded: read once); the exit code. With a ``group`` of several ranks, every rank takes part and rank 0 writes."""
    group = group or EvalGroup()
    out = Path(run_dir) / EVAL_DIR / FINAL_EVAL
    loaded = []

    def load(args, group, device):  # the checkpoint is read once for both
        if not loaded:
            loaded.append(load_checkpoint(args, group, device))
        return loaded[0]

    if on_main(group, lambda: needs_eval(run_dir)):
        rc = perplexity_main([str(run_dir), *options, "--out", str(out)], group, load)
        rc = max(group.all_gather(rc))  # the ranks go on together (rank 0 alone writes, and may fail to)
        if rc != 0:
            return rc
    if extra:
        score_extra(Path(run_dir), extra, options, group, load)
    return 0


def main(argv: list[str] | None = None) -> int:
    one_line_notices()  # this package's warnings as `warning: ...`, one line
    ap = argparse.ArgumentParser(prog="python -m neox_dar.sweep.evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=PATH",
                    help="an extra JSON-lines corpus (repeatable)")
    args, options = ap.parse_known_args(argv)  # the rest are eval.perplexity's options
    group = start_group(build_parser().parse_args([args.run_dir, *options]).device)
    try:
        return evaluate(Path(args.run_dir), options, parse_extra(args.extra), group)
    except AgreedError as e:
        if group.is_main:
            print(f"error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, CorpusError, ValueError) as e:
        print(f"error: {'' if group.is_main else f'rank {group.rank}: '}{e}", file=sys.stderr)
        return 2
    finally:
        group.close()


if __name__ == "__main__":
    sys.exit(main())
