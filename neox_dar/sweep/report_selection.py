"""The sweep file's ``report:`` settings: their keys and checks, and the selection of runs they describe (the
baseline of each group). The sweep checks them when it is read and planned (a baseline that matches no run fails
before any training); :mod:`neox_dar.report` builds its tables and figures with the same selection.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ..config import Config
from ..evaluation.tables import METRICS
from .errors import SweepError

REPORT_KEYS = {
    "title": "the table's title",
    "baseline": "selector of the baseline run per group: {run: NAME} or config keys / axis labels",
    "group_by": "axes (or config keys) whose runs share one baseline, e.g. [scale]",
    "rows": "run names in the order the table lists them",
    "metric": f"one of {', '.join(METRICS)}",
    "cost": "true: a Cost column (attention FLOPs per token relative to vanilla)",
    "average_over": "grid axes to average over, e.g. [seed]: a second table with mean and spread",
    "relative_over": "corpora Rel. (%) averages over (default: the papers' three), e.g. [wikitext103, wikipedia]",
    "repeats": "selector of runs that repeat the baseline with another seed, e.g. {variant: vanilla}: their Rel. "
               "(%) is the noise floor, printed beside every run's",
    "compare": "more reference runs, a column 'Rel. vs LABEL (%)' each, the reference of the same group (group_by): "
               "{LABEL: selector}, e.g. {swa: {variant: swa, seed: seed1}}",
}


@dataclass
class SweepRun:
    """A run as the report's selectors see it: its name, the label of each grid axis and its config (a planned
    run; :class:`neox_dar.report.collect.RunRecord` adds what training and evaluation wrote)."""

    name: str
    cfg: Config
    axes: dict[str, str]

    def has_key(self, key: str) -> bool:
        """Whether ``key`` is a config key (flat, or a dotted path)."""
        try:
            self.cfg.get(key)
        except (KeyError, TypeError):
            return False
        return True

    def matches(self, selector: dict) -> bool:
        """True when every ``key: value`` of ``selector`` holds for the run's config values or axis labels."""
        for key, want in selector.items():
            if key == "run":
                if self.name != str(want):
                    return False
            elif key in self.axes:
                if self.axes[key] != str(want):
                    return False
            elif self.config_value(key) != want:
                return False
        return True

    def config_value(self, key: str) -> object:
        """The run's value of a flat config key (a sentinel that equals nothing when there is no such key)."""
        try:
            return self.cfg.get(key)
        except KeyError:
            return object()


def check_report(report: dict) -> None:
    """SweepError (one line) for a ``report:`` mapping with an unknown key or a value of the wrong kind."""
    if not isinstance(report, dict):
        raise SweepError(f"'report' must be a mapping of {', '.join(REPORT_KEYS)}, got {report!r}")
    for key in report:
        if key not in REPORT_KEYS:
            close = difflib.get_close_matches(key, list(REPORT_KEYS), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f" (allowed: {', '.join(REPORT_KEYS)})"
            raise SweepError(f"unknown report setting '{key}'{hint}")
    if report.get("baseline") is not None and not isinstance(report["baseline"], dict):
        raise SweepError(f"report baseline must be a mapping such as {{run: vanilla}} or {{attention_type: vanilla}}, "
                         f"got {report['baseline']!r}")
    if report.get("metric") is not None and report["metric"] not in METRICS:
        raise SweepError(f"report metric must be one of {', '.join(METRICS)}, got {report['metric']!r}")
    compare = report.get("compare")
    if compare is not None and not (isinstance(compare, dict) and all(
            isinstance(label, str) and isinstance(sel, dict) and sel for label, sel in compare.items())):
        raise SweepError(f"report compare must map labels to selectors, such as {{swa: {{variant: swa}}}}, "
                         f"got {compare!r}")
    if report.get("repeats") is not None and not isinstance(report["repeats"], dict):
        raise SweepError(f"report repeats must be a mapping such as {{variant: vanilla}}, got {report['repeats']!r}")
    for key in ("group_by", "rows", "average_over", "relative_over"):
        value = report.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise SweepError(f"report {key} must be a list of names, got {value!r}")
    if report.get("cost") is not None and not isinstance(report["cost"], bool):
        raise SweepError(f"report cost must be true or false, got {report['cost']!r}")


def group_key(run: SweepRun, names: list[str]) -> tuple:
    return tuple(run.axes[g] if g in run.axes else str(run.config_value(g)) for g in names)


def check_names(runs: list[SweepRun], names: list[str], what: str) -> None:
    """SweepError when a name of a ``report:`` setting is neither an axis of the runs nor a config key."""
    for name in names:
        if name != "run" and not any(name in r.axes for r in runs) and not runs[0].has_key(name):
            raise SweepError(f"report {what} names '{name}', which is neither an axis of the runs nor a config key")


def check_axes(runs: list[SweepRun], names: list[str], what: str) -> None:
    """SweepError when a name of a ``report:`` setting is not a grid axis of the runs (``average_over`` merges the
    runs whose other axes agree: a config key alone says nothing about which runs are repeats of one another)."""
    for name in names:
        if not any(name in r.axes for r in runs):
            axes = sorted({a for r in runs for a in r.axes})
            raise SweepError(f"report {what} names '{name}', which is not a grid axis of the runs "
                             f"(axes: {', '.join(axes) if axes else 'none'})")


def baselines(runs: list[SweepRun], selector: dict | None, group_by: list[str]) -> dict[tuple, SweepRun]:
    """The baseline run of each group (runs matching ``selector``). A selector that matches no run, names a key that
    is neither an axis nor a config key, or matches two runs of one group is an error."""
    out: dict[tuple, SweepRun] = {}
    if not selector or not runs:
        return out
    check_names(runs, list(selector), "baseline")
    check_names(runs, group_by, "group_by")
    for r in runs:
        if r.matches(selector):
            key = group_key(r, group_by)
            if key in out:
                raise SweepError(f"two baseline runs in group {key or '(all)'}: {out[key].name} and {r.name}; "
                                 "set report.group_by or a narrower report.baseline")
            out[key] = r
    if not out:
        raise SweepError(f"the baseline {selector} matches no run (runs: {', '.join(r.name for r in runs)})")
    return out


def check_report_runs(report: dict, runs: list[SweepRun]) -> None:
    """The ``report:`` settings against the sweep's runs: the baseline and each ``compare`` reference match a run
    (one per group), ``rows`` and ``average_over`` name runs and axes that exist. SweepError otherwise (at plan time,
    before any training)."""
    baselines(runs, report.get("baseline"), list(report.get("group_by") or []))
    for selector in (report.get("compare") or {}).values():
        baselines(runs, selector, list(report.get("group_by") or []))
    unknown = [n for n in report.get("rows") or [] if n not in {r.name for r in runs}]
    if unknown:
        raise SweepError(f"report rows name unknown run(s) {', '.join(unknown)} (runs: "
                         f"{', '.join(r.name for r in runs)})")
    check_axes(runs, list(report.get("average_over") or []), "average_over")
    if report.get("repeats"):
        check_names(runs, list(report["repeats"]), "repeats")
