"""Gathering a sweep's finished runs from their files: config, axes, metrics, evaluations.

Every number the report prints is recomputed here from the run directories (``metrics.jsonl``,
``eval/*.json``); nothing is cached between reports.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..config import Config, ConfigError, load_config
from ..rundir import CONFIG, FINAL_EVAL, RUN_META, RunFileError, read_evals, read_json, read_metrics
from ..sweep.errors import SweepError
from ..sweep.report_selection import SweepRun
from ..sweep.rundir import newest_checkpoint_step
from ..sweep.spec import SWEEP_COPY, Sweep, load_sweep
from ..variants import VariantSpec, variant


@dataclass
class RunRecord(SweepRun):
    """One run as the report sees it: the sweep's run (name, axes, config) and what training and evaluation wrote."""

    run_dir: Path
    metrics: list[dict]
    evals: list[dict]  # every eval/*.json by step; at one step the sweep's final evaluation comes last

    @property
    def eval(self) -> dict | None:
        """The evaluation at the highest step (the table's numbers; at equal steps the sweep's own evaluation,
        ``eval/perplexity.json``, over an in-training one), or None."""
        return self.evals[-1] if self.evals else None

    def trained_to(self) -> int | None:
        """Step of the run's newest complete checkpoint."""
        return newest_checkpoint_step(self.run_dir)

    def perplexity(self, corpus: str, metric: str) -> float | None:
        """``metric`` of ``corpus`` from the final evaluation; None when it was not evaluated."""
        if not self.eval:
            return None
        value = (self.eval.get("corpora") or {}).get(corpus, {}).get(metric)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    @property
    def variant(self) -> type[VariantSpec]:
        return variant(self.cfg.model.attention.attention_type)

    def train_rows(self) -> list[dict]:
        return [r for r in self.metrics if "loss" in r and "step" in r]

    def valid_rows(self) -> list[dict]:
        return [r for r in self.metrics if "valid_loss" in r and "step" in r]

    def stat_table(self, stat: str) -> list[list[float]] | None:
        """A per-head statistic of the run's attention variant (e.g. AHA's ``mu_f``) per layer and head (L x H)
        from the final evaluation: each corpus's ``attention_stats`` (``layer{l}/{stat}``, means over real tokens),
        averaged over the evaluated corpora with equal weight (the AHA paper's "Avg" over tasks). None when no
        corpus reports it; training values are never substituted (they come from one micro-batch)."""
        tables = []
        suffix = f"/{stat}"
        for result in ((self.eval or {}).get("corpora") or {}).values():
            stats = result.get("attention_stats") or {}
            layers = sorted((int(k[len("layer"):-len(suffix)]), v) for k, v in stats.items()
                            if k.startswith("layer") and k.endswith(suffix))
            if layers and stat in result:  # results without the overall value predate real-token counting
                tables.append([list(map(float, v)) for _, v in layers])
        if not tables:
            return None
        return [[sum(t[l][h] for t in tables) / len(tables) for h in range(len(tables[0][l]))]
                for l in range(len(tables[0]))]

    def stat_mean(self, stat: str) -> float | None:
        """The statistic over the whole model: the mean of :meth:`stat_table` over layers and heads (for AHA's
        ``mu_f``, the paper's Eq. 8)."""
        table = self.stat_table(stat)
        return None if table is None else sum(map(sum, table)) / sum(map(len, table))


def _load_cfg(run_dir: Path) -> Config:
    """The run's config.yml; RunFileError (one line) when this version cannot read it (a key it does not know, a
    file that is not YAML)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return load_config(run_dir / CONFIG)
        except ConfigError as e:
            raise RunFileError(f"run {run_dir.name}: its {CONFIG} cannot be read by this version ({e})") from None


def load_run(run_dir: Path) -> RunRecord:
    meta_path = run_dir / RUN_META
    meta = read_json(meta_path) if meta_path.is_file() else {}
    evals = sorted(read_evals(run_dir), key=lambda e: (e.get("step") is None, e.get("step") or 0,
                                                       Path(e["_path"]).name == FINAL_EVAL))
    return RunRecord(name=meta.get("run", run_dir.name), run_dir=run_dir, cfg=_load_cfg(run_dir),
                     axes={k: str(v) for k, v in (meta.get("axes") or {}).items()},
                     metrics=read_metrics(run_dir), evals=evals)


def collect(target: str | Path) -> tuple[list[RunRecord], Sweep | None, Path]:
    """Runs of a sweep file (its output directory), of a sweep output directory, or of any directory of runs.

    Returns ``(runs, sweep or None, root directory)``; runs are in the sweep's order when it is known.
    """
    target = Path(target)
    sweep = None
    if target.is_file():
        sweep = load_sweep(target)
        root = sweep.default_out()
    else:
        root = target
        if (root / SWEEP_COPY).is_file():
            sweep = load_sweep(root / SWEEP_COPY)
    if not root.is_dir():
        raise SweepError(f"no run directory at {root} (plan and train the sweep first)")
    if sweep is not None:
        absent = set(absent_runs(sweep, root))
        dirs = [root / r.name for r in sweep.runs if r.name not in absent]
    else:
        dirs = sorted(d for d in root.iterdir() if (d / CONFIG).is_file())
    if not dirs:
        raise SweepError(f"no runs under {root}: expected <run>/config.yml directories")
    return [load_run(d) for d in dirs], sweep, root


def absent_runs(sweep: Sweep | None, root: Path) -> list[str]:
    """The sweep's runs that have no ``<run>/config.yml`` under ``root`` (deleted after the plan, or added to the
    sweep file since): :func:`collect` leaves them out, and the report says so."""
    return [] if sweep is None else [r.name for r in sweep.runs if not (root / r.name / CONFIG).is_file()]


def relative_cost(run: RunRecord, cache: dict) -> float:
    """Attention FLOPs per token (``model.flops_per_token``) at ``seq_length``, as a fraction of vanilla's."""
    from ..model import build_meta_model, flops_per_token

    def attention_flops(cfg: Config) -> float:
        k = cfg.to_yaml()
        if k not in cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = build_meta_model(cfg.model)
            cache[k] = flops_per_token(model, cfg.model.seq_length)["attention"]
        return cache[k]

    return attention_flops(run.cfg) / attention_flops(run.cfg.with_attention_type("vanilla"))


def kv_bytes_per_token(run: RunRecord) -> float:
    """Inference KV-cache bytes per token in bf16 at a context of ``seq_length``, summed over the layers
    (:func:`neox_dar.describe.kv_cache_bytes_per_token`, what ``python -m neox_dar.describe`` prints)."""
    from ..describe import kv_cache_bytes_per_token

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sum(kv_cache_bytes_per_token(run.cfg, run.cfg.model.seq_length, "bf16"))
