"""Data-parallel evaluation: the process group of an evaluation started by a launcher.

``torchrun --nproc_per_node N -m eval.perplexity ...`` (or ``python -m neox_dar.sweep.evaluate`` under torchrun,
as a sweep's SLURM job runs it on every GPU of the job) starts N processes with ``RANK``/``WORLD_SIZE``/
``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` set; ``srun`` with one task per GPU gives ``SLURM_PROCID``/
``SLURM_NTASKS``/``SLURM_LOCALID`` instead (``MASTER_ADDR``/``MASTER_PORT`` then come from the job script), as for
``train.py``. With a world size above 1, :func:`start_group` creates the group (NCCL when the evaluation runs on
GPUs, each rank on ``cuda:LOCAL_RANK``; gloo on CPUs); rank 0 reads the documents and chooses the checkpoint and
shares them, every rank scores its share of the windows (:func:`neox_dar.evaluation.scoring.score_documents`), and
rank 0 writes the results. Without a launcher (or with one process) the group is a single rank and nothing is
communicated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


def launcher_ranks() -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from the launcher's variables (torchrun's, or SLURM's under ``srun`` with
    several tasks); ``(0, 1, 0)`` without a launcher."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0"))
    if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env:
        return int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", "0"))
    return 0, 1, 0


@dataclass
class EvalGroup:
    """This process's place in the evaluation: its rank, the number of ranks, and whether it created the torch
    process group (then :meth:`close` destroys it)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owned: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, requested: str) -> str:
        """The device this rank evaluates on: ``cuda`` becomes ``cuda:LOCAL_RANK`` when there are several ranks (one
        GPU each); any other value is kept."""
        return f"cuda:{self.local_rank}" if self.world_size > 1 and requested == "cuda" else requested

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def share(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (what the other ranks pass is ignored)."""
        if self.world_size == 1:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def first_error(self, error: str | None) -> str | None:
        """The error of the lowest rank that has one (None on every rank when none has): every rank then stops
        together, and rank 0 alone prints it."""
        return next((e for e in self.all_gather(error) if e is not None), None)

    def close(self) -> None:
        if self.owned and dist.is_initialized():
            dist.destroy_process_group()
            self.owned = False


def start_group(device: str) -> EvalGroup:
    """The evaluation's ranks (:func:`launcher_ranks`), its process group created when there are several and none
    exists yet: NCCL for a CUDA ``device`` (this rank's GPU made current), gloo otherwise."""
    rank, world_size, local_rank = launcher_ranks()
    group = EvalGroup(rank, world_size, local_rank)
    if world_size == 1:
        return group
    if dist.is_initialized():
        return EvalGroup(dist.get_rank(), dist.get_world_size(), local_rank)
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    cuda = str(device).startswith("cuda")
    if cuda:
        torch.cuda.set_device(torch.device(group.device(str(device))))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world_size)
    group.owned = True
    return group
