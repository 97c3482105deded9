"""The package shadows nothing: ``kernels/``, ``eval/`` and ``data_prep/`` stay at the top of the repository and
install inside ``neox_dar`` (setup.py), in a wheel and in an editable install, built here from a copy of the sources;
the installed wheel runs from anywhere, and a checkout that is not installed reaches the folders by their own names
(neox_dar.top_packages)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from builders import ROOT

TOP = ("kernels", "eval", "data_prep")
SOURCES = ("pyproject.toml", "setup.py", "requirements.txt", "README.md", "neox_dar", *TOP)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """A copy of what a build reads (a build writes build/ and *.egg-info beside it)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(ROOT / name, src / name)
    return src


def _wheel_names(wheel: Path) -> tuple[set[str], str, str]:
    """The wheel's top-level names, its top_level.txt and entry_points.txt."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
        return ({n.split("/")[0] for n in names}, z.read(f"{info}/top_level.txt").decode(),
                z.read(f"{info}/entry_points.txt").decode())


def _source_modules(sources: Path) -> set[str]:
    """The dotted names of every module under the sources' package folders, as the package installs them."""
    names = set()
    for top in ("neox_dar", *TOP):
        for path in (sources / top).rglob("*.py"):
            parts = path.relative_to(sources).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            names.add(".".join(parts if top == "neox_dar" else ("neox_dar", *parts)))
    return names


def _wheel_modules(wheel: Path) -> set[str]:
    """The dotted names of the wheel's Python modules."""
    with zipfile.ZipFile(wheel) as z:
        paths = [Path(n) for n in z.namelist() if n.endswith(".py")]
    return {".".join(p.with_suffix("").parts[:-1] if p.stem == "__init__" else p.with_suffix("").parts)
            for p in paths}


# what a process finds: the package, the kernels the triton path imports, the evaluation module a sweep runs
PROBE = """
import importlib, json, torch
from neox_dar.attention.triton_bridge import triton_kernels
from neox_dar.top_packages import INSTALLED, PACKAGE, module_name
evaluation = importlib.import_module(module_name("eval.perplexity"))
print(json.dumps({"package": str(PACKAGE), "kernels": triton_kernels(torch.device("cpu")).__file__,
                  "eval": evaluation.__file__, "installed": INSTALLED}))
"""


def _probe(cwd: Path, prelude: str = "", **env: str) -> dict:
    """:data:`PROBE`'s answer in a fresh interpreter in ``cwd`` (``prelude`` runs first)."""
    out = subprocess.run([sys.executable, "-c", prelude + PROBE], cwd=cwd, capture_output=True, text=True,
                         env={**os.environ, "TRITON_INTERPRET": "1", **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def _found(root: Path, package: Path, installed: bool) -> dict:
    """The probe's answer when ``package`` is neox_dar and the folders are ``root``'s."""
    return {"package": str(package), "kernels": str(root / "kernels" / "__init__.py"),
            "eval": str(root / "eval" / "perplexity.py"), "installed": installed}


def test_the_wheel_installs_the_folders_inside_neox_dar_and_runs_from_anywhere(sources, tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    tmp_path / "dist", sources], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("*.whl"))
    top, top_level, entry_points = _wheel_names(wheel)
    assert top == {"neox_dar", wheel.name.split("-py3")[0] + ".dist-info"} and top_level.split() == ["neox_dar"]
    assert "neox-dar-lm-eval = neox_dar.eval.lm_eval_cli:main" in entry_points
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # what pip install --target puts there, for a pure-Python wheel
    assert sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info")) == ["neox_dar"]
    package = site / "neox_dar"
    assert _probe(tmp_path, PYTHONPATH=str(site)) == _found(package, package, True)
    run = subprocess.run([sys.executable, "-m", "neox_dar.data_prep.tokenize", "--help"], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True)
    assert run.returncode == 0 and "usage" in run.stdout, run.stderr[-3000:]
    # every module of the sources is in the wheel, and each imports from it (in one interpreter, the editable
    # finder of this checkout taken out so nothing is found outside the wheel)
    modules = _source_modules(sources)
    assert {n for n in _wheel_modules(wheel)} == modules
    script = ("import importlib, sys\n"
              "sys.meta_path[:] = [f for f in sys.meta_path if not f.__module__.startswith('__editable__')]\n"
              f"for name in {sorted(modules)!r}:\n"
              "    module = importlib.import_module(name)\n"
              f"    assert module.__file__.startswith({str(site)!r}), module.__file__\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(site), "TRITON_INTERPRET": "1"})
    assert run.returncode == 0, run.stderr[-3000:]


def test_the_editable_install_maps_the_folders_inside_neox_dar(sources, tmp_path):
    """``pip install -e .``: the finder setuptools installs maps neox_dar.kernels to kernels/ (and so on), no
    top-level name but neox_dar."""
    script = f"from setuptools import build_meta; print(build_meta.build_editable({str(tmp_path)!r}))"
    out = subprocess.run([sys.executable, "-c", script], cwd=sources, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    wheel = tmp_path / out.stdout.split()[-1]
    _, top_level, _ = _wheel_names(wheel)
    with zipfile.ZipFile(wheel) as z:
        finder = next(z.read(n).decode() for n in z.namelist() if n.endswith("_finder.py"))
    mapping = ast.literal_eval(re.search(r"^MAPPING: .*? = (\{.*\})$", finder, re.M).group(1))
    assert mapping == {"neox_dar": str(sources / "neox_dar"), **{f"neox_dar.{t}": str(sources / t) for t in TOP}}
    assert top_level.split() == ["neox_dar"]


def test_another_checkout_than_the_installed_one_uses_its_own_folders(sources):
    """Run from the root of a second checkout (the copy) while the editable install maps this one: the kernels and
    the evaluation module are the second checkout's, never a mix of the two."""
    assert _probe(sources) == _found(sources, sources / "neox_dar", False)


def test_a_checkout_that_is_not_installed_reaches_the_folders_by_their_names():
    """The repository on the path and no install (the editable finder taken out, as if none were installed): the
    kernels, and the module a sweep runs for its evaluation, are the top-level folders."""
    prelude = ("import sys\n"
               "sys.meta_path[:] = [f for f in sys.meta_path if not f.__module__.startswith('__editable__')]\n")
    assert _probe(ROOT, prelude) == _found(ROOT, ROOT / "neox_dar", False)
