"""Weighted interleaving of several sample datasets (GPT-NeoX ``BlendableDataset``)."""

from __future__ import annotations

import numpy as np

from .helpers import build_blending_indices


class BlendedDataset:
    """``size`` samples drawn from ``datasets`` in proportion to ``weights``.

    Sample i comes from dataset ``dataset_index[i]`` at its position ``dataset_sample_index[i]``;
    the interleaving is megatron-core's greedy rule (after every sample each dataset's count is
    within one of weight * i), so any prefix of the blend follows the weights.
    """

    def __init__(self, datasets: list, weights: list[float], size: int):
        if len(datasets) != len(weights) or not datasets:
            raise ValueError("BlendedDataset needs one weight per dataset and at least one dataset")
        w = np.asarray(weights, dtype=np.float64)
        if np.any(w < 0) or w.sum() <= 0:
            raise ValueError(f"blend weights must be non-negative with a positive sum, got {list(weights)}")
        self.datasets, self.weights, self.size = datasets, w / w.sum(), int(size)
        self.dataset_index, self.dataset_sample_index = build_blending_indices(self.weights, self.size)
        for d, ds in enumerate(datasets):
            used = self.dataset_sample_index[self.dataset_index == d]
            if used.size and int(used.max()) >= len(ds):
                raise ValueError(f"blend needs {int(used.max()) + 1} samples from dataset {d} but it has {len(ds)}")

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> np.ndarray:
        """Sample ``idx`` as ``int64[seq_length + 1]``."""
        if not 0 <= idx < self.size:
            raise IndexError(f"sample {idx} out of range for a blend of {self.size} samples")
        return self.datasets[int(self.dataset_index[idx])][int(self.dataset_sample_index[idx])]
