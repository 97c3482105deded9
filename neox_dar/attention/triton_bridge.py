"""The lazy link to the Triton kernels (``attention_impl: triton``): ``kernels/`` at the top of the repository,
``neox_dar.kernels`` when installed (:mod:`neox_dar.top_packages`).

The kernels are imported only when a variant runs on the ``triton`` path, so the package imports and
the other paths run without Triton. Asking for ``triton`` where it cannot run is an error, never a
silent fallback to another path.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING

from ..top_packages import INSTALLED

if TYPE_CHECKING:
    import torch


DQ_PASS_ENV = "NEOX_DAR_DQ_PASS"
"""The environment variable that fixes the kernels' backward ``dq`` pass to one of :data:`DQ_PASSES` (unset: chosen
by timing): ``kernels.backward``'s ``DQ_PASS_ENV`` and ``DQ_PASSES``, named here without importing Triton (a test
holds them equal), for train.py's checks."""
DQ_PASSES = ("atomic", "rows")


class AttentionImplError(RuntimeError):
    """The ``attention_impl`` asked for cannot run here (no CUDA device, no kernels installed, a shape the kernel does
    not take): one line that names the way out, never a silent fallback to another path."""


def interpreter_requested() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's CPU interpreter, read as Triton reads it (1, true, on, yes, y;
    any case), without importing Triton."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes", "y")


def triton_kernels(device: torch.device) -> ModuleType:
    """The kernels module (``triton_kernels(q.device).mswa_attention(q, k, v, windows)``), imported on first use;
    raises :class:`AttentionImplError` when Triton cannot run on ``device``.

    On CPU the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1``).
    """
    if device.type != "cuda" and not interpreter_requested():
        raise AttentionImplError(f"attention_impl 'triton' needs a CUDA device (or TRITON_INTERPRET=1 on CPU); "
                           f"tensors are on '{device}'. Use attention_impl: sdpa or reference here")
    try:
        if INSTALLED:
            from .. import kernels
        else:
            import kernels
    except ImportError as e:
        raise AttentionImplError(f"attention_impl 'triton' could not import the Triton kernels ({e})") from e
    return kernels
