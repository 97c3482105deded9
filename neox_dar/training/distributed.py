"""Process group and device for one process, ``torchrun``, the ``deepspeed`` launcher or SLURM ``srun``.

A plain ``python train.py ...`` gets a 1-rank group (env defaults, a free local port); under a launcher the
launcher's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` are used; under ``srun``
without a launcher, ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID`` fill them (``MASTER_ADDR`` and
``MASTER_PORT`` must then come from the job script). Backend: NCCL on GPUs, gloo on CPU.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

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
        env["RANK"] = os.environ["SLURM_PROCID"]
        env["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        env["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    if "RANK" not in os.environ and "RANK" not in env:
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    return env


def world_size_from_env() -> int:
    """Data-parallel size before the group exists (to validate the batch configuration first)."""
    return int(os.environ.get("WORLD_SIZE") or launcher_env().get("WORLD_SIZE", "1"))


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
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
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
