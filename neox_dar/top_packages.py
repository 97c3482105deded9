"""The folders ``kernels/``, ``eval/`` and ``data_prep/`` at the top of the repository, as this package reaches them.

Installed (``pip install -e .`` or a wheel), they are ``neox_dar.kernels``, ``neox_dar.eval`` and
``neox_dar.data_prep`` (setup.py), so nothing in site-packages is called ``kernels`` (a PyPI package transformers
looks for) or ``eval``. From a checkout that is not installed (the repository on ``PYTHONPATH``, as
scripts/gpu_check.sh and scripts/replicate.sh run it) they are the folders themselves, top-level packages; from the
repository's root both names work (``python -m eval.perplexity``).
"""

from __future__ import annotations

import importlib.util

INSTALLED = importlib.util.find_spec("neox_dar.eval") is not None


def module_name(name: str) -> str:
    """The name to import or run ``name`` (``"eval.perplexity"``) by: ``"neox_dar.eval.perplexity"`` when
    installed, else ``name``."""
    return f"neox_dar.{name}" if INSTALLED else name
