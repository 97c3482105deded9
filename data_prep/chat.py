"""Chat SFT data: conversations -> token ids plus labels with the loss on assistant turns only.

    python -m data_prep.chat INPUT... --tokenizer DIR --out PREFIX [--max-length 2048] [--overlong truncate|drop]
    python -m data_prep.chat hf:allenai/tulu-3-sft-olmo-2-mixture --tokenizer ckpt/olmo2 --out data/tulu3

Inputs: ``.jsonl[.gz|.zst]``, ``.parquet`` or ``hf:NAME[:CONFIG][@SPLIT]`` (as ``data_prep.tokenize``), one
conversation per record in its ``--messages-key`` field (default ``messages``): a list of ``{"role", "content"}``
with roles ``system``, ``user``, ``assistant`` (the Tülu 3 format).

Each conversation is rendered with the model's own chat template (``transformers``' ``apply_chat_template`` on the
run's tokenizer: the ``chat_template`` of its ``tokenizer_config.json``, a ``chat_template.jinja`` beside it, or
``--chat-template FILE``), so the token ids are exactly ``apply_chat_template(messages, tokenize=True)``. The label
of a token is the token itself when it lies in an assistant turn (the turn's text as the template renders it after
the generation prompt, end-of-turn tokens included), else -100: the system and user turns and the template's role
markers carry no loss.

Output (GPT-NeoX's label convention): ``PREFIX.bin/.idx`` (the ids), ``PREFIX_label.bin/.idx`` (int32 labels, the
same lengths) and ``PREFIX.manifest.json`` (counts: read, written, truncated, dropped and why; tokens and
assistant tokens; tokenizer and template hashes). Train with ``train_data_paths=[PREFIX]
train_label_data_paths=[PREFIX_label]``. Conversations longer than ``--max-length`` tokens (use the training
``seq_length``) are cut there (``--overlong truncate``, the default) or left out (``drop``); a conversation with no
assistant token left is left out. A bad record (malformed JSON or messages, a lone surrogate, a conversation the
template refuses or cannot render prefix by prefix) is skipped and counted with its reason, or stops the run with
``--strict``. Files appear only when complete, as a set: the four files and the manifest are written under
temporary names, then renamed with Ctrl-C and SIGTERM held, the manifest first and the tokens' ``.idx`` last, and
the manifest records that ``.idx``'s sha256, so a set a kill cut short in its renames (an old ``.idx`` beside the new
manifest) is refused by training, never read mixed. The temporary files a killed run left are removed at the next
start.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import sys
import time
from collections import Counter, defaultdict
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from neox_dar.chat_render import ChatTemplateError, ChatTemplateTimeout, render_chat
from neox_dar.config.files import not_utf8
from neox_dar.data.conversations import IGNORE, label_prefix
from neox_dar.data.identity import sha256_file
from neox_dar.data.indexed import IndexedDatasetWriter, best_dtype, bin_path, idx_path
from neox_dar.progress import progress_bar
from neox_dar.rundir import fault_point, flock_held, uninterrupted, write_text_atomic
from neox_dar.tokenizer import hf_tokenizer

from .encode import BadRecord, check_unicode, load_json, tokenizer_path
from .outputs import make_out_dir
from .sources import expand_inputs, iter_records

ROLES = ("system", "user", "assistant")
CHUNK = 64  # conversations per worker task


class ChatError(ValueError):
    """Bad input to data_prep.chat (one line)."""


def load_chat_tokenizer(path: str, template_file: str | None = None):
    """The run's tokenizer (a ``tokenizer.json`` or a model folder) as a transformers fast tokenizer with its
    special tokens and a chat template; ChatError when it has no template."""
    tokenizer_json = tokenizer_path(path)
    if not tokenizer_json.endswith(".json"):
        raise ChatError(f"{tokenizer_json}: chat rendering needs a Hugging Face tokenizer.json")
    tok = hf_tokenizer(tokenizer_json)
    folder = os.path.dirname(tokenizer_json)
    template = None
    if template_file is not None:
        try:
            template = Path(template_file).read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ChatError(f"--chat-template {not_utf8(template_file, e)}") from None
        except OSError as e:
            raise ChatError(f"--chat-template {template_file}: {e.strerror or e}") from None
        if not template.strip():
            raise ChatError(f"--chat-template {template_file} is empty: name a Jinja chat template")
    elif os.path.isfile(os.path.join(folder, "chat_template.jinja")):
        template = open(os.path.join(folder, "chat_template.jinja"), encoding="utf-8").read()
    elif os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
        found = json.load(open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8")).get("chat_template")
        if isinstance(found, list):  # named templates: the default one
            found = next((t["template"] for t in found if t.get("name") == "default"), None)
        template = found
    if not template:
        where = f"{tokenizer_json} has no chat template beside it in {folder or '.'}"
        raise ChatError(f"{where} (tokenizer_config.json 'chat_template' or chat_template.jinja); pass "
                        "--chat-template FILE")
    tok.chat_template = template
    return tok


def parse_messages(kind: str, payload: object, key: str) -> list[dict]:
    """The messages of one record; BadRecord with the reason when it is not a usable conversation."""
    if kind == "missing":
        raise BadRecord(f"missing field {key!r}")
    if kind == "json":
        obj = load_json(payload)
        if not isinstance(obj, dict) or key not in obj:
            raise BadRecord(f"missing field {key!r}")
        payload = obj[key]
    if not isinstance(payload, list) or not payload:
        raise BadRecord(f"{key!r} must be a non-empty list of messages")
    for i, m in enumerate(payload):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise BadRecord(f"message {i} must be {{'role': one of {', '.join(ROLES)}, 'content': str}}")
        check_unicode(m["content"], f"message {i}: ")
    if not any(m["role"] == "assistant" for m in payload):
        raise BadRecord("no assistant message")
    return [{"role": m["role"], "content": m["content"]} for m in payload]


def render(tok, messages: list[dict]) -> tuple[list[int], list[int]]:
    """``(ids, labels)`` of one conversation: ids = ``apply_chat_template(messages, tokenize=True)``; labels = the id
    on tokens that start inside an assistant turn's rendered text, -100 elsewhere.

    Turn ``i``'s text is the span between the template's rendering of ``messages[:i]`` with the generation prompt
    and of ``messages[:i + 1]``; each rendering must be a prefix of the whole (a BadRecord otherwise: e.g. two
    assistant turns in a row), and a template that refuses the conversation (``raise_exception``, or the sandbox) is
    a BadRecord. A template still rendering after :data:`~neox_dar.chat_render.RENDER_SECONDS` stops the run
    (:class:`~neox_dar.chat_render.ChatTemplateTimeout`, one line): it would take as long on every conversation."""
    try:
        text = render_chat(tok, messages, tokenize=False)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            start = render_chat(tok, messages[:i], tokenize=False, add_generation_prompt=True) if i else ""
            end = render_chat(tok, messages[:i + 1], tokenize=False)
            if not (text.startswith(start) and text.startswith(end) and len(start) <= len(end)):
                raise BadRecord("the chat template does not render this conversation prefix by prefix, so its "
                                "assistant turns cannot be located")
            spans.append((len(start), len(end)))
    except ChatTemplateTimeout:
        raise
    except ChatTemplateError as e:
        raise BadRecord(str(e)) from None
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels = [t if any(a <= s < b for a, b in spans) else IGNORE for t, (s, _) in zip(ids, enc["offset_mapping"])]
    return ids, labels


_WORKER: dict = {}


def _init_worker(path: str, template_file: str | None) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER["tok"] = load_chat_tokenizer(path, template_file)


def _render_chunk(args: tuple[list, str, int, str]) -> list:
    """Worker: ``(records, key, max_length, overlong)`` -> per record ``("ok", ids, labels, truncated)``,
    ``("dropped", reason)`` or ``("bad", source, line, reason)``."""
    records, key, max_length, overlong = args
    out = []
    for src, line, kind, payload in records:
        try:
            ids, labels = render(_WORKER["tok"], parse_messages(kind, payload, key))
        except BadRecord as e:
            out.append(("bad", src, line, str(e)))
            continue
        truncated = len(ids) > max_length
        if truncated and overlong == "drop":
            out.append(("dropped", "overlong"))
            continue
        ids, labels = ids[:max_length], labels[:max_length]
        if all(x == IGNORE for x in labels):
            out.append(("dropped", "no assistant token within max_length"))
            continue
        out.append(("ok", ids, labels, truncated))
    return out


def remove_stale_files(prefix: str) -> list[str]:
    """Remove the temporary files (``PREFIX.tmp-PID.bin/.idx``, ``PREFIX.tmp-PID_label.bin/.idx`` and
    ``PREFIX.tmp-PID.manifest.json``) of earlier runs that ended without cleaning up (SIGKILL, power loss): those
    whose ids ``.bin`` no live run holds locked (:func:`run` locks its own; a lock also holds across machines sharing
    the folder, where a PID would not). Returns the removed paths."""
    folder, base = os.path.split(os.path.abspath(prefix))
    own = re.compile(re.escape(base) + r"\.tmp-(\d+)(?:(?:_label)?\.(?:bin|idx)|\.manifest\.json)")
    runs = defaultdict(list)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        if found := own.fullmatch(name):
            runs[found.group(1)].append(os.path.join(folder, name))
    removed = []
    for pid, paths in runs.items():
        if not flock_held(bin_path(os.path.join(folder, f"{base}.tmp-{pid}"))):
            for path in paths:
                os.remove(path)
            removed += paths
    return removed


def _chunks(records, size: int):
    chunk = []
    for rec, _ in records:
        chunk.append(rec)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data_prep.chat", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[2:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files, globs or hf:NAME[:CONFIG][@SPLIT]")
    p.add_argument("--tokenizer", required=True, metavar="DIR_OR_FILE",
                   help="the model's tokenizer.json or its folder (with its chat template)")
    p.add_argument("--out", required=True, metavar="PREFIX", help="output prefix: PREFIX.bin/.idx, PREFIX_label.*")
    p.add_argument("--messages-key", default="messages", help="field holding the messages (default: messages)")
    p.add_argument("--max-length", type=int, default=2048, help="tokens per conversation at most: the training "
                                                                 "seq_length (default 2048)")
    p.add_argument("--overlong", choices=("truncate", "drop"), default="truncate",
                   help="a longer conversation is cut at --max-length (default) or left out")
    p.add_argument("--chat-template", default=None, metavar="FILE", help="a Jinja chat template to use instead")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="rendering processes (default: one per usable CPU, here %(default)s)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the input-file order (default 1234)")
    p.add_argument("--strict", action="store_true", help="stop at the first bad record instead of skipping it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run(argv: list[str] | None = None) -> dict:
    """Run the command line; returns the manifest."""
    args = build_parser().parse_args(argv)
    if args.max_length < 2 or args.workers < 1:
        raise ChatError("--max-length must be >= 2 and --workers >= 1")
    t0 = time.time()
    tok = load_chat_tokenizer(args.tokenizer, args.chat_template)
    sources = expand_inputs(args.inputs, args.seed)
    vocab = len(tok)
    tmp = f"{args.out}.tmp-{os.getpid()}"
    make_out_dir(args.out)
    if stale := remove_stale_files(args.out):
        print(f"data_prep.chat: removed {len(stale)} files of an interrupted data_prep.chat run "
              f"({os.path.basename(stale[0])}, ...)", file=sys.stderr)
    ids_out = IndexedDatasetWriter(tmp, best_dtype(vocab))
    lock = os.open(bin_path(tmp), os.O_RDONLY)  # held while this run writes: see remove_stale_files
    fcntl.flock(lock, fcntl.LOCK_EX)
    labels_out = IndexedDatasetWriter(label_prefix(tmp), np.int32)
    counts: Counter = Counter()
    bad: list = []
    tokens = assistant = 0
    jobs = ((chunk, args.messages_key, args.max_length, args.overlong)
            for chunk in _chunks(iter_records(sources, args.messages_key, "file"), CHUNK))
    bar = progress_bar(unit=" conversations", disable=args.no_progress, desc="data_prep.chat")
    pool = None
    try:
        if args.workers == 1:
            _WORKER["tok"] = tok
            results = map(_render_chunk, jobs)
        else:
            pool = get_context("spawn").Pool(args.workers, _init_worker, (args.tokenizer, args.chat_template))
            results = pool.imap(_render_chunk, jobs)
        for chunk in results:
            for item in chunk:
                counts["read"] += 1
                if item[0] == "bad":
                    where = f"{sources[item[1]].path}:{item[2]}"
                    if args.strict:
                        raise ChatError(f"{where}: {item[3]}")
                    bad.append([where, item[3]])
                elif item[0] == "dropped":
                    counts[f"dropped: {item[1]}"] += 1
                else:
                    _, ids, labels, truncated = item
                    ids_out.add_document(np.asarray(ids))
                    labels_out.add_document(np.asarray(labels, dtype=np.int32))
                    counts["written"] += 1
                    counts["truncated"] += truncated
                    tokens += len(ids)
                    assistant += sum(x != IGNORE for x in labels)
            bar.update(len(chunk))
        ids_out.finalize()
        labels_out.finalize()
        if counts["written"] == 0:
            first = f"; the first: {bad[0][0]}: {bad[0][1]}" if bad else ""
            raise ChatError(f"no usable conversation in {', '.join(args.inputs)} ({len(bad)} bad records{first})")
        template = tok.chat_template
        manifest = {
            "format": "Megatron MMapIndexedDataset (GPT-NeoX): one conversation per document; labels in PREFIX_label "
                      "(-100 where the loss is off)",
            "prefix": args.out, "label_prefix": label_prefix(args.out), "idx_sha256": sha256_file(idx_path(tmp)),
            "conversations": {"read": counts["read"], "written": counts["written"], "truncated": counts["truncated"],
                              "bad": len(bad), **{k: v for k, v in counts.items() if k.startswith("dropped")}},
            "tokens": tokens, "assistant_tokens": assistant, "max_length": args.max_length, "overlong": args.overlong,
            "tokenizer": {"path": tokenizer_path(args.tokenizer),
                          "sha256": sha256_file(tokenizer_path(args.tokenizer)), "vocab_size": vocab},
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
            "inputs": [s.describe() for s in sources], "bad_records": bad[:100],
            "command": ["python", "-m", "data_prep.chat", *(argv if argv is not None else sys.argv[1:])],
            "seconds": round(time.time() - t0, 3),
        }
        write_text_atomic(f"{tmp}.manifest.json", json.dumps(manifest, indent=2) + "\n")
    except BaseException:
        for path in (bin_path(tmp), idx_path(tmp), bin_path(label_prefix(tmp)), idx_path(label_prefix(tmp)),
                     f"{tmp}.manifest.json"):
            if os.path.exists(path):
                os.remove(path)
        raise
    finally:
        bar.close()
        if pool is not None:  # also on an error: a pool left running prints tracebacks when it is collected
            pool.terminate()
            pool.join()
    try:
        with uninterrupted():  # the set is replaced whole; a Ctrl-C or SIGTERM here arrives once it is
            os.replace(f"{tmp}.manifest.json", f"{args.out}.manifest.json")
            fault_point("chat-replacing")
            for src, dst in ((label_prefix(tmp), label_prefix(args.out)), (tmp, args.out)):
                os.replace(bin_path(src), bin_path(dst))
                os.replace(idx_path(src), idx_path(dst))
    except KeyboardInterrupt:
        print("data_prep.chat: Ctrl-C arrived while the files were replaced; they are complete", file=sys.stderr)
    finally:
        os.close(lock)  # held through the renames: another run's start removes only unlocked temporaries
    return manifest


def main(argv: list[str] | None = None) -> int:
    try:
        m = run(argv)
    except (ChatError, ValueError, OSError) as e:
        print(f"data_prep.chat: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("data_prep.chat: interrupted (Ctrl-C): nothing was written (its temporary files are removed); run the "
              "same command again", file=sys.stderr)
        return 130
    c = m["conversations"]
    dropped = sum(v for k, v in c.items() if k.startswith("dropped"))
    print(f"wrote {m['prefix']}.bin/.idx and {m['label_prefix']}.bin/.idx: {c['written']:,} conversations, "
          f"{m['tokens']:,} tokens ({m['assistant_tokens']:,} with loss); {c['truncated']} truncated, {dropped} "
          f"dropped, {c['bad']} bad records skipped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
