"""Weighted interleaving of several sample datasets (GPT-NeoX ``BlendableDataset``)."""

from __future__ import annotations

import numpy as np

from .gpt_dataset import DataSplitError
from .helpers import build_blending_indices


class BlendedDataset:
    """``size`` samples drawn from ``datasets`` in proportion to ``weights``.

    Sample i comes from dataset ``dataset_index[i]`` at its position ``dataset_sample_index[i]``;
    the interleaving is GPT-NeoX's (and megatron-core's) greedy rule (after every sample each
    dataset's count is within one of weight * i), so any prefix of the blend follows the weights.
    ``size`` defaults to the members' total length, as GPT-NeoX's ``BlendableDataset``. A position
    past the end of its dataset wraps to ``position % len(dataset)`` (GPT-NeoX's fallback on an
    IndexError); ``first_wrap`` is the first blend sample that wraps, or None.
    """

    def __init__(self, datasets: list, weights: list[float], size: int | None = None):
        if len(datasets) != len(weights) or not datasets:
            raise ValueError("BlendedDataset needs one weight per dataset and at least one dataset")
        w = np.asarray(weights, dtype=np.float64)
        if np.any(w < 0) or w.sum() <= 0:
            raise ValueError(f"blend weights must be non-negative with a positive sum, got {list(weights)}")
        lengths = [len(ds) for ds in datasets]
        self.datasets, self.weights = datasets, w / w.sum()
        self.size = int(sum(lengths) if size is None else size)
        self.dataset_index, self.dataset_sample_index = build_blending_indices(self.weights, self.size)
        past = self.dataset_sample_index >= np.asarray(lengths, dtype=np.int64)[self.dataset_index]
        self.first_wrap = int(np.argmax(past)) if past.any() else None
        for d, n in enumerate(lengths):
            mine = past & (self.dataset_index == d)
            if mine.any() and n == 0:
                raise DataSplitError(f"blend dataset {d} has no samples but the blend draws from it")
            self.dataset_sample_index[mine] %= max(n, 1)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> np.ndarray:
        """Sample ``idx`` as ``int64[seq_length + 1]``."""
        if not 0 <= idx < self.size:
            raise IndexError(f"sample {idx} out of range for a blend of {self.size} samples")
        return self.datasets[int(self.dataset_index[idx])][int(self.dataset_sample_index[idx])]
