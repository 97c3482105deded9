"""The lazy link to the Triton kernels in ``kernels/`` (``attention_impl: triton``).

The kernels are imported only when a variant runs on the ``triton`` path, so the package imports and
the other paths run without Triton. Asking for ``triton`` where it cannot run is an error, never a
silent fallback to another path.
"""

from __future__ import annotations

import importlib
import os

import torch


def triton_kernel(name: str, device: torch.device):
    """The function ``kernels.<name>``; raises RuntimeError when Triton cannot run on ``device``.

    On CPU the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1``).
    """
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"attention_impl 'triton' needs a CUDA device (or TRITON_INTERPRET=1 on CPU); "
                           f"tensors are on '{device}'. Use attention_impl: sdpa or reference here")
    try:
        module = importlib.import_module("kernels")
    except ImportError as e:
        raise RuntimeError(f"attention_impl 'triton' could not import the Triton kernels ({e})") from e
    fn = getattr(module, name, None)
    if fn is None:
        raise RuntimeError(f"attention_impl 'triton': kernels has no '{name}'")
    return fn
