"""The package layering and the config's resolved values, held as tests.

- ``neox_dar`` never imports the top-level ``eval`` package (the command-line tools there build on it, not the
  reverse), and ``neox_dar.attention`` never imports ``neox_dar.model`` (the model is built from the variants);
- the config is a leaf: importing it, and loading a config file, imports no torch, and it imports only the
  torch-free packages below it (the config-field machinery, the variants, the families, the corpus names), which
  never import it back; data preparation imports no torch either;
- the packages (and top-level modules) of ``neox_dar`` import each other without a circle, type-only imports
  included;
- every shipped config resolves to the values recorded in tests/fixtures/resolved_configs.json (what moving code
  between modules must not change).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from neox_dar.config import load_config
from neox_dar.sweep.planning import plan
from neox_dar.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "neox_dar"


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (imports for type checkers, never run)."""
    return {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test) in
            ("TYPE_CHECKING", "typing.TYPE_CHECKING") for stmt in node.body for inner in ast.walk(stmt)}


def _imports(path: Path, root: Path = ROOT, runtime: bool = False, module_level: bool = False) -> set[str]:
    """Every module ``path`` imports (module level or inside functions), relative imports made absolute (``path``
    lies under ``root``, the folder that holds the top-level package). ``runtime``: without the imports under
    ``if TYPE_CHECKING:``; ``module_level``: only the imports that run when the module is imported (not those
    inside functions)."""
    package = list(path.relative_to(root).with_suffix("").parts[:-1])  # where its relative imports start
    tree = ast.parse(path.read_text())
    skipped = _type_checking_only(tree) if runtime else set()
    if module_level:
        skipped |= {id(inner) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    for inner in ast.walk(node) if inner is not node}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                name = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                name = node.module
            found.add(name)
            found |= {f"{name}.{alias.name}" for alias in node.names}
    return found


def test_neox_dar_never_imports_the_eval_package():
    """Neither by its name in a checkout nor by its installed one (neox_dar.eval)."""
    offenders = {str(p.relative_to(ROOT)): sorted(i for i in _imports(p) if i.split(".")[0] == "eval"
                                                  or i == "neox_dar.eval" or i.startswith("neox_dar.eval."))
                 for p in PACKAGE.rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_attention_never_imports_the_model():
    offenders = {str(p.relative_to(ROOT)): sorted(i for i in _imports(p) if i.startswith("neox_dar.model"))
                 for p in (PACKAGE / "attention").rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


# what the config package imports: the torch-free packages below it, none of which imports it back
BELOW_CONFIG = ("neox_dar.config_fields", "neox_dar.variants", "neox_dar.families", "neox_dar.corpus_names",
                "neox_dar.notices")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_config_imports_no_torch():
    """``import neox_dar.config`` and loading a config file (a variant with its own keys included) import no
    torch."""
    code = ("import sys; from neox_dar.config import load_config; "
            "load_config('configs/tiny.yml', 'configs/attention/dar.yml'); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_data_preparation_imports_no_torch():
    """``data_prep``'s commands (and the token stores they write through ``neox_dar.data``) import no torch: it would
    add about 180 MB to the main process and to each worker (seen: the Wikipedia part's peak RSS per process went from
    111 and 94 MB to 297 and 277 MB when ``neox_dar.data`` began importing torch at import)."""
    code = ("import sys; import data_prep.tokenize, data_prep.chat, data_prep.enwik8, data_prep.journal; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_config_is_a_leaf():
    """Everything neox_dar/config imports (its command line, ``__main__``, aside), directly or through what it
    imports, type-only imports included, is one of :data:`BELOW_CONFIG`, and none of those imports torch when
    imported (only a variant's spec's ``module()`` does, by name, when a model is built)."""
    graph = package_graph(type_only=True)
    reached, todo = set(), ["neox_dar.config"]
    while todo:
        for target in graph.get(todo.pop(), {}):
            if target not in reached:
                reached.add(target)
                todo.append(target)
    assert reached <= set(BELOW_CONFIG), {p: {t: sorted(f) for t, f in graph[p].items()} for p in reached
                                          if p not in BELOW_CONFIG or p == "neox_dar.config"}
    offenders = {}
    for package in BELOW_CONFIG:
        path = PACKAGE / package.split(".")[1]
        for p in (path.rglob("*.py") if path.is_dir() else [path.with_suffix(".py")]):
            bad = [i for i in _imports(p, runtime=True, module_level=True) if i == "torch" or i.startswith("torch.")]
            if bad:
                offenders[str(p.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}


def _package_of(module: str) -> str | None:
    """The node of the package graph a module belongs to: ``neox_dar.X`` (a subpackage or a top-level module)."""
    parts = module.split(".")
    if parts[0] != "neox_dar" or len(parts) < 2:
        return None
    if not ((PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").is_file()):
        return None  # a name imported from the package itself (``from neox_dar import __version__``)
    return f"neox_dar.{parts[1]}"


def package_graph(type_only: bool = False) -> dict[str, dict[str, set[str]]]:
    """``{package: {package it imports: the files that import it}}`` over neox_dar (module level and inside
    functions), leaving out the command-line entry points (``__main__.py``: no module imports them; they import what
    they run) and, unless ``type_only``, the imports for type checkers only (``if TYPE_CHECKING:``)."""
    graph: dict[str, dict[str, set[str]]] = {}
    for p in PACKAGE.rglob("*.py"):
        source = _package_of(_module_name(p))
        if p.name == "__main__.py" or source is None:
            continue
        graph.setdefault(source, {})
        for name in _imports(p, runtime=not type_only):
            target = _package_of(name)
            if target is not None and target != source:
                graph[source].setdefault(target, set()).add(str(p.relative_to(ROOT)))
    return graph


def _a_circle(graph: dict[str, dict[str, set[str]]]) -> list[str] | None:
    """One import circle of ``graph`` (its packages in order, the first repeated at the end), or None."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        path = path + [node]
        for target in sorted(graph.get(node, {})):
            if state.get(target) == "open":  # on the path: back to it
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target, path)):
                return found
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [])):
            return found
    return None


def test_no_import_circle_between_packages():
    """Type-only imports (``if TYPE_CHECKING:``) included: a package that names another's types sits above it."""
    graph = package_graph(type_only=True)
    circle = _a_circle(graph)
    assert circle is None, " -> ".join(circle) + "; edges: " + "; ".join(
        f"{a} -> {b} ({', '.join(sorted(graph[a][b]))})" for a, b in zip(circle, circle[1:]))


def _module_graph(package: str) -> dict[str, dict[str, set[str]]]:
    """The imports between the modules of ``neox_dar/<package>`` (its command line and package file aside),
    type-only and in-function imports included: module -> imported module -> the importing file."""
    graph: dict[str, dict[str, set[str]]] = {}
    for p in (PACKAGE / package).glob("*.py"):
        if p.name in ("__main__.py", "__init__.py"):
            continue
        source = _module_name(p)
        graph[source] = {}
        for name in _imports(p):
            target = next((m for m in (name, name.rpartition(".")[0]) if m.startswith(f"neox_dar.{package}.")
                           and (ROOT / f"{m.replace('.', '/')}.py").is_file()), None)
            if target is not None and target != source:
                graph[source].setdefault(target, set()).add(str(p.relative_to(ROOT)))
    return graph


def test_the_sweep_modules_import_each_other_without_a_circle():
    """Inside neox_dar/sweep (its command line aside), type-only and in-function imports included: the sweep file's
    error has a module of its own, so the plan, the SLURM settings and the report's run selection need not import
    each other both ways."""
    assert _a_circle(_module_graph("sweep")) is None


def test_the_config_modules_import_each_other_without_a_circle():
    """Inside neox_dar/config, in-function imports included: the typed Config builds itself from layers of flat keys
    (typed.py), and loading.py, which reads the files, imports it, not the other way round."""
    assert _a_circle(_module_graph("config")) is None


MAX_LINES = 400  # a longer module holds more than one concept: split it at its seams
NOT_SOURCE = {"tests", "bench", "runs", "build", "wandb", "out"}  # tests, benchmarks and what runs write


def test_no_python_file_is_over_400_lines():
    """Every Python file of the project, tests and bench aside, has at most :data:`MAX_LINES` lines."""
    long = {}
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder)
        dirs[:] = [d for d in dirs if not d.startswith((".", "__")) and not (here == ROOT and d in NOT_SOURCE)]
        for name in files:
            if name.endswith(".py") and (n := len((here / name).read_text().splitlines())) > MAX_LINES:
                long[str((here / name).relative_to(ROOT))] = n
    assert long == {}


def test_the_circle_finder_finds_one():
    assert _a_circle({"a": {"b": set()}, "b": {"c": set()}, "c": {"a": set()}}) == ["a", "b", "c", "a"]
    assert _a_circle({"a": {"b": set()}, "b": {"c": set()}}) is None


def test_the_import_scanner_sees_relative_and_nested_imports(tmp_path):
    """The scanner itself: a relative import two levels up and an import inside a function are both found. The probe
    lies in a scratch copy of the package's layout, never in the source tree (other tests scan that, in parallel)."""
    probe = tmp_path / "neox_dar" / "attention" / "_probe_for_test.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("def f():\n    from ..model import build_model\n    import eval.table\n")
    found = _imports(probe, root=tmp_path)
    assert "neox_dar.model.build_model" in found and "eval.table" in found


# ---------------------------------------------------------------------------------------------------------
# resolved values of every shipped config


def _flat(cfg) -> dict:
    """The resolved flat view, nested mappings flattened to dotted keys, plus the values computed from keys."""
    out = {}
    for key, value in cfg.flat().items():
        if isinstance(value, dict):
            for k2, v2 in value.items():
                if isinstance(v2, dict):
                    out.update({f"{key}.{k2}.{k3}": v3 for k3, v3 in v2.items()})
                else:
                    out[f"{key}.{k2}"] = v2
        else:
            out[key] = value
    out.update(warmup_iters=cfg.training.warmup_iters, head_dim=cfg.model.head_dim,
               rotary_ndims=cfg.model.rotary_ndims, padded_vocab_size=cfg.model.padded_vocab_size)
    return out


def _cases() -> dict:
    cases = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for p in sorted((ROOT / "configs").glob("*.yml")):
            cases[str(p.relative_to(ROOT))] = load_config(p)
            for a in sorted((ROOT / "configs" / "attention").glob("*.yml")):
                cases[f"{p.relative_to(ROOT)} + {a.relative_to(ROOT)}"] = load_config(p, a)
        cases["tests/fixtures/gpt-neox-pythia-70m.yml"] = load_config(ROOT / "tests/fixtures/gpt-neox-pythia-70m.yml")
        for s in sorted((ROOT / "configs" / "sweeps").glob("*.yml")):
            for r in plan(load_sweep(s), "/tmp/snapshot-sweeps"):
                cases[f"{s.relative_to(ROOT)}:{r.spec.name}"] = r.cfg
    return cases


def test_every_shipped_config_resolves_as_before():
    """The snapshot holds, for every shipped config, each key's value (unset defaults as None) and the old derived
    values: ``d_down`` (hidden_size // 4 when unset), ``final_lr``, ``decay_iters``. Now those are the resolved keys
    themselves: ``dar_d_down`` (resolved only where the chosen variant reads it), ``min_lr``, ``lr_decay_iters``.
    Keys and configs added since the snapshot are not in it."""
    snapshot = json.loads((ROOT / "tests/fixtures/resolved_configs.json").read_text())
    cases = _cases()
    assert set(snapshot) <= set(cases), sorted(set(snapshot) - set(cases))
    for name, old in snapshot.items():
        new = _flat(cases[name])
        resolved = {"min_lr": old["final_lr"], "lr_decay_iters": old["decay_iters"]}
        if new["attention_type"] in ("dar", "uniform"):
            resolved["dar_d_down"] = old["d_down"]
        for key, value in old.items():
            if key in ("final_lr", "decay_iters", "d_down", "save", "wandb_group", "wandb_run_name"):
                continue
            if key == "warmup_iters":  # now unrounded, as GPT-NeoX's; the snapshot holds it rounded down
                assert int(new[key]) == value, (name, key, new[key], value)
                continue
            expected = resolved.get(key, value)
            assert new[key] == pytest.approx(expected) if isinstance(expected, float) else new[key] == expected, \
                (name, key, new[key], expected)
