"""A sweep's plan: every run's resolved config and directory, the checks before anything is queued, and the
plan written to the output directory (``sweep.yml``, each run's ``config.yml`` and ``run.json``).

Every run gets a resolved config with ``save`` = its run directory, ``wandb_group`` = the sweep name,
``wandb_run_name`` = the run name and, when a ``tensorboard_dir`` is set, ``tensorboard_dir`` = that directory / the
run name (one TensorBoard run per sweep run).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..config import Config, ConfigError, load_config
from ..rundir import CONFIG, RUN_META, RunFileError, check_writable, write_text_atomic
from ..training.checks import check_what_trains
from ..variants import variant
from .errors import SweepError
from .report_selection import SweepRun, check_report_runs
from .spec import SWEEP_COPY, RunSpec, Sweep


def resolve_run(sweep: Sweep, run: RunSpec, run_dir: Path) -> tuple[Config, list[str]]:
    """The run's validated config (save = run_dir, W&B group/name set) and the config warnings it raised."""
    own = run.override_args()  # the sweep file's set and grid for this run
    overrides = own + list(sweep.overrides) + [
        f"save={json.dumps(str(run_dir))}", f"wandb_group={json.dumps(sweep.name)}",
        f"wandb_run_name={json.dumps(run.name)}"]
    sources = [f"{sweep.path or 'the sweep'} (set/grid)"] * len(own)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cfg = load_config(*run.configs, overrides=overrides, sources=sources)
            check_what_trains(cfg)
            if cfg.run.tensorboard_dir:  # one TensorBoard run per sweep run (a shared one purges the others' steps)
                cfg = cfg.replace(tensorboard_dir=str(Path(cfg.run.tensorboard_dir) / run.name))
        except ConfigError as e:
            raise SweepError(f"run '{run.name}': {e}") from None
    return cfg, list(dict.fromkeys(str(w.message) for w in caught))


@dataclass
class PlannedRun:
    """A run with its resolved config and directory."""

    spec: RunSpec
    cfg: Config
    run_dir: Path
    warnings: list[str]


def plan(sweep: Sweep, out: str | Path | None = None) -> list[PlannedRun]:
    """Resolve every run's config (nothing written)."""
    root = Path(out) if out is not None else sweep.default_out()
    root = root.resolve()
    planned, seen = [], {}
    for run in sweep.runs:
        cfg, warns = resolve_run(sweep, run, root / run.name)
        same = seen.setdefault(cfg.replace(save="", wandb_run_name=None, tensorboard_dir=None).to_yaml(), run.name)
        if same != run.name:  # e.g. an option's set replacing an earlier axis's key: names that say otherwise
            raise SweepError(f"{sweep.path or 'the sweep'}: runs '{same}' and '{run.name}' have the same config, so "
                             "the same model would train twice (a later axis's option or 'set' replaces the key an "
                             "earlier axis varies?)")
        planned.append(PlannedRun(run, cfg, root / run.name, warns))
    return planned


def sweep_in(root: Path) -> str | None:
    """The name of the sweep whose copy ``root`` holds, or None when it holds none."""
    copy = Path(root) / SWEEP_COPY
    if not copy.is_file():
        return None
    try:
        data = yaml.safe_load(copy.read_text())
    except yaml.YAMLError:
        return None
    return str(data.get("name")) if isinstance(data, dict) and data.get("name") else None


def check_owner(sweep: Sweep, root: Path) -> None:
    """SweepError when ``root`` belongs to another sweep: its runs would vanish from `status` and the report, and
    runs of the same name would mix two experiments in one directory."""
    other = sweep_in(root)
    if other is not None and other != sweep.name:
        raise SweepError(f"{root} holds the sweep '{other}', not '{sweep.name}': give this sweep its own directory "
                         f"(--out), or pass --force to `plan` to replace '{other}' there")


def check_runs(planned: list[PlannedRun], world_size: int, here: bool = False) -> None:
    """Every run as it will train on ``world_size`` data-parallel ranks, before anything is queued: the global batch
    divides, the data files exist and hold valid token ids, and the rest of ``train.py``'s start-up checks
    (:func:`neox_dar.training.checks.check_training_config`; those of the device too when the runs train ``here``,
    `run --local`, not on the nodes `submit` queues them for). SweepError naming the run."""
    from ..config import ConfigError
    from ..training.checks import check_training_config

    for p in planned:
        try:
            check_training_config(p.cfg, world_size, here)
        except ConfigError as e:
            raise SweepError(f"run '{p.spec.name}' on {world_size} rank(s): {e}") from None


def check_report_settings(sweep: Sweep, planned: list[PlannedRun]) -> None:
    """The ``report:`` mapping against the planned runs (a baseline that matches no run is an error now, not after
    training)."""
    check_report_runs(sweep.report, [SweepRun(p.spec.name, p.cfg, p.spec.axes) for p in planned])


def write_plan(sweep: Sweep, planned: list[PlannedRun], force: bool = False) -> Path:
    """Write ``<out>/sweep.yml`` and ``<out>/<run>/{config.yml,run.json}``; returns the output directory.

    A run directory whose existing config differs from the new one and that already holds checkpoints
    is an error unless ``force`` (editing a sweep under a started run would mix two experiments), and so is an
    output directory that holds another sweep.
    """
    if not planned:
        raise SweepError("nothing to write")
    root = planned[0].run_dir.parent
    try:  # a file or an unwritable place was a traceback here
        check_writable(root, "the sweep's output directory", folder=True)
    except RunFileError as e:
        raise SweepError(str(e)) from None
    if (root / CONFIG).is_file() and not (root / SWEEP_COPY).is_file():
        raise SweepError(f"{root} is a run directory (it holds {CONFIG}), not a sweep's: give the sweep its own "
                         "directory (--out)")
    if not force:
        check_owner(sweep, root)
    for p in planned:
        cfg_path = p.run_dir / CONFIG
        if cfg_path.is_file() and not force and (p.run_dir / "checkpoints").is_dir():
            old, new = _resolved(cfg_path), p.cfg.flat()
            if old != new:
                changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                raise SweepError(f"run '{p.spec.name}' already has checkpoints and its config changed "
                                 f"({', '.join(changed)}); use a new output directory, or --force (e.g. to extend "
                                 "finished runs with a larger train_iters)")
    root.mkdir(parents=True, exist_ok=True)
    raw = dict(sweep.raw, name=sweep.name)
    header = f"# copied from {sweep.path} by `python -m neox_dar.sweep` (plan, run or submit)\n"
    write_text_atomic(root / SWEEP_COPY, header + yaml.safe_dump(raw, sort_keys=False))
    for p in planned:
        p.run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(p.run_dir / CONFIG, p.cfg.to_yaml())
        meta = {"sweep": sweep.name, "run": p.spec.name, "axes": p.spec.axes, "configs": p.spec.configs,
                "overrides": p.spec.overrides}
        write_text_atomic(p.run_dir / RUN_META, json.dumps(meta, indent=1) + "\n")
    return root


def _resolved(config_file: Path) -> dict[str, Any]:
    """A run's saved config, resolved (so a file written before values were resolved compares equal)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return load_config(config_file).flat()
        except ConfigError:
            return yaml.safe_load(config_file.read_text()) or {}


def plan_row(p: PlannedRun, world_size: int = 1) -> dict[str, Any]:
    """One row of the plan listing: what a reader checks against the paper (global batch x sequence length), the
    tokens and how the batch runs on ``world_size`` ranks (micro-batch x gradient accumulation x ranks), and the epochs
    of the training data the run reads (data files checked by :func:`check_runs`)."""
    from ..training.checks import data_epochs

    m, t = p.cfg.model, p.cfg.training
    tokens, epochs = data_epochs(p.cfg, world_size)
    return {"run": p.spec.name, "model": f"L{m.num_layers} d{m.hidden_size} H{m.num_attention_heads}",
            "attention": variant(m.attention.attention_type).summary(m), "steps": t.train_iters,
            "batch": f"{t.global_batch_for(world_size)} x {m.seq_length}", "tokens": _tokens(tokens),
            "micro x accum x ranks": f"{t.train_micro_batch_size_per_gpu} x {t.gradient_accumulation_for(world_size)} "
                                     f"x {world_size}",
            "epochs": f"{epochs:.3g}"}


def _tokens(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"
