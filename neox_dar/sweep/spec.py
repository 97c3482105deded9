"""Sweep files: a named grid of runs over base config files, expanded into resolved run configs.

A sweep file (YAML)::

    name: dar-table1                       # W&B group; default output directory runs/<name>
    configs: [configs/pythia-70m.yml]      # base config files, layered in order (paths from the repo root)
    set: {window_size: 128}                # key: value overrides for every run (dotted keys allowed)
    grid:                                  # Cartesian product, axes in this order
      attention_type: [dar, uniform]       # an axis over one config key ...
      dar_d_down: [256, 128, 64]
      scale:                               # ... or an axis of named options, each adding configs and/or keys
        70m: {configs: [configs/pythia-70m.yml]}
        160m: {configs: [configs/pythia-160m.yml], set: {train_iters: 5450}}
    exclude: [{attention_type: uniform, dar_d_down: 64}]   # drop grid points matching all these labels
    # or a list of sub-grids, each a product of its own axes, the runs one after another and named by the axes
    # of their sub-grid (a key that matters to one variant only is an axis of that variant's sub-grid):
    # grid: [{attention_type: [vanilla]}, {attention_type: [dar], dar_d_down: [384, 192]},
    #        {attention_type: [mswa], window_size: [128, 256]}]      -> vanilla, dar-d384, dar-d192, mswa-w128, ...
    runs:                                  # explicit runs besides the grid (baselines)
      - {name: vanilla, set: {attention_type: vanilla}}
    name_template: "{attention_type}-d{dar_d_down}"         # optional; default joins the axis labels
    overrides: ["data_path=/data/pile"]    # key=value for every run, after everything else (the command line's
                                           # key=value words are recorded here in the output directory's copy)
    eval: {corpora: [fineweb_edu, c4, wikitext103], max_docs: null}   # or `eval: false`
    slurm: {nodes: 1, gpus_per_node: 8, time: "24:00:00"}  # defaults for `submit` (see slurm.py)
    report: {baseline: {attention_type: vanilla}, group_by: [], metric: token_perplexity}
    max_epochs: 1                          # `plan` warns when a run reads its training data more often (default 1)

Every run gets a deterministic, readable name (:class:`RunSpec`); :mod:`.planning` resolves each run's config and
writes the plan.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ConfigError, key_field
from ..config.files import load_yaml, normalize_keys
from .errors import SweepError
from .report_selection import check_report
from .slurm import SlurmSettings, eval_args

SWEEP_COPY = "sweep.yml"

_TOP_KEYS = {"name", "description", "configs", "set", "grid", "exclude", "runs", "name_template", "eval", "slurm",
             "report", "out", "overrides", "max_epochs"}
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
NAME_MAX = 100  # characters of a run name: a directory name, with room for the temporary names made beside it
# what a sweep writes beside its runs' directories: the sweep's copy, its SLURM scripts and logs, the report, the
# evaluation manifest (neox_dar.evaluation.perplexity.SWEEP_MANIFEST)
RESERVED_NAMES = (SWEEP_COPY, "slurm", "report", "eval_manifest.json")


@dataclass
class RunSpec:
    """One run of a sweep: its name, the label of each grid axis, config files and key overrides."""

    name: str
    axes: dict[str, str]
    configs: list[str]
    overrides: dict[str, Any]

    def override_args(self) -> list[str]:
        """``key=value`` strings for :func:`neox_dar.config.load_config` (values as JSON, which YAML reads back exactly)."""
        return [f"{k}={json.dumps(v)}" for k, v in self.overrides.items()]


@dataclass
class Sweep:
    """A parsed sweep file."""

    name: str
    path: Path | None
    raw: dict
    configs: list[str]
    runs: list[RunSpec]
    eval: dict | None
    slurm: dict = field(default_factory=dict)
    report: dict = field(default_factory=dict)
    description: str = ""
    overrides: list[str] = field(default_factory=list)
    max_epochs: float = 1.0

    def default_out(self) -> Path:
        return Path(self.raw.get("out") or Path("runs") / self.name)


def _label(key: str, value: Any) -> str:
    """An axis value as it reads in a run name: the key's sweep label before it (``dar_d_down: 128`` -> ``d128``,
    from the key's definition), the bare value for strings, ``key-value`` for keys without a label."""
    if isinstance(value, float):
        text = f"{value:g}"
    elif value is None:
        text = "none"
    else:
        text = str(value)
    f = key_field(key)
    prefix = f.metadata.get("label") if f is not None else None
    if prefix is not None:
        return prefix + text
    return text if isinstance(value, str) else f"{key}-{text}"


def override_key(item: str) -> str:
    """The flat key of a ``key=value`` override (SweepError when it is not one)."""
    key, sep, _ = str(item).partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise SweepError(f"override {item!r} must look like key=value (e.g. data_path=/data/pile)")
    return key


def merge_overrides(*lists: list[str]) -> list[str]:
    """``key=value`` lists in order, a later value of a key replacing an earlier one (in the earlier's place)."""
    merged: dict[str, str] = {}
    for items in lists:
        for item in items:
            merged[override_key(item)] = str(item)
    return list(merged.values())


def _as_list(value: Any, what: str) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise SweepError(f"'{what}' must be a list, got {value!r}")
    return value


def _option(axis: str, label: str, value: Any) -> tuple[list[str], dict]:
    """A named option of an axis: ``{configs: [...], set: {...}}`` or a plain mapping of config keys."""
    if not isinstance(value, dict):
        raise SweepError(f"grid axis '{axis}' option '{label}' must be a mapping, got {value!r}")
    if set(value) <= {"configs", "set"}:
        sets = value.get("set") or {}
        if not isinstance(sets, dict):
            raise SweepError(f"grid axis '{axis}' option '{label}': 'set' must be a mapping")
        return ([str(p) for p in _as_list(value.get("configs"), f"grid.{axis}.{label}.configs")],
                _config_keys(sets, f"grid axis '{axis}' option '{label}'"))
    return [], _config_keys(value, f"grid axis '{axis}' option '{label}'")


def _config_keys(sets: dict, where: str) -> dict:
    """A mapping of config keys with hyphens read as underscores, as a config file's; two spellings of one key
    (``train-iters`` and ``train_iters``) are a SweepError naming ``where`` (the last one won silently)."""
    if not isinstance(sets, dict):
        raise SweepError(f"{where} must be a mapping of config keys to values, got {sets!r}")
    try:
        return normalize_keys(sets, where)
    except ConfigError as e:
        raise SweepError(str(e)) from None


def _axis_points(axis: str, values: Any) -> list[tuple[str, Any, list[str], dict]]:
    """(label, raw value, configs, overrides) for every point of one grid axis."""
    if isinstance(values, dict):
        if not values:
            raise SweepError(f"grid axis '{axis}' has no options")
        return [(str(lbl), str(lbl), *_option(axis, str(lbl), v)) for lbl, v in values.items()]
    if not isinstance(values, list) or not values:
        raise SweepError(f"grid axis '{axis}' must be a non-empty list of values or a mapping of named options")
    return [(_label(axis, v), v, [], {axis: v}) for v in values]


def _matches(axes: dict[str, str], raw: dict[str, Any], pattern: dict) -> bool:
    """True when every ``key: value`` of an exclude pattern is an axis of the point with that value or label."""
    return all(k in axes and (raw[k] == v or axes[k] == str(v)) for k, v in pattern.items())


def _grid_runs(grid: dict, base: list[str], common: dict, template: Any, excludes: list, where: str,
               excluded: set[int]) -> list[RunSpec]:
    """The runs of one grid: the Cartesian product of its axes, in axis order, less the excluded points (the indices
    of the exclude patterns that matched one are added to ``excluded``); each run named by its axis labels (or
    ``template``, whose fields may name dotted axes: ``{optimizer.params.lr}``)."""
    runs = []
    for combo in itertools.product(*(_axis_points(a, v) for a, v in grid.items())):
        axes = {a: p[0] for a, p in zip(grid, combo)}
        raw = {a: p[1] for a, p in zip(grid, combo)}
        hits = [i for i, pat in enumerate(excludes) if _matches(axes, raw, pat)]
        if hits:
            excluded.update(hits)
            continue
        configs, overrides = list(base), dict(common)
        for _, _, cfgs, sets in combo:
            configs += cfgs
            overrides.update(sets)
        if template:
            fields = str(template)
            for axis in (a for a in raw if "." in a):  # str.format reads "a.b" as attribute b of field a
                fields = fields.replace("{" + axis, "{" + axis.replace(".", "__"))
            try:
                run_name = fields.format(**{a.replace(".", "__"): v for a, v in raw.items()})
            except (KeyError, AttributeError) as e:
                raise SweepError(f"{where}: name_template names {e}, which is not a grid axis") from None
        else:
            run_name = "-".join(axes.values())
        runs.append(RunSpec(run_name, axes, configs, overrides))
    return runs


def parse_sweep(data: dict, path: Path | None = None) -> Sweep:
    """Expand a sweep mapping into its runs (grid points in axis order, then explicit runs)."""
    where = str(path) if path else "<sweep>"
    if not isinstance(data, dict):
        raise SweepError(f"{where} must hold a mapping")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise SweepError(f"unknown key(s) in {where}: {', '.join(sorted(unknown))} "
                         f"(allowed: {', '.join(sorted(_TOP_KEYS))})")
    name = data.get("name") or (path.stem if path else None)
    if not name or not _NAME_OK.match(str(name)):
        raise SweepError(f"{where}: 'name' must be a word of letters, digits, '.', '_', '+', '-', got {name!r}")
    base = [str(p) for p in _as_list(data.get("configs"), "configs")]
    common = data.get("set") or {}
    if not isinstance(common, dict):
        raise SweepError(f"{where}: 'set' must be a mapping of config keys to values")
    common = _config_keys(common, f"{where} (set)")
    grid = data.get("grid") or {}
    grids = grid if isinstance(grid, list) else [grid]
    if not all(isinstance(g, dict) and (g or len(grids) == 1) for g in grids):
        raise SweepError(f"{where}: 'grid' must be a mapping of axes, or a list of such mappings (sub-grids)")
    template = data.get("name_template")
    excludes = _as_list(data.get("exclude"), "exclude")
    for pattern in excludes:
        unknown = [k for k in pattern if not any(k in g for g in grids)] if isinstance(pattern, dict) else [pattern]
        if unknown:
            raise SweepError(f"{where}: exclude names {unknown[0]!r}, which is not a grid axis")

    runs: list[RunSpec] = []
    excluded: set[int] = set()
    for sub in grids:
        if sub:
            try:
                runs += _grid_runs(sub, base, common, template, excludes, where, excluded)
            except SweepError as e:  # an axis's own mistake: name the file
                raise SweepError(str(e) if str(e).startswith(where) else f"{where}: {e}") from None
    for i, pattern in enumerate(excludes):
        if i not in excluded:
            raise SweepError(f"{where}: exclude {pattern} matches no grid point (a value the axes do not hold?)")
    for i, extra in enumerate(_as_list(data.get("runs"), "runs")):
        if not isinstance(extra, dict) or set(extra) - {"name", "configs", "set", "axes"}:
            raise SweepError(f"{where}: runs[{i}] must be a mapping with name, configs, set (and optional axes)")
        sets = _config_keys(extra.get("set") or {}, f"{where} (runs[{i}].set)")
        cfgs = [str(p) for p in _as_list(extra.get("configs"), f"runs[{i}].configs")]
        run_name = extra.get("name") or "-".join(
            [_label(k, v) for k, v in sets.items()] + [Path(c).stem for c in cfgs]) or f"run{i}"
        axes = {k: str(v) for k, v in (extra.get("axes") or {}).items()}
        runs.append(RunSpec(str(run_name), axes, base + cfgs, {**common, **sets}))

    if not runs:
        raise SweepError(f"{where} defines no runs: add a 'grid' or 'runs'")
    seen: dict[str, int] = {}
    for r in runs:
        if not _NAME_OK.match(r.name):
            raise SweepError(f"{where}: run name {r.name!r} must be letters, digits, '.', '_', '+', '-'")
        if len(r.name) > NAME_MAX or r.name in RESERVED_NAMES:
            raise SweepError(f"{where}: run name {r.name[:40]!r}{'...' if len(r.name) > 40 else ''} "
                             + (f"has {len(r.name)} characters, more than {NAME_MAX}" if len(r.name) > NAME_MAX else
                                f"is what the sweep writes beside its runs ({', '.join(RESERVED_NAMES)})"))
        seen[r.name] = seen.get(r.name, 0) + 1
    dups = [n for n, c in seen.items() if c > 1]
    if dups:
        raise SweepError(f"{where}: duplicate run names {', '.join(dups)}; set name_template or explicit names")
    ev = data.get("eval", {"corpora": None, "max_docs": None})
    if ev is not False and ev is not None and not isinstance(ev, dict):
        raise SweepError(f"{where}: 'eval' must be a mapping (source, corpora, max_docs, args) or false")
    slurm, report = data.get("slurm") or {}, data.get("report") or {}
    try:  # a mistake in eval:, slurm: or report: fails here, at plan time, not in a queued job or after training
        eval_args(ev or None)
        if not isinstance(slurm, dict):
            raise SweepError(f"'slurm' must be a mapping of settings, got {slurm!r}")
        SlurmSettings.from_dict(slurm)
        check_report(report)
        overrides = merge_overrides(_as_list(data.get("overrides"), "overrides"))
    except SweepError as e:
        raise SweepError(f"{where}: {e}") from None
    max_epochs = data.get("max_epochs", 1.0)
    if isinstance(max_epochs, bool) or not isinstance(max_epochs, (int, float)) or not max_epochs > 0:
        raise SweepError(f"{where}: 'max_epochs' must be a number > 0 (the epochs of the training data a run may "
                         f"read without a warning), got {max_epochs!r}")
    return Sweep(name=str(name), path=path, raw=data, configs=base, runs=runs, eval=ev or None, slurm=dict(slurm),
                 report=dict(report), description=str(data.get("description") or ""), overrides=overrides,
                 max_epochs=float(max_epochs))


def with_overrides(sweep: Sweep, items: list[str]) -> Sweep:
    """The sweep with ``key=value`` overrides added after its own (a key given again replaces its value); they are
    part of the sweep from then on (the output directory's copy records them)."""
    if not items:
        return sweep
    merged = merge_overrides(sweep.overrides, items)
    return dataclasses.replace(sweep, overrides=merged, raw={**sweep.raw, "overrides": merged})


def load_sweep(path: str | Path) -> Sweep:
    """Read and expand a sweep file; a run directory's saved ``sweep.yml`` works too."""
    p = Path(path)
    if p.is_dir():
        p = p / SWEEP_COPY
    if not p.is_file():
        raise SweepError(f"sweep file not found: {p}")
    try:
        data = load_yaml(p)
    except ConfigError as e:  # not UTF-8, not YAML, a key given twice
        raise SweepError(str(e)) from None
    return parse_sweep(data, p)
