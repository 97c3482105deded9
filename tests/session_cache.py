"""Fixture results built once per test session and shared by pytest-xdist's workers."""

from __future__ import annotations

import json
import os
import shutil

from filelock import FileLock


def built_once(tmp_path_factory, name: str, build):
    """``build(folder)``'s JSON-able result, with ``folder`` made by it once per test session and shared by
    pytest-xdist's workers (a module fixture is otherwise built again in each worker that runs one of its tests, and
    again in each module that imports it). The first worker to ask builds under a file lock while the others wait;
    a build that failed is started again. What a fixture built this way returns must be read, never changed, by its
    tests (as any module fixture's)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-N/, above each worker's popen-gwK/
    folder, done = base / f"built-{name}", base / f"built-{name}.json"
    with FileLock(f"{folder}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            done.write_text(json.dumps(build(folder)))
    return json.loads(done.read_text())
