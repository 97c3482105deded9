"""GPT-NeoX ``GPTDataset``: fixed-length training samples packed across documents.

Given the documents (sequence indices) of an :class:`~neox_dar.data.indexed.IndexedDataset`,
a requested number of samples, ``seq_length`` and a seed, three index maps are built once
and cached as ``.npy`` files (GPT-NeoX's ``_build_index_mappings``):

* ``doc_idx`` [E * D] int32: the documents repeated for E epochs (just enough epochs for the
  requested samples), shuffled with ``np.random.RandomState(seed)``;
* ``sample_idx`` [S + 1, 2]: where sample i starts in the flattened ``doc_idx`` stream
  (position in doc_idx, token offset), built by megatron-core's C++ helper; sample i is the
  stream's tokens ``[i * seq_length, (i + 1) * seq_length]``: seq_length + 1 tokens;
* ``shuffle_idx`` [S]: a seeded permutation of the samples (same RandomState, drawn next).

``ds[i]`` is ``int64[seq_length + 1]``; ``len(ds)`` is S - 1, GPT-NeoX's count (its
``__len__`` is ``min(len(shuffle_idx) - 1, len(sample_idx) - 1)``). With ``shuffle=False``
both permutations are the identity, so samples come in file order.

Fixed-length mode (ours, for Pythia's pre-tokenized, pre-shuffled Pile of 2049-token
sequences): each document is one sample, which reproduces those sequences exactly, and
``len(ds)`` is E * D. It is used when ``fixed_length`` is True (every document must hold
``seq_length + 1`` tokens) or, when it is None, only with ``shuffle=False`` and documents that
all hold ``seq_length + 1`` tokens; shuffled data is always packed as GPT-NeoX packs it.

Index maps are built by one process: under ``torch.distributed`` global rank 0 builds first
while the others wait at a barrier; in every case a file lock next to the cache serialises
builders (ranks on other nodes without a shared file system build their own copy) and
files appear by atomic rename, so no reader sees a half-written map.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os

import numpy as np

from .helpers import build_sample_idx
from .indexed import IndexedDataset

log = logging.getLogger(__name__)


class DataSplitError(ValueError):
    """A dataset or split that cannot yield the requested samples (e.g. zero documents)."""


def num_epochs_for(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Fewest epochs E with (E * tokens_per_epoch - 1) // seq_length >= num_samples."""
    if tokens_per_epoch <= 1:
        raise DataSplitError(f"a dataset with {tokens_per_epoch} tokens cannot yield samples")
    return max(1, -(-(num_samples * seq_length + 1) // tokens_per_epoch))


class GPTDataset:
    """``num_samples`` (or more) samples of ``seq_length + 1`` tokens from ``documents`` of ``indexed``.

    Args:
        name: split name used in cache file names ("train", "valid", "test").
        indexed: the token store.
        documents: int array [D] of sequence indices in ``indexed`` this split uses.
        num_samples: samples requested (GPT-NeoX's epoch rule); ``len(ds)`` is at least num_samples - 1.
        seq_length: model sequence length (samples hold seq_length + 1 tokens).
        seed: seed of the document and sample shuffles.
        shuffle: shuffle documents and samples (False: file order).
        cache_dir: directory for index-map ``.npy`` files (default: next to the data).
        fixed_length: one document per sample (True), packing (False), or None: fixed-length only
            when ``shuffle`` is False and every document holds ``seq_length + 1`` tokens.
    """

    def __init__(self, name: str, indexed: IndexedDataset, documents: np.ndarray, num_samples: int,
                 seq_length: int, seed: int, shuffle: bool = True, cache_dir: str | None = None,
                 fixed_length: bool | None = None):
        self.name, self.indexed, self.seq_length, self.num_samples = name, indexed, int(seq_length), int(num_samples)
        documents = np.asarray(documents, dtype=np.int64)
        if len(documents) == 0:
            raise DataSplitError(f"split '{name}' of {indexed.prefix} has 0 documents "
                                 f"(the dataset holds {len(indexed)}); change `split` or use a larger dataset")
        if num_samples < 0:
            raise DataSplitError(f"split '{name}': num_samples must be >= 0, got {num_samples}")
        sizes = np.ascontiguousarray(indexed.sizes[documents])
        tokens_per_epoch = int(sizes.sum(dtype=np.int64))
        if tokens_per_epoch <= 1:
            raise DataSplitError(f"split '{name}' of {indexed.prefix} has {tokens_per_epoch} tokens in "
                                 f"{len(documents)} documents; it cannot yield samples")
        whole = sizes == self.seq_length + 1
        if fixed_length and not whole.all():
            bad = int(np.argmin(whole))
            raise DataSplitError(f"data_fixed_length is set but document {int(documents[bad])} of {indexed.prefix} "
                                 f"holds {int(sizes[bad])} tokens, not seq_length + 1 = {self.seq_length + 1}")
        self.fixed_sequences = bool(fixed_length) or (fixed_length is None and not shuffle and bool(whole.all()))
        if self.fixed_sequences:
            num_epochs = max(1, -(-num_samples // len(documents)))
        else:
            num_epochs = num_epochs_for(tokens_per_epoch, self.seq_length, num_samples)
        self.num_epochs = num_epochs
        key = hashlib.sha256(documents.tobytes() + sizes.tobytes()
                             + f"{shuffle}|{self.fixed_sequences}".encode()).hexdigest()[:12]  # stale maps never match
        base = os.path.basename(indexed.prefix)
        directory = cache_dir or os.path.dirname(os.path.abspath(indexed.prefix))
        stem = os.path.join(directory, f"{base}_{name}_indexmap_{num_samples}ns_{seq_length}sl_{seed}s_{key}")
        self.cache_files = {k: f"{stem}_{k}.npy" for k in ("doc_idx", "sample_idx", "shuffle_idx")}

        def build() -> dict[str, np.ndarray]:
            rng = np.random.RandomState(seed=seed)
            doc_idx = np.tile(documents, num_epochs).astype(np.int32 if len(indexed) < 2**31 else np.int64)
            if shuffle:
                rng.shuffle(doc_idx)
            if self.fixed_sequences:
                sample_idx = np.stack([np.arange(len(doc_idx) + 1), np.zeros(len(doc_idx) + 1, np.int64)], 1)
            else:
                sample_idx = build_sample_idx(indexed.sizes, doc_idx, self.seq_length, num_epochs, tokens_per_epoch)
            n = len(sample_idx) - 1
            shuffle_idx = np.arange(n, dtype=np.uint32 if n < np.iinfo(np.uint32).max - 1 else np.int64)
            if shuffle:
                rng.shuffle(shuffle_idx)
            return {"doc_idx": doc_idx, "sample_idx": sample_idx, "shuffle_idx": shuffle_idx}

        maps = load_or_build(stem + ".lock", self.cache_files, build)
        self.doc_idx, self.sample_idx, self.shuffle_idx = maps["doc_idx"], maps["sample_idx"], maps["shuffle_idx"]

    def __getstate__(self) -> dict:
        """Pickled without the memory-mapped index maps; they are reopened from the cache files."""
        state = dict(self.__dict__)
        for k in ("doc_idx", "sample_idx", "shuffle_idx"):
            del state[k]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        maps = _load(self.cache_files)
        self.doc_idx, self.sample_idx, self.shuffle_idx = maps["doc_idx"], maps["sample_idx"], maps["shuffle_idx"]

    def __len__(self) -> int:
        return len(self.shuffle_idx) if self.fixed_sequences else max(0, len(self.shuffle_idx) - 1)

    def __getitem__(self, idx: int) -> np.ndarray:
        """Sample ``idx`` as ``int64[seq_length + 1]``."""
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range for {len(self)} samples in split '{self.name}'")
        i = int(self.shuffle_idx[idx])
        if self.fixed_sequences:
            return self.indexed[int(self.doc_idx[i])].astype(np.int64)
        (df, of), (dl, ol) = self.sample_idx[i], self.sample_idx[i + 1]
        get = self.indexed.get
        if df == dl:
            return get(int(self.doc_idx[df]), int(of), int(ol - of + 1)).astype(np.int64)
        parts = [get(int(self.doc_idx[df]), int(of))]
        parts += [get(int(self.doc_idx[j])) for j in range(df + 1, dl)]
        parts.append(get(int(self.doc_idx[dl]), 0, int(ol + 1)))
        return np.concatenate(parts).astype(np.int64)


@contextlib.contextmanager
def file_lock(path: str):
    """Hold an exclusive ``flock`` on ``path`` (created, with its directory, when missing)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _load(files: dict[str, str]) -> dict[str, np.ndarray]:
    return {k: np.load(p, mmap_mode="r", allow_pickle=False) for k, p in files.items()}


def _build_locked(lock: str, files: dict[str, str], build) -> None:
    with file_lock(lock):
        if all(os.path.isfile(p) for p in files.values()):
            return
        log.info("building index maps %s", lock[: -len(".lock")])
        for k, arr in build().items():
            tmp = f"{files[k]}.tmp{os.getpid()}.npy"
            np.save(tmp, arr, allow_pickle=False)
            os.replace(tmp, files[k])


def load_or_build(lock: str, files: dict[str, str], build) -> dict[str, np.ndarray]:
    """Load cached maps, or build them once: rank 0 first (others wait at a barrier), under a file lock."""
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    if distributed and dist.get_rank() == 0:
        _build_locked(lock, files, build)
    if distributed:
        dist.barrier()
    if not all(os.path.isfile(p) for p in files.values()):
        _build_locked(lock, files, build)
    return _load(files)
