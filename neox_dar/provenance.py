"""Where a number came from: package version, git commit of the code, the command and the UTC date; and for a
benchmark the device, its software and the machine (``device_report``).

Saved with every checkpoint (``code_version``) and every benchmark result (``provenance``, ``write_result``).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def code_version() -> dict:
    """Package version, git commit of the code and whether the tree had local changes (when run from a checkout).

    A copy of the tree without its ``.git`` (the GPU machine gets one) has no commit to read: there the commit is
    ``$NEOX_DAR_GIT_COMMIT`` when set (the caller names the commit it copied), else None, and ``git_dirty`` None. A
    git repository above the code (an installed package inside someone's project) is not the code's."""
    from . import __version__

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

    try:
        toplevel, commit = git("rev-parse", "--show-toplevel", "HEAD").splitlines()
        if Path(toplevel).resolve() == REPO:
            return {"package_version": __version__, "git_commit": commit,
                    "git_dirty": git("status", "--porcelain", "--untracked-files=no") != ""}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"package_version": __version__, "git_commit": os.environ.get("NEOX_DAR_GIT_COMMIT") or None,
            "git_dirty": None}


def provenance(argv: list[str] | None = None) -> dict:
    """``code_version()`` plus the command line (``argv``, default: this process's, ``python -m MODULE ...`` as it
    was typed when it ran a module; paths under the current directory written relative to it, so a result names no
    folder of the machine it ran on) and the UTC date."""
    if argv is None:
        argv = list(sys.argv)
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if spec is not None and spec.name:  # python -m MODULE: sys.argv[0] is the module's file
            argv[0:1] = ["-m", spec.name.removesuffix(".__main__")]
    here = f"{Path.cwd()}{os.sep}"
    args = [a.replace(here, "") for a in argv]
    return {"command": " ".join(["python", *args]),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            **code_version()}


def shown_path(path: str | Path) -> str:
    """``path`` as a result records it: relative to the current directory when it lies under it (a result names no
    folder of the machine it ran on), else absolute."""
    where = Path(path).resolve()
    try:
        return str(where.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(where)


def write_result(report: dict, path: str | Path) -> Path:
    """Write a benchmark ``report`` as JSON to ``path`` (parent folders created; whole or not at all: a failed write
    leaves an earlier result as it was) and say where."""
    from .rundir import write_output

    out = Path(path)
    write_output(out, json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return out


def device_name(device) -> str:
    """What a benchmark ran on: the CUDA device's name, or the CPU and torch's thread count."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{_cpu()} ({torch.get_num_threads()} threads)"


def machine_id() -> str | None:
    """Which machine, in which of its starts, a benchmark ran on: the kernel's boot id (new at every start) and,
    where CUDA runs, the GPU's UUID, as ``"<boot id>/<GPU UUID>"`` (``"<boot id>"`` without a GPU); None where
    neither can be read. Results with different ids come from two machines (or two starts of one), whose timings
    bench/gpu_targets.py does not compare."""
    import torch

    parts = []
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
    except OSError:
        pass
    if torch.cuda.is_available():
        uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
        if uuid is not None:
            parts.append(str(uuid))
    return "/".join(p for p in parts if p) or None


def device_report() -> dict:
    """The GPU, its driver, the CUDA/torch/Triton versions and :func:`machine_id`, for benchmark records (None where
    unknown)."""
    import torch
    import triton

    driver = None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        pass
    gpu = torch.cuda.is_available()
    return {"device": torch.cuda.get_device_name() if gpu else None,
            "capability": ".".join(map(str, torch.cuda.get_device_capability())) if gpu else None,
            "driver": driver, "cuda": torch.version.cuda, "torch": torch.__version__, "triton": triton.__version__,
            "machine": machine_id()}


def machine_cpu() -> str:
    """What a benchmark ran on when the work is not one torch process's (several processes, or no torch): the CPU
    and the machine's core count."""
    return f"{_cpu()} ({os.cpu_count()} cores)"


def _cpu() -> str:
    import platform

    return f"CPU {platform.processor() or platform.machine()}"


def synchronize(device) -> None:
    """Wait for the device's queued work (CUDA) before reading a clock; nothing on the CPU."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
