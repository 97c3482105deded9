"""Data-parallel batch sampler that resumes exactly (Megatron's ``MegatronPretrainingSampler``)."""

from __future__ import annotations

from typing import Iterator


class DataParallelSampler:
    """Micro-batches of sample indices for one data-parallel rank.

    Global samples ``consumed_samples, consumed_samples + 1, ...`` are cut into global
    micro-batches of ``micro_batch_size * world_size``; rank r gets the r-th slice of
    ``micro_batch_size`` of each. Ranks are disjoint, every sample is used once, a trailing
    partial global micro-batch is dropped, and restarting with the ``consumed_samples`` a run
    had reached (a GLOBAL count) continues with exactly the next samples.
    """

    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int, rank: int,
                 world_size: int):
        if micro_batch_size < 1 or world_size < 1:
            raise ValueError(f"micro_batch_size ({micro_batch_size}) and world_size ({world_size}) must be >= 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if total_samples < 0 or not 0 <= consumed_samples <= total_samples:
            raise ValueError(f"consumed_samples ({consumed_samples}) must be in [0, total_samples={total_samples}]")
        self.total_samples, self.consumed_samples = int(total_samples), int(consumed_samples)
        self.micro_batch_size, self.rank, self.world_size = int(micro_batch_size), int(rank), int(world_size)
        self.global_micro_batch = self.micro_batch_size * self.world_size

    def __len__(self) -> int:
        """Micro-batches this rank will yield."""
        return (self.total_samples - self.consumed_samples) // self.global_micro_batch

    def __iter__(self) -> Iterator[list[int]]:
        first = self.consumed_samples + self.rank * self.micro_batch_size
        for step in range(len(self)):
            start = first + step * self.global_micro_batch
            yield list(range(start, start + self.micro_batch_size))
