"""Process group and device for one process, ``torchrun``, the ``deepspeed`` launcher or SLURM ``srun``.

A plain ``python train.py ...`` gets a 1-rank group (env defaults, a free local port); under a launcher the
launcher's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` are used; under ``srun``
without a launcher, ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID`` fill them (``MASTER_ADDR`` and
``MASTER_PORT`` must then come from the job script). Backend: NCCL on GPUs, gloo on CPU.

DeepSpeed's communication backend JIT-builds and loads its CPU shared-memory op (``deepspeed_shm_comm``) whenever
it is created, holding torch's extension lock file (``$TORCH_EXTENSIONS_DIR/deepspeed_shm_comm/lock``) meanwhile;
a kill in those seconds leaves the lock behind and every later load waits on it forever, silently. The op serves
only ``inference_all_reduce``, which training never calls, so it is never built or loaded here
(:func:`init_distributed`), and a stale lock found in the cache is named in one warning.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_env() -> dict[str, str]:
    """The rank variables this process will use (the launcher's, SLURM's, or single-process defaults)."""
    env = {}
    if "RANK" not in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
        if missing:
            from ..config import ConfigError

            raise ConfigError(f"this process is task {os.environ.get('SLURM_PROCID', '?')} of SLURM_NTASKS="
                              f"{os.environ['SLURM_NTASKS']} (srun without a launcher), which needs "
                              f"{' and '.join(missing)} exported for the rendezvous (slurm/launch_node.sh sets them; "
                              "for one process inside a larger allocation, run srun -n 1 or unset SLURM_NTASKS)")
        env["RANK"] = os.environ["SLURM_PROCID"]
        env["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        env["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    if "RANK" not in os.environ and "RANK" not in env:
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    return env


def world_size_from_env() -> int:
    """Data-parallel size before the group exists (to validate the batch configuration first)."""
    return int(os.environ.get("WORLD_SIZE") or launcher_env().get("WORLD_SIZE", "1"))


def _held_files() -> set[str] | None:
    """Every file some process on this machine holds open (from ``/proc/*/fd``); None where that is unknown."""
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    held = set()
    for pid in proc.iterdir():
        if not pid.name.isdigit():
            continue
        try:
            fds = list((pid / "fd").iterdir())
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                held.add(os.readlink(fd))
            except OSError:
                pass
    return held


def stale_extension_locks() -> list[Path]:
    """torch JIT-extension lock files in the extension cache that no process on this machine holds open: left by
    a build that was killed (torch's ``FileBaton`` keeps its lock open while it builds and deletes it after)."""
    # torch.utils.cpp_extension.get_default_build_root(), without importing that module (it imports setuptools:
    # about a second of every start-up)
    from torch._appdirs import user_cache_dir

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.realpath(user_cache_dir(appname="torch_extensions")))
    locks = [*root.glob("*/lock"), *root.glob("*/*/lock")] if root.is_dir() else []
    held = _held_files() if locks else set()
    if held is None:
        return []
    return [p for p in locks if str(p.resolve()) not in held]


def _without_shm_comm_op():
    """Stop DeepSpeed's communication backend from building and loading its ``deepspeed_shm_comm`` op (module
    docstring); returns a function that puts DeepSpeed's builder back."""
    import importlib

    backend = importlib.import_module("deepspeed.comm.torch")  # not `import ... as`: deepspeed.comm.torch is torch
    build = getattr(backend, "build_shm_op", None)
    if build is None:  # a DeepSpeed that does not build it
        return lambda: None
    backend.build_shm_op = lambda: None

    def restore() -> None:
        backend.build_shm_op = build

    return restore


def init_distributed() -> DistInfo:
    """Create the process group through DeepSpeed and pick this rank's device."""
    import deepspeed

    for k, v in launcher_env().items():
        os.environ.setdefault(k, v)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    for lock in stale_extension_locks() if local_rank == 0 else ():
        logging.getLogger("neox_dar.train").warning(
            "stale torch extension lock %s (no process on this machine holds it: its build was killed; training "
            "never waits on it, but a tool that loads that extension would wait forever: delete the file)", lock)
    if not dist.is_initialized():
        restore = _without_shm_comm_op()
        try:
            deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        finally:
            restore()
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device)


def all_reduce_mean(values: list[float], device: torch.device) -> list[float]:
    """Average a list of floats over ranks (one collective)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return (t / dist.get_world_size()).tolist()


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is true on at least one."""
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def barrier() -> None:
    dist.barrier()
