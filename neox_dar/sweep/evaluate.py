"""A sweep run's evaluation: ``python -m eval.perplexity`` on the run (when ``eval/perplexity.json`` is missing or
scored an older checkpoint than the newest), then the sweep's *extra* corpora (``eval: {extra: {NAME: PATH}}``):
local JSON-lines files of documents (one object per line with a ``text`` field; ``.jsonl`` or ``.jsonl.gz``), scored
on the same checkpoint with the same rolling windows and added to ``eval/perplexity.json`` under NAME, beside the
papers' three corpora (the report shows them as extra columns; Rel. (%) stays the papers' mean over their three).

    python -m neox_dar.sweep.evaluate RUN_DIR [--extra NAME=PATH ...] [eval.perplexity options ...]

`run --local` and the SLURM job both evaluate through this command. An extra corpus already in the file is not
scored again; every document of its file is scored, and the entry records the documents' manifest hash and the
file, as the main evaluation does.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from pathlib import Path

from ..evaluation.corpora import ALL_CORPORA, CorpusError, Document, corpus_manifest
from ..evaluation.loading import load_for_eval
from ..evaluation.perplexity import score_corpus
from ..rundir import EVAL_DIR, FINAL_EVAL, read_json, write_text_atomic
from ..tokenizer import load_tokenizer, prefix_token_id, tokenizer_file
from ..top_packages import module_name
from .rundir import needs_eval


def parse_extra(items: list[str] | dict) -> dict[str, str]:
    """``{NAME: PATH}`` from ``NAME=PATH`` strings (or a mapping); a name of a built-in corpus, or one that is not
    a word, is a ValueError."""
    pairs = items.items() if isinstance(items, dict) else (str(i).partition("=")[::2] for i in items)
    out = {}
    for name, path in pairs:
        name = str(name)
        if not name.isidentifier() or not path:
            raise ValueError(f"an extra corpus is NAME=PATH with NAME a word, got {name!r}={path!r}")
        if name in ALL_CORPORA:
            raise ValueError(f"extra corpus name '{name}' is a built-in corpus: list it in the eval corpora instead")
        out[name] = str(path)
    return out


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


def _option(args: list[str], flag: str, default: str | None) -> str | None:
    """The value of ``flag`` in eval.perplexity options (``--flag V`` or ``--flag=V``; the last one wins)."""
    value = default
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def score_extra(run_dir: Path, corpora: dict[str, str], options: list[str]) -> list[str]:
    """Score the ``corpora`` that ``{run}/eval/perplexity.json`` lacks, on the checkpoint it scored, with its windows
    and the batch size, dtype, device and attention path of the eval.perplexity ``options``; add each to the file
    (atomically). Returns the names scored."""
    import torch

    path = Path(run_dir) / EVAL_DIR / FINAL_EVAL
    results = read_json(path)
    todo = [n for n in corpora if n not in results.get("corpora", {})]
    if not todo:
        return []
    device = _option(options, "--device", "cuda" if torch.cuda.is_available() else "cpu")
    loaded = load_for_eval(run_dir, device, _option(options, "--dtype", "float32"),
                           _option(options, "--attention-impl", None))
    if loaded.info["step"] != results.get("step"):
        raise ValueError(f"{path} scored step {results.get('step')}, but the run's newest checkpoint is step "
                         f"{loaded.info['step']}")
    tokenizer_path = tokenizer_file(loaded.cfg, _option(options, "--tokenizer", None), loaded.model_dir)
    tokenizer = load_tokenizer(path=tokenizer_path)
    prefix = prefix_token_id(tokenizer_path, _option(options, "--prefix-token", None))
    batch_size = int(_option(options, "--batch-size", "8"))
    for name in todo:
        docs = read_documents(corpora[name])
        entry = score_corpus(loaded.model, tokenizer, docs, results["max_length"], prefix, results.get("stride"),
                             batch_size, device, "--no-progress" not in options, name)
        manifest = corpus_manifest(docs, str(corpora[name]))
        entry.update(manifest_sha256=manifest["sha256"], source=manifest["source"])
        results["corpora"][name] = entry
        write_text_atomic(path, json.dumps(results, indent=2) + "\n")
        print(f"{name}: token ppl {entry['token_perplexity']:.3f}  ({entry['documents']} docs, {entry['tokens']} "
              f"tokens) -> {path}")
    return todo


def evaluate(run_dir: Path, options: list[str], extra: dict[str, str]) -> int:
    """eval.perplexity when the run's evaluation is missing or stale, then the extra corpora; the exit code."""
    out = Path(run_dir) / EVAL_DIR / FINAL_EVAL
    if needs_eval(run_dir):
        cmd = [sys.executable, "-m", module_name("eval.perplexity"), str(run_dir), *options, "--out", str(out)]
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            return rc
    if extra:
        score_extra(Path(run_dir), extra, options)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m neox_dar.sweep.evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=PATH",
                    help="an extra JSON-lines corpus (repeatable)")
    args, options = ap.parse_known_args(argv)  # the rest are eval.perplexity's options
    try:
        return evaluate(Path(args.run_dir), options, parse_extra(args.extra))
    except (FileNotFoundError, CorpusError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
