"""Training data: Megatron ``.bin/.idx`` token stores, GPT-NeoX sample packing, blending, sampling, checks.

* :func:`build_datasets` (cfg, train_samples, valid_samples) -> (train_ds, valid_ds or None)
* :func:`.check.check_data_files` (cfg): the start-up checks of every data file (headers, sizes, token ids), and
  ``python -m neox_dar.data.check`` (imported from its module, so the command runs it once)
* :class:`DataParallelSampler` micro-batches of sample indices per rank, exact resume
* :class:`IndexedDataset` / :class:`IndexedDatasetWriter`: validated reader and writer of the
  ``MMapIndexedDataset`` format that GPT-NeoX and megatron-core use
* :class:`GPTDataset`, :class:`BlendedDataset`: GPT-NeoX's packed samples and weighted blends
"""

from .blended import BlendedDataset
from .build import blend_sample_counts, build_datasets, index_epochs, split_bounds
from .gpt_dataset import DataSplitError, GPTDataset
from .indexed import IndexedDataset, IndexedDatasetError, IndexedDatasetWriter, best_dtype, write_index
from .sampler import DataParallelSampler

__all__ = [
    "build_datasets", "blend_sample_counts", "index_epochs", "split_bounds", "DataParallelSampler", "GPTDataset",
    "BlendedDataset", "DataSplitError", "IndexedDataset", "IndexedDatasetError", "IndexedDatasetWriter", "best_dtype",
    "write_index",
]
