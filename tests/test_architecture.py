"""The package layering and the config's resolved values, held as tests.

- ``neox_dar`` never imports the top-level ``eval`` package (the command-line tools there build on it, not the
  reverse), and ``neox_dar.attention`` never imports ``neox_dar.model`` (the model is built from the variants);
- every shipped config resolves to the values it resolved to before the config was split into sections (a
  snapshot taken with the flat config of commit 6043d04, tests/fixtures/resolved_configs.json).
"""

from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

import pytest

from neox_dar.config import load_config
from neox_dar.sweep.spec import load_sweep, plan

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "neox_dar"


def _imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports (module level or inside functions), relative imports made absolute (``path``
    lies under ``root``, the folder that holds the top-level package)."""
    package = list(path.relative_to(root).with_suffix("").parts[:-1])  # where its relative imports start
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
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
    offenders = {str(p.relative_to(ROOT)): sorted(i for i in _imports(p) if i == "eval" or i.startswith("eval."))
                 for p in PACKAGE.rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_attention_never_imports_the_model():
    offenders = {str(p.relative_to(ROOT)): sorted(i for i in _imports(p) if i.startswith("neox_dar.model"))
                 for p in (PACKAGE / "attention").rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


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
            expected = resolved.get(key, value)
            assert new[key] == pytest.approx(expected) if isinstance(expected, float) else new[key] == expected, \
                (name, key, new[key], expected)
