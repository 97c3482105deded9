"""The folders ``kernels/``, ``eval/`` and ``data_prep/`` at the top of the repository, as this package reaches them.

Installed (``pip install -e .`` or a wheel), they are ``neox_dar.kernels``, ``neox_dar.eval`` and
``neox_dar.data_prep`` (setup.py), so nothing in site-packages is called ``kernels`` (a PyPI package transformers
looks for) or ``eval``. From a checkout that is not installed (the repository on ``PYTHONPATH``, as
scripts/gpu_check.sh and scripts/replicate.sh run it), or another checkout than the one installed (run from its
root), they are the checkout's own folders, top-level packages; from the repository's root both names work
(``python -m eval.perplexity``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def _installed() -> bool:
    """Whether ``neox_dar.eval`` is this package's own ``eval/``: inside it (a wheel) or beside it (this checkout's
    editable install), not the folder of another checkout that an editable install maps."""
    spec = importlib.util.find_spec("neox_dar.eval")
    return spec is not None and Path(spec.origin).resolve().parent in (PACKAGE / "eval", PACKAGE.parent / "eval")


INSTALLED = _installed()


def module_name(name: str) -> str:
    """The name to import or run ``name`` (``"eval.perplexity"``) by: ``"neox_dar.eval.perplexity"`` when
    installed, else ``name``."""
    return f"neox_dar.{name}" if INSTALLED else name
