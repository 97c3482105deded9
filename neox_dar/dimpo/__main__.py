"""``python -m neox_dar.dimpo``: fit projections (Table 1), lay out and run the task grid (Tables 2-3), print tables.

    python -m neox_dar.dimpo fit CHECKPOINT --train data/booksum_train --valid data/booksum_valid \\
        --test data/booksum_test --out runs/dimpo-70m
    python -m neox_dar.dimpo table runs/dimpo-70m
    python -m neox_dar.dimpo study CHECKPOINT --train data/booksum_train --out runs/dimpo-70m-pairs   # Fig. 4
    python -m neox_dar.dimpo tasks CHECKPOINT --projections runs/dimpo-70m/projections/dimpo-d{16,4,1}.safetensors \\
        --out runs/dimpo-70m/tasks --run
    python -m neox_dar.dimpo table runs/dimpo-70m/tasks --per-task
    python -m neox_dar.dimpo apply CHECKPOINT --projections runs/dimpo-70m/projections/dimpo-d16.safetensors \
        --layers 12 --out runs/dimpo-70m/applied-l12-d16

User errors (bad data, a projection file for another model, impossible options) print one ``error:`` line and
exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import sys

from ..config import ConfigError
from ..data import IndexedDatasetError
from ..data.check import tokenized_with_other
from ..devices import check_device
from ..report.tables import to_latex, to_markdown
from ..rundir import CheckpointError, RunFileError, check_writable
from ..tokenizer import TokenizerError, tokenizer_file
from .instances import SPLITS, DimPOError
from .methods import METHODS, PAPER
from .pairs import PairSelection
from .study import PANELS
from ..notices import one_line_notices


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None


def _methods(text: str) -> list[str]:
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    if not chosen:  # an empty table, exit 0, before
        raise argparse.ArgumentTypeError(f"names no method; choose from {', '.join(METHODS)}")
    unknown = [m for m in chosen if m not in METHODS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    return chosen


def _fit_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``fit`` (and of ``study``, which runs fits)."""
    p.add_argument("checkpoint", help="a neox-dar checkpoint or a Hugging Face folder")
    p.add_argument("--train", required=True, help="tokenized dataset prefix (.bin/.idx) of the training documents")
    p.add_argument("--valid", help="dataset of the validation documents (default: the next documents of --train)")
    p.add_argument("--test", help="dataset of the test documents (default: the next documents of --valid)")
    p.add_argument("--out", required=True, help="folder for results.json and projections/ (a rerun resumes)")
    p.add_argument("--method", "--methods", dest="methods", type=_methods, default=list(METHODS),
                   help=f"comma-separated, from {','.join(METHODS)} (default: all)")
    p.add_argument("--dims", type=_ints, help="target dims d' (default: 64,32,16,8,4,2,1 below the head dim)")
    p.add_argument("--seq-len", type=int, default=4096, help="tokens per document: its first T (default 4096)")
    for split in SPLITS:
        p.add_argument(f"--{split}-docs", type=int, default=10, help=f"{split} documents (default 10)")
    p.add_argument("--epochs", type=int, default=1, help="passes over the training instances (default 1)")
    p.add_argument("--max-steps", type=int, help="stop each trained projection after this many steps")
    p.add_argument("--lr", type=float, help="learning rate of every trained method (default: Table 6's)")
    p.add_argument("--lr-scale", type=float, default=1.0,
                   help="multiply each method's Table 6 learning rate (small-scale runs: see docs/dimpo.md)")
    p.add_argument("--batch-size", type=int, help="instances per step (default: Table 6's, DimPO 1, others 32)")
    p.add_argument("--beta", type=float, help="beta of DimPO, SimPO, CPO and ORPO (ORPO's lambda)")
    p.add_argument("--gamma", type=float, help="reward margin gamma of DimPO, SimPO and CPO")
    p.add_argument("--margin", type=float, help="triplet loss margin (default 1.0, Mongoose's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--query-block", type=int, default=1024, help="queries scored at once (memory ~ block x T)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="the model's dtype (q, k, v and projections are float32)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m neox_dar.dimpo", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    fit = sub.add_parser("fit", help="fit every method at every d' layer by layer and score them (Table 1)")
    _fit_arguments(fit)
    fit.add_argument("--pairs", default="top-bottom",
                     help="the keys the trained methods see: top-bottom (the paper's), all:K, distinct:K or distance:K "
                          "(Appendix C; docs/dimpo.md)")
    study = sub.add_parser("study", help="the key-pair study (Appendix C, Fig. 4): fits per selection, study.json, "
                                         "fig4.png")
    _fit_arguments(study)
    study.add_argument("--panels", default=",".join(PANELS),
                       help=f"comma-separated, from {','.join(PANELS)} (Fig. 4a-c; default: all three)")
    study.add_argument("--ks", type=_ints, help="the k of every chosen panel (default: the paper's per panel)")

    table = sub.add_parser("table", help="print Table 1 (a fit folder) or Tables 2-3 (a task grid folder)")
    table.add_argument("folders", nargs="+")
    table.add_argument("--layer", type=int, help="Table 1 of one layer instead of the average")
    table.add_argument("--per-task", action="store_true", help="also each task's table (Appendix D)")
    table.add_argument("--format", choices=("markdown", "latex", "both"), default="both")

    tasks = sub.add_parser("tasks", help="lay out (and --run) lm-eval for the last l layers projected (Tables 2-3)")
    tasks.add_argument("checkpoint")
    tasks.add_argument("--projections", nargs="+", required=True, help="projection files, one per d'")
    tasks.add_argument("--out", required=True)
    tasks.add_argument("--layers", type=_ints, help="numbers l of last layers to project (default: Table 2's)")
    tasks.add_argument("--tasks", default="paper", help="name:metric,... (default 'paper': arc_challenge:acc_norm,"
                       "hellaswag:acc_norm,truthfulqa_mc2:acc,mmlu:acc,winogrande:acc)")
    tasks.add_argument("--lm-eval-args", default="", help="more lm-eval options, one string "
                       "(e.g. '--batch_size 16 --device cuda:0')")
    tasks.add_argument("--run", action="store_true", help="run lm-eval for the cells without results")
    apply = sub.add_parser("apply", help="write a checkpoint whose last l layers attend with a projection file")
    apply.add_argument("checkpoint")
    apply.add_argument("--projections", required=True, help="a projection file (fit's projections/<method>-d<d'>)")
    apply.add_argument("--layers", type=int, required=True, help="the number l of last layers to project")
    apply.add_argument("--out", required=True, help="the new checkpoint folder")
    return parser


def cmd_apply(args) -> int:
    from pathlib import Path

    from .apply import apply_checkpoint

    if Path(args.out).exists() and any(Path(args.out).iterdir()):
        raise DimPOError(f"{args.out} exists and is not empty: choose a new --out")
    if args.layers < 1:  # 0 wrote a copy of the checkpoint with nothing projected
        raise DimPOError(f"--layers must be >= 1, got {args.layers}")
    info = apply_checkpoint(args.checkpoint, args.projections, args.layers, args.out)
    fitted = info["fitted_on"]
    if fitted and Path(fitted).resolve() != Path(info["checkpoint"]).resolve():
        print(f"warning: {args.projections} was fitted on {fitted}, not on {info['checkpoint']} (another checkpoint, "
              "a run trained further, or the same one moved): its projections may not fit these weights",
              file=sys.stderr)
    print(f"wrote {args.out}: {info['method']} d'={info['d_proj']} on layers {info['layers']} "
          f"(KV-cache saving {100 * info['kv_cache_saving']:.2f}%, the paper's accounting)")
    return 0


def read_config(path: str):
    """The model config of a checkpoint or a Hugging Face folder, without loading its weights."""
    import json
    from pathlib import Path

    from ..saved_model import read_model_config
    from ..hf import config_from_hf
    from ..rundir import is_hf_folder
    from ..rundir import resolve_checkpoint

    if not Path(path).exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if is_hf_folder(path):
        return config_from_hf(json.loads((Path(path) / "config.json").read_text()))
    return read_model_config(resolve_checkpoint(path, checksums=False))


def fit_hyper(args) -> dict:
    """Table 6's hyperparameters of the chosen trained methods with the command line's overrides."""
    if args.lr is not None and args.lr_scale != 1.0:
        raise DimPOError("give --lr or --lr-scale, not both")
    for name, value, least, strict in (("lr", args.lr, 0, True), ("lr-scale", args.lr_scale, 0, True),
                                       ("beta", args.beta, 0, True), ("gamma", args.gamma, 0, False),
                                       ("margin", args.margin, 0, False)):
        if value is not None and not (math.isfinite(value) and (value > least if strict else value >= least)):
            raise DimPOError(f"--{name} must be a finite number {'>' if strict else '>='} {least}, got {value}")
    overrides = {"lr": args.lr, "batch_size": args.batch_size, "beta": args.beta, "gamma": args.gamma,
                 "margin": args.margin}
    hyper = {m: PAPER[m].with_overrides(**overrides) for m in args.methods if m in PAPER}
    for key in ("beta", "gamma", "margin"):
        if overrides[key] is not None and not any(key in h.loss for h in hyper.values()):
            raise DimPOError(f"--{key} applies to none of the chosen methods ({', '.join(args.methods)})")
    return {m: dataclasses.replace(h, lr=h.lr * args.lr_scale) for m, h in hyper.items()}


def prepare_fit(args) -> tuple:
    """Check the options, the model's config and the documents first; then load the model. Returns (the loaded
    model, the ``d'`` values, the documents, the trained methods' hyperparameters)."""
    import torch

    from ..evaluation.loading import load_for_eval
    from .fit import default_dims
    from .instances import check_layers_vanilla, select_documents

    for name in ("seq_len", "epochs", "query_block", "max_steps", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise DimPOError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    hyper = fit_hyper(args)
    cfg = read_config(args.checkpoint)
    dims = args.dims or default_dims(cfg.head_dim)
    bad = [d for d in dims if not 1 <= d <= cfg.head_dim]
    if bad or not dims:
        raise DimPOError(f"d' must be in 1..{cfg.head_dim} (the head dim), got {', '.join(map(str, bad)) or 'none'}")
    if args.seq_len > cfg.max_position_embeddings:
        raise DimPOError(f"--seq-len {args.seq_len} exceeds the model's max_position_embeddings "
                         f"{cfg.max_position_embeddings}")
    sources = {"train": args.train, "valid": args.valid or args.train}
    sources["test"] = args.test or sources["valid"]
    docs = select_documents(sources, {s: getattr(args, f"{s}_docs") for s in SPLITS}, args.seq_len,
                            cfg.padded_vocab_size)
    try:
        check_device(args.device)
    except ValueError as e:
        raise DimPOError(str(e)) from None
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    loaded = load_for_eval(args.checkpoint, device, args.dtype)
    try:  # the token ids mean other words to the model (train.py and data.check say the same)
        model_tokenizer = tokenizer_file(cfg, model_dir=loaded.model_dir)
    except TokenizerError:
        model_tokenizer = None
    for prefix in dict.fromkeys(sources.values()) if model_tokenizer else ():
        if warning := tokenized_with_other(prefix, model_tokenizer, "the model's tokenizer"):
            print(f"warning: {warning}: the fit scores the model on text it does not read", file=sys.stderr)
    check_layers_vanilla(loaded.model)
    return loaded, dims, docs, hyper


def cmd_fit(args) -> int:
    from .fit import fit_settings, run_fit
    from .tables import table1

    pairs = PairSelection.parse(args.pairs)
    loaded, dims, docs, hyper = prepare_fit(args)
    settings = fit_settings(loaded.info, loaded.cfg, docs, args.methods, dims, hyper, args.epochs, args.max_steps,
                            args.seed, pairs)
    run_fit(loaded.model, settings, docs, hyper, args.out, args.query_block)
    print(to_markdown(table1(args.out)))
    return 0


def cmd_study(args) -> int:
    from pathlib import Path

    from .fit import fit_settings, run_fit
    from .study import collect, draw, fit_dir, tables

    panels = [p.strip() for p in args.panels.split(",") if p.strip()]
    unknown = [p for p in panels if p not in PANELS]
    if unknown or not panels:
        raise DimPOError(f"--panels takes {', '.join(PANELS)}, got '{args.panels}'")
    plan = {p: [m for m in PANELS[p][2] if m in args.methods] for p in panels}
    if not any(plan.values()):
        raise DimPOError(f"none of --methods ({', '.join(args.methods)}) is studied (the pairwise methods and dimpo)")
    ks = {p: list(args.ks or PANELS[p][1]) for p in panels if plan[p]}
    for p, values in ks.items():
        PairSelection.parse(f"{p}:{min(values)}")
    loaded, dims, docs, hyper = prepare_fit(args)
    for p, values in ks.items():
        for k in values:
            print(f"study: {p}:{k} ({', '.join(plan[p])})", file=sys.stderr)
            settings = fit_settings(loaded.info, loaded.cfg, docs, plan[p], dims, hyper, args.epochs,
                                    args.max_steps, args.seed, PairSelection(p, k))
            run_fit(loaded.model, settings, docs, hyper, fit_dir(args.out, p, k), args.query_block)
    study = collect(args.out, ks)
    path = draw(study, Path(args.out) / "fig4.png", loaded.info["checkpoint"])
    for t in tables(study):
        print(to_markdown(t))
    print(f"wrote {Path(args.out) / 'study.json'} and {path}")
    return 0


def cmd_table(args) -> int:
    from pathlib import Path

    from .fit import RESULTS
    from .tables import table1, table2, task_tables
    from .tasks import GRID

    for folder in args.folders:
        if (Path(folder) / RESULTS).exists():
            tables = [table1(folder, args.layer)]
        elif (Path(folder) / GRID).exists():
            tables = [table2(folder)] + (task_tables(folder) if args.per_task else [])
        else:
            raise DimPOError(f"{folder} holds neither {RESULTS} (written by fit) nor {GRID} (written by tasks)")
        for t in tables:
            if args.format in ("markdown", "both"):
                print(to_markdown(t))
            if args.format in ("latex", "both"):
                print(to_latex(t))
    return 0


def cmd_tasks(args) -> int:
    from .apply import projected_config
    from .projections import check_projections, load_projections, projected_layers
    from .tasks import default_layers, parse_tasks, plan_grid, run_grid

    tasks = parse_tasks(args.tasks)
    cfg = read_config(args.checkpoint)
    counts = args.layers if args.layers is not None else default_layers(cfg.num_layers)
    if not counts:
        raise DimPOError("--layers names no layer count")
    projections = []
    for path in args.projections:
        proj = load_projections(path)
        check_projections(proj, cfg, max(counts), path)
        projections.append((path, proj))
    # the layers the grid projects are vanilla ones (a DAR run's grid was laid out, and apply refused each cell)
    projected_config(cfg, projected_layers(cfg.num_layers, max(counts)), projections[0][1].d_proj)
    methods = {p.method for _, p in projections}
    if len(methods) > 1:
        raise DimPOError(f"the projection files come from several methods ({', '.join(sorted(methods))}); "
                         "a grid compares d' and l of one method")
    grid = plan_grid(args.checkpoint, projections, counts, tasks, args.out, shlex.split(args.lm_eval_args))
    if args.run:
        run_grid(grid)
    else:
        for cell in grid["cells"]:
            print(f"l={cell['layers']} d'={cell['d_proj']} saving {100 * cell['kv_cache_saving']:.2f}%: "
                  f"{shlex.join(cell['command'])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    one_line_notices()  # this package's warnings as `warning: ...`, one line
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "out", None) is not None:  # a file or an unwritable place: a traceback after the fit before
            check_writable(args.out, "--out", folder=True)
        commands = {"fit": cmd_fit, "study": cmd_study, "table": cmd_table, "tasks": cmd_tasks, "apply": cmd_apply}
        return commands[args.command](args)
    except (DimPOError, FileNotFoundError, CheckpointError, IndexedDatasetError, ConfigError, TokenizerError,
            RunFileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
