"""The ``--device`` of the command-line tools, checked before any work: one line for a name that is not a device or
a device this machine lacks (torch's own errors were an AssertionError or a RuntimeError traceback)."""

from __future__ import annotations

import torch


def check_device(name: str | None, option: str = "--device") -> None:
    """ValueError (one line naming ``option``) unless ``name`` is None (the tool's default) or a cpu, cuda[:N] or mps
    device this machine has."""
    if name is None:
        return
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"{option} {name!r} is not a device (cpu, cuda, cuda:N or mps)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{option} {name}: CUDA is not available on this machine (use {option} cpu)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"{option} {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{option} {name}: MPS is not available on this machine (use {option} cpu)")
