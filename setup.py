"""The package list; everything else is in pyproject.toml.

``kernels/``, ``eval/`` and ``data_prep/`` stay at the top of the repository (``python -m eval.perplexity`` from its
root) but install inside the package, as ``neox_dar.kernels``, ``neox_dar.eval`` and ``neox_dar.data_prep``: nothing
in site-packages is called ``kernels`` (a PyPI package transformers looks for) or ``eval``.
"""

from setuptools import find_packages, setup

TOP = ("kernels", "eval", "data_prep")

setup(packages=find_packages(include=["neox_dar", "neox_dar.*"])
      + [f"neox_dar.{p}" for p in find_packages(include=[*TOP, *(f"{t}.*" for t in TOP)])],
      package_dir={f"neox_dar.{t}": t for t in TOP})
