"""The papers' downstream evaluations as named suites, run through lm-evaluation-harness on a checkpoint.

    python -m eval.downstream run CHECKPOINT --suite aha-table1 [--limit N] [--min-context N] --out results.json
    python -m eval.downstream table base.json aha-w64.json ... [--base base.json]      # the paper's table
    python -m eval.downstream list                                                     # the suites

A suite (:data:`eval.suites.SUITES`) is a list of (lm-eval task, few-shot count, metric) as the paper ran it and the
context length every model it compares is evaluated at (``max_length``: lm-eval keeps the last ``max_length`` tokens
of a longer prompt; null = each checkpoint's ``seq_length``); ``--suite-file FILE.yml`` adds one (``{name: {paper,
tasks: [[task, shots, metric], ...], min_context: window|null, relative: label, max_length: N|null}}``, with
``--include-path DIR`` for local task YAMLs; ``metadata: {...}`` for tasks that read it). Each task runs through the
project's lm-eval model (:mod:`eval.lm_eval_model`: the checkpoint's own attention, caches and tokenizer), with lm-eval's
few-shot seed (1234). Consecutive rows of one task and shot count (RULER at 4k and 8k) share one evaluation.

RULER (DimPO Table 4, suite ``dimpo-table4``): its tasks build their documents at each of the lengths in the
suite's ``metadata`` (``max_seq_lengths``), sized with a tokenizer that lm-eval loads by name; the suite passes the
checkpoint's own tokenizer (saved to a temporary folder) as ``tokenizer``. A group's score for a metric its
aggregate does not list (lm-eval's ``ruler`` group aggregates only ``4096``) is the unweighted mean over its
subtasks, as the group's own aggregate is (and the paper's "averages across all subtasks"). RULER needs the
``wonderwords`` and ``nltk`` packages (``pip install lm_eval[ruler]``) and, for its essay haystacks and QA tasks,
the Hugging Face Hub.

DAR's and AHA's filter: "we exclude samples whose input context is shorter than the window size" — a suite with
``min_context: window`` drops, per task, every document whose prompt (few-shot examples included, as the model
receives it) has fewer tokens than the checkpoint's ``window_size`` (``--min-context N`` sets it, e.g. to the
variant's window when evaluating the base model, and ``--min-context 0`` turns the filter off). The prompts are
built once, the short documents' requests removed, and lm-eval scores the rest, so the kept documents see exactly
the few-shot examples they would have seen.

The result file holds each task's score (the paper's metric), its standard error, the documents scored and
dropped, the attention statistics over the scored tokens (AHA's full-attention usage ``mu_f`` per layer and
head, overall and per task: over every prompt token in log-likelihood tasks, over the generated tokens in
generation tasks, AHA's Eq. 8), the context length (``max_length``) and lm-eval's version. ``table`` prints each
run's scores, their average and the relative score (DAR's "Rel. (%)", AHA's "Retain %": the mean over tasks of
100 x score / the base run's score), and refuses result files evaluated at different context lengths or filtered
at different lengths. A group's subtask left with no document is left out of the group's score (named in the row's
``unscored_subtasks``); a tag (no aggregate of its own) is scored as the unweighted mean of its tasks.

Choices where the papers are silent or differ (tests/test_fidelity.py pins them):

- **Context length.** DAR and AHA fine-tune OLMo-2-0425-1B-SFT at 2,048 tokens and compare with the base model,
  whose context is 4,096; neither paper states the evaluation context. Their suites evaluate every model at 4,096
  tokens (AHA's MultiNews prompts average 2,196 tokens, which 2,048 would cut). MSWA's Table 4 suites use 4,096
  (Llama-2's context, the fine-tuning sequence length). DimPO's suite compares a checkpoint with its own
  projections, so it keeps the checkpoint's ``seq_length``.
- **GSM8K.** AHA reports exact match: lm-eval's ``exact_match,strict-match`` (the answer after ``####``); DAR
  reports flexible-extract match: ``exact_match,flexible-extract`` (the last number in the answer).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

from neox_dar.rundir import check_writable, write_output

from .local_tasks import task_manager
from .suites import CODE_TASKS, Suite, SuiteError, SuiteTask, load_suites
from neox_dar.notices import one_line_notices


# ----------------------------------------------------------------------------------------------
# running


def _prompt_lengths(task, lm, limit: int | None) -> dict[int, int]:
    """Build the task's requests (few-shot contexts included) once; ``doc_id -> prompt tokens``."""
    task.build_all_requests(limit=limit, rank=0, world_size=1)
    lengths: dict[int, int] = {}
    for inst in task.instances:
        lengths[inst.doc_id] = max(lengths.get(inst.doc_id, 0), len(lm.tok_encode(inst.args[0])))
    return lengths


def _score(results: dict, task: str, metric: str) -> tuple[float, float | None]:
    """(score, stderr) of ``metric`` for ``task`` from lm-eval's ``results``: the task's own, else (a tag, or a group
    whose aggregate does not list it) the unweighted mean over its members that report it, without a stderr."""
    own = results.get(task)
    if own is not None and metric in own:
        stderr = own.get(metric.replace(",", "_stderr,", 1))
        return float(own[metric]), float(stderr) if isinstance(stderr, float) else None
    leaves = [r[metric] for name, r in results.items() if name != task and metric in r]
    if not leaves:
        have = sorted({k for r in results.values() for k in r if "," in k})
        raise SuiteError(f"task {task} reported no {metric!r} (it has {', '.join(have)})")
    return sum(map(float, leaves)) / len(leaves), None


def run_task(lm, specs: list[SuiteTask], task_manager, limit: int | None, min_context: int,
             allow_code: bool) -> list[dict]:
    """Score one suite task (``specs``: its rows, one task and shot count, one metric each): lm-eval's requests
    built once, documents whose prompt is shorter than ``min_context`` tokens removed, the rest scored by lm-eval's
    evaluator once. Returns each row's result entry."""
    spec = specs[0]
    from lm_eval.evaluator import evaluate

    # {"tasks": every leaf task by name, "groups", "group_map"}: a group of groups (mmlu -> mmlu_stem -> tasks) is
    # flat here; the nested form of the deprecated get_task_dict crashed evaluate() on it (lm-eval 0.4.13)
    task_dict = task_manager.load([spec.task])
    samples, kept, dropped = {}, 0, 0
    for name, task in task_dict["tasks"].items():
        task.set_config(key="num_fewshot", value=spec.shots)
        task.set_fewshot_seed(seed=1234)
        lengths = _prompt_lengths(task, lm, limit)
        keep = sorted(d for d, n in lengths.items() if n >= min_context)
        position = {doc: i for i, doc in enumerate(keep)}  # lm-eval numbers selected documents 0, 1, ...
        task._instances = [inst for inst in task.instances if inst.doc_id in position]
        for inst in task._instances:
            inst.doc_id = position[inst.doc_id]
        task.build_all_requests = lambda **_: None  # evaluate() scores the requests built (and filtered) above
        samples[name] = keep
        kept, dropped = kept + len(keep), dropped + len(lengths) - len(keep)
    if kept == 0:
        return [{"task": s.task, "shots": s.shots, "metric": s.metric, "score": None, "docs": 0,
                 "dropped_short": dropped, "note": f"no document has a prompt of >= {min_context} tokens"}
                for s in specs]
    empty = sorted(name for name, keep in samples.items() if not keep)
    # the subtasks left with no document are not scored (lm-eval cannot score an empty one); a group aggregates the
    # leaf tasks that have results
    task_dict = {**task_dict, "tasks": {n: t for n, t in task_dict["tasks"].items() if n not in empty}}
    samples = {name: keep for name, keep in samples.items() if keep}
    lm.reset_attention_stats()
    out = evaluate(lm, task_dict, samples=samples, log_samples=False, confirm_run_unsafe_code=allow_code,
                   verbosity="WARNING")
    rows = []
    for s in specs:
        score, stderr = _score(out["results"], s.task, s.metric)
        rows.append({"task": s.task, "label": s.label, "shots": s.shots, "metric": s.metric, "score": score,
                     "stderr": stderr, "docs": kept, "dropped_short": dropped, **lm.attention_stats(),
                     **({"unscored_subtasks": empty} if empty else {})})
    return rows


def run_suite(checkpoint: str, suite_name: str, suites: dict[str, Suite], *, limit: int | None = None,
              min_context: int | None = None, include_path: str | None = None, batch_size: int | str = 8,
              device: str | None = None, dtype: str = "float32", allow_code: bool = False,
              max_length: int | None = None) -> dict:
    """Every task of ``suite_name`` on ``checkpoint``: the result dict written by ``run``. When ``include_path``
    holds every task of the suite (and every task a group of them lists), lm-eval's built-in tasks are not indexed
    (:func:`.local_tasks.task_manager`: ~10 s less start-up); otherwise the include_path tasks are added to them."""
    from lm_eval import __version__ as lm_eval_version

    from .lm_eval_model import NeoxDarLM

    suite = suites[suite_name]
    code = sorted({t.task for t in suite.tasks} & CODE_TASKS)
    if code and not allow_code:
        raise SuiteError(f"suite {suite_name} runs {', '.join(code)}, whose metric executes model-written code: "
                         "pass --allow-code-execution (in a sandbox) or use --suite-file without it")
    t0 = time.time()
    lm = NeoxDarLM(checkpoint=checkpoint, device=device, dtype=dtype, batch_size=batch_size,
                   max_length=max_length or suite.max_length)
    if min_context is None:
        min_context = lm.window_size() if suite.min_context == "window" else 0
    rows = []
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        metadata = None
        if suite.metadata is not None:  # tasks that size their documents with a tokenizer (RULER) get the model's
            lm.tokenizer.save_pretrained(tokenizer_dir)
            metadata = {**suite.metadata, "tokenizer": tokenizer_dir}
        manager = task_manager([t.task for t in suite.tasks], include_path, metadata)
        unknown = sorted({t.task for t in suite.tasks} - set(manager.all_tasks))
        if unknown:
            raise SuiteError(f"suite {suite_name}: no lm-eval task named {', '.join(unknown)} (lm-eval's tasks"
                             + (f" and {include_path}" if include_path else ", and no --include-path") + ")")
        for _, group in itertools.groupby(suite.tasks, key=lambda t: (t.task, t.shots)):
            group = list(group)
            rows += run_task(lm, group, manager, limit, min_context, allow_code)
            for row in rows[-len(group):]:
                print(f"{row['task']} ({row['metric']}): {row['score']} ({row['docs']} documents, "
                      f"{row['dropped_short']} shorter than {min_context} tokens dropped)", file=sys.stderr)
    lm.reset_attention_stats()
    return {"checkpoint": str(checkpoint), "suite": suite_name, "paper": suite.paper, "min_context": min_context,
            "max_length": lm.max_length, "suite_max_length": suite.max_length, "metadata": suite.metadata,
            "limit": limit, "tasks": rows,
            "lm_eval_version": lm_eval_version, "model": lm.describe(),
            "seconds": round(time.time() - t0, 1)}


# ----------------------------------------------------------------------------------------------
# tables


def _scores(result: dict) -> dict[str, float | None]:
    return {row["task"]: row["score"] for row in result["tasks"]}


def table(results: list[dict], base: dict | None, suites: dict[str, Suite]) -> str:
    """Markdown: one row per result file (its tasks' scores in percent, their average, the relative score
    against ``base`` and AHA's overall ``mu_f`` when measured)."""
    names = {r["suite"] for r in results} | ({base["suite"]} if base else set())
    if len(names) != 1:
        raise SuiteError(f"the result files are of different suites: {', '.join(sorted(names))}")
    every = results + ([base] if base else [])
    lengths = {r.get("max_length") for r in every}
    if len(lengths) > 1:
        raise SuiteError("the result files were evaluated at different context lengths (" + ", ".join(
            f"{r['checkpoint']}: {r.get('max_length') or 'not recorded'}" for r in every) + "); run them again with "
            "one --max-length")
    contexts = {r.get("min_context") for r in every}
    if len(contexts) > 1:
        raise SuiteError("the result files dropped documents shorter than different lengths (" + ", ".join(
            f"{r['checkpoint']}: {r.get('min_context')}" for r in every) + "), so they scored different documents; "
            "run them again with one --min-context")
    suite = suites.get(next(iter(names)))
    tasks = [row["task"] for row in results[0]["tasks"]]
    labels = {row["task"]: row.get("label") or row["task"] for row in results[0]["tasks"]}
    header = ["run", *(labels[t] for t in tasks), "Avg."]
    if base is not None:
        header.append(suite.relative if suite else "Rel. (%)")
    with_mu = any("mu_f" in row for r in results for row in r["tasks"])
    if with_mu:
        header.append("mu_f")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ref = _scores(base) if base is not None else None
    for r in results:
        s = _scores(r)
        if [row["task"] for row in r["tasks"]] != tasks:
            raise SuiteError(f"{r['checkpoint']}: its tasks differ from the first result file's")
        have = [s[t] for t in tasks if s[t] is not None]
        cells = [Path(r["checkpoint"]).name or r["checkpoint"],
                 *("-" if s[t] is None else f"{100 * s[t]:.2f}" for t in tasks),
                 f"{100 * sum(have) / len(have):.2f}" if have else "-"]
        if ref is not None:
            pairs = [(s[t], ref[t]) for t in tasks if s[t] is not None and ref.get(t)]
            cells.append(f"{sum(100 * a / b for a, b in pairs) / len(pairs):.2f}" if pairs else "-")
        if with_mu:
            mus = [row["mu_f"] for row in r["tasks"] if "mu_f" in row]
            cells.append(f"{sum(mus) / len(mus):.3f}" if mus else "-")
        lines.append("| " + " | ".join(cells) + " |")
    title = f"{suite.paper if suite else next(iter(names))}" + (f" ({suite.notes})" if suite and suite.notes else "")
    length = next(iter(lengths))
    title += f"; context {length:,} tokens for every model" if length else ""
    return f"{title}\n\n" + "\n".join(lines) + "\n"


def _read(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
        data["tasks"], data["suite"]  # noqa: B018 - the keys a result file must have
        return data
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SuiteError(f"{path}: not a result file of eval.downstream run ({type(e).__name__}: {e})") from None


def main(argv: list[str] | None = None) -> int:
    one_line_notices()  # this package's warnings as `warning: ...`, one line
    p = argparse.ArgumentParser(prog="python -m eval.downstream", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a suite on a checkpoint")
    r.add_argument("checkpoint", help="run dir, checkpoints dir, step dir, or a Hugging Face folder")
    r.add_argument("--suite", required=True)
    r.add_argument("--suite-file", default=None, help="YAML with more suites")
    r.add_argument("--include-path", default=None, help="directory of local lm-eval task YAMLs")
    r.add_argument("--limit", type=int, default=None, help="documents per task (before the context filter)")
    r.add_argument("--min-context", type=int, default=None,
                   help="drop documents whose prompt has fewer tokens (default: the suite's rule)")
    r.add_argument("--batch-size", default="8")
    r.add_argument("--device", default=None)
    r.add_argument("--dtype", default="float32")
    r.add_argument("--max-length", type=int, default=None,
                   help="context length (default: the suite's, else the model's seq_length)")
    r.add_argument("--allow-code-execution", action="store_true", help="let code tasks (MBPP) run model code")
    r.add_argument("--out", default=None, help="write the results JSON here (default: print it)")
    t = sub.add_parser("table", help="the paper's table from result files")
    t.add_argument("results", nargs="+")
    t.add_argument("--base", default=None, help="result file of the reference run (relative scores)")
    t.add_argument("--suite-file", default=None)
    ls = sub.add_parser("list", help="the suites")
    ls.add_argument("--suite-file", default=None)
    args = p.parse_args(argv)
    try:
        suites = load_suites(args.suite_file)
        if args.command == "list":
            for name, s in suites.items():
                tasks = ", ".join(f"{t.task} ({t.shots}-shot, {t.metric})" for t in s.tasks)
                print(f"{name}: {s.paper}: {tasks}" + (" [samples shorter than the window dropped]"
                                                         if s.min_context == "window" else "")
                      + " [context: " + (f"{s.max_length:,} tokens" if s.max_length else "the model's seq_length")
                      + "]")
            return 0
        if args.command == "table":
            print(table([_read(x) for x in args.results], _read(args.base) if args.base else None, suites), end="")
            return 0
        if args.suite not in suites:
            raise SuiteError(f"unknown suite {args.suite!r} (known: {', '.join(suites)})")
        for name, least in (("limit", 1), ("min_context", 0), ("max_length", 1)):
            value = getattr(args, name)
            if value is not None and value < least:
                raise SuiteError(f"--{name.replace('_', '-')} must be >= {least}, got {value}")
        if args.out:  # a directory or an unwritable path was a traceback after the whole suite had run
            check_writable(args.out, "--out")
        if args.include_path and not Path(args.include_path).is_dir():  # said as "no lm-eval task named ..."
            raise SuiteError(f"--include-path {args.include_path} is not a folder (of lm-eval task YAML files)")
        from neox_dar.devices import check_device  # (imports torch: not for list and table)

        check_device(args.device)
        batch = int(args.batch_size) if args.batch_size.isdigit() else args.batch_size
        result = run_suite(args.checkpoint, args.suite, suites, limit=args.limit, min_context=args.min_context,
                           include_path=args.include_path, batch_size=batch, device=args.device, dtype=args.dtype,
                           allow_code=args.allow_code_execution, max_length=args.max_length)
    except (SuiteError, FileNotFoundError, ValueError) as e:
        print(f"eval.downstream: error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        try:  # whole or not at all: a failed write leaves an earlier file as it was
            write_output(args.out, text)
        except OSError as e:
            print(f"eval.downstream: error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
