"""Committed results (results/*/, written by ``python -m neox_dar.report.publish``) are what the committed code
rebuilds from the committed run files, and the tables in the docs are those reports: no number is typed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neox_dar.report.__main__ import report_tables
from neox_dar.report.collect import collect
from neox_dar.report.publish import PROVENANCE, block
from neox_dar.report.tables import to_markdown

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted(p for p in (ROOT / "results").glob("*") if (p / PROVENANCE).is_file())
DOCS = {"replicate-cpu": ROOT / "docs" / "experiments.md"}  # results folder -> the document showing its table


@pytest.mark.parametrize("folder", RESULTS, ids=[p.name for p in RESULTS])
def test_committed_report_is_rebuilt_from_the_run_files_and_the_docs_show_it(folder):
    meta = json.loads((folder / PROVENANCE).read_text())
    assert meta["device"] and meta["training_command"] and meta["published"]["git_commit"]
    assert all(r["trained_with"] and r["trained_with"]["git_commit"] for r in meta["runs"].values())
    runs, sweep, _ = collect(folder / "runs")
    md = "\n".join(to_markdown(t) for t in report_tables(runs, sweep.report))
    assert md == (folder / "report" / "table.md").read_text()
    doc = DOCS.get(folder.name)
    if doc is not None:
        assert block(doc, folder.name) == md.rstrip(), (f"regenerate with: python -m neox_dar.report.publish ... "
                                                        f"{folder} --docs {doc.relative_to(ROOT)}")


def test_the_cpu_replication_is_committed():
    assert "replicate-cpu" in [p.name for p in RESULTS]


def test_the_orderings_docs_state_for_the_cpu_replication():
    """docs/experiments.md ("What was seen") states these orderings of the committed CPU replication."""
    runs, sweep, _ = collect(ROOT / "results" / "replicate-cpu" / "runs")
    table = report_tables(runs, sweep.report)[0]
    row = {r[0]: dict(zip(table.columns, r)) for r in table.rows}
    rel = {name: r["Rel. (%)"] for name, r in row.items()}
    floor = abs(rel["vanilla-seed2"] - 100)
    assert rel["dar"] < rel["uniform"] and rel["uniform"] > 100 + floor
    assert [n for n, v in rel.items() if isinstance(v, float) and v > 100 + floor] == ["uniform"]
    for name in ("dar", "swa", "mswa", "aha-w16", "aha-w64", "mswa-linear"):
        assert rel[name] < 100 - floor, name
    assert rel["mswa"] < rel["swa"] and row["mswa"]["Cost"] < row["swa"]["Cost"]
    assert (row["mswa"]["KV (B/token)"], row["swa"]["KV (B/token)"]) == (225.0, 256.0)
    assert row["aha-w64"]["mu_f (%)"] < row["aha-w16"]["mu_f (%)"] and rel["aha-w64"] > rel["aha-w16"]
    assert rel["mswa"] * 1.05 < rel["mswa-linear"] < 100 - floor
