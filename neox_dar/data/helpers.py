"""megatron-core's compiled index-map helpers (``helpers_cpp``), loaded without ``megatron.core``.

``import megatron.core`` pulls in the whole Megatron training stack (about 10 s on a CPU
machine); the C++ extension it ships for index maps is a self-contained pybind11 module,
so it is loaded here straight from its file. We use two of its functions:

* ``build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch)``: the
  GPTDataset sample index [num_samples + 1, 2] of (position in doc_idx, token offset);
* ``build_blending_indices(dataset_index, dataset_sample_index, weights, n, size, verbose)``:
  the greedy weighted interleaving of blended datasets.
"""

from __future__ import annotations

import functools
import glob
import importlib.machinery
import importlib.util
import os

import numpy as np


@functools.lru_cache(maxsize=1)
def megatron_helpers():
    """The ``megatron.core.datasets.helpers_cpp`` extension module; a clear error when missing."""
    spec = importlib.util.find_spec("megatron")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    files = [f for r in roots for f in glob.glob(os.path.join(r, "core", "datasets", "helpers_cpp*.so"))]
    if not files:
        raise ImportError("megatron-core's compiled dataset helpers (megatron/core/datasets/helpers_cpp*.so) were "
                          "not found; install megatron-core (pip install megatron-core)")
    loader = importlib.machinery.ExtensionFileLoader("helpers_cpp", files[0])
    mod_spec = importlib.util.spec_from_file_location("helpers_cpp", files[0], loader=loader)
    module = importlib.util.module_from_spec(mod_spec)
    loader.exec_module(module)
    return module


def build_sample_idx(sizes: np.ndarray, doc_idx: np.ndarray, seq_length: int, num_epochs: int,
                     tokens_per_epoch: int) -> np.ndarray:
    """Sample index [num_samples + 1, 2]: row i = (index into doc_idx, offset) where sample i starts.

    Sample i spans the flattened epoch stream's tokens ``[i * seq_length, (i + 1) * seq_length]``
    (seq_length + 1 tokens, the last shared with sample i + 1), GPT-NeoX's packing.
    """
    h = megatron_helpers()
    sizes = np.ascontiguousarray(sizes, dtype=np.int32)
    doc_idx = np.ascontiguousarray(doc_idx, dtype=np.int32)
    total = num_epochs * tokens_per_epoch
    fn = h.build_sample_idx_int32 if total < np.iinfo(np.int32).max else h.build_sample_idx_int64
    return fn(sizes, doc_idx, int(seq_length), int(num_epochs), int(tokens_per_epoch), True, 1)


def build_blending_indices(weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """For ``size`` blended samples: (dataset of each [size] int16, sample index within it [size] int64)."""
    weights = np.ascontiguousarray(weights, dtype=np.float64)
    dataset_index = np.zeros(size, dtype=np.int16)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    megatron_helpers().build_blending_indices(dataset_index, dataset_sample_index, weights, len(weights), int(size),
                                              False)
    return dataset_index, dataset_sample_index
