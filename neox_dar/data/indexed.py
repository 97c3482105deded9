"""Megatron / GPT-NeoX ``MMapIndexedDataset`` files: a validated reader and a writer.

A dataset is a pair ``PREFIX.bin`` (the tokens of every sequence, back to back) and
``PREFIX.idx``, laid out exactly as GPT-NeoX and megatron-core write it:

=========  =====================  ==========================================
offset     type                   content
=========  =====================  ==========================================
0          9 bytes                ``b"MMIDIDX\\x00\\x00"``
9          ``<Q``                 version, always 1
17         ``<B``                 dtype code (4: int32, 8: uint16, ...)
18         ``<Q``                 N, number of sequences
26         ``<Q``                 M, number of document-index entries
34         int32[N]               sizes: tokens per sequence
34 + 4N    int64[N]               pointers: byte offset of each sequence in .bin
34 + 12N   int64[M]               doc_idx: 0, then the sequence count after each document
=========  =====================  ==========================================

:class:`IndexedDataset` checks all of this when it opens a pair (header, counts, file
sizes, pointers against sizes, doc_idx bounds), so a truncated or mismatched pair is a
one-line :class:`IndexedDatasetError`, never garbage tokens.
"""

from __future__ import annotations

import os
import struct

import numpy as np

HEADER = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = len(HEADER) + 8 + 1 + 8 + 8  # 34

# dtype codes shared by GPT-NeoX (megatron/data/indexed_dataset.py) and megatron-core (DType)
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
_CODE_OF = {np.dtype(np.float64): 6, **{v: k for k, v in DTYPE_CODES.items() if k != 6}}


class IndexedDatasetError(ValueError):
    """A missing, truncated or inconsistent ``.bin``/``.idx`` pair, or token ids it cannot hold (one line)."""


def best_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every token id fits (vocab < 65500, GPT-NeoX's rule), else int32."""
    return np.dtype(np.uint16) if vocab_size is not None and vocab_size < 65500 else np.dtype(np.int32)


def idx_path(prefix: str | os.PathLike) -> str:
    return f"{prefix}.idx"


def bin_path(prefix: str | os.PathLike) -> str:
    return f"{prefix}.bin"


def exists(prefix: str | os.PathLike) -> bool:
    return os.path.isfile(idx_path(prefix)) and os.path.isfile(bin_path(prefix))


def write_index(path: str | os.PathLike, dtype: np.dtype, sizes: np.ndarray, doc_idx: np.ndarray) -> None:
    """Write an ``.idx`` file for sequences of ``sizes`` [N] tokens and document index ``doc_idx`` [M]."""
    dtype = np.dtype(dtype)
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.size and (sizes.min() < 0 or sizes.max() > np.iinfo(np.int32).max):
        raise IndexedDatasetError(f"{path}: sequence sizes must fit in int32")
    pointers = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        np.cumsum(sizes[:-1] * dtype.itemsize, out=pointers[1:])
    doc_idx = np.asarray(doc_idx, dtype=np.int64)
    with open(path, "wb") as f:
        f.write(HEADER)
        f.write(struct.pack("<Q", VERSION))
        f.write(struct.pack("<B", _CODE_OF[dtype]))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(sizes.astype(np.int32).tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(doc_idx.tobytes(order="C"))


class IndexedDatasetWriter:
    """Streams documents into ``PREFIX.bin`` and writes ``PREFIX.idx`` on :meth:`finalize`.

    Each document is one sequence (as GPT-NeoX's ``tools/preprocess_data.py`` writes it).
    """

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype):
        self.prefix = str(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype.kind not in "iu" or self.dtype not in _CODE_OF:
            raise IndexedDatasetError(f"{self.prefix}: token dtype must be one of "
                                      f"{', '.join(str(d) for d in _CODE_OF if d.kind in 'iu')}, not {self.dtype}")
        self._bin = open(bin_path(self.prefix), "wb")
        self._sizes: list[np.ndarray] = []
        self._count = 0

    def add_documents(self, tokens: np.ndarray, sizes: np.ndarray) -> None:
        """Append documents: ``tokens`` [sum(sizes)] concatenated, ``sizes`` [D] tokens each."""
        tokens = np.asarray(tokens)
        if tokens.dtype != self.dtype:
            tokens = tokens.astype(self.dtype)
        self._bin.write(tokens.tobytes(order="C"))
        self._sizes.append(np.asarray(sizes, dtype=np.int64))
        self._count += len(sizes)

    def add_document(self, tokens: np.ndarray) -> None:
        """Append one document of ``tokens`` [n]."""
        self.add_documents(tokens, np.array([len(tokens)]))

    def finalize(self) -> None:
        """Close ``.bin`` (flushed to disk) and write ``.idx``."""
        self._bin.flush()
        os.fsync(self._bin.fileno())
        self._bin.close()
        sizes = np.concatenate(self._sizes) if self._sizes else np.zeros(0, dtype=np.int64)
        write_index(idx_path(self.prefix), self.dtype, sizes, np.arange(len(sizes) + 1, dtype=np.int64))


class IndexedDataset:
    """Read-only, memory-mapped view of a validated ``PREFIX.bin``/``PREFIX.idx`` pair.

    ``ds[i]`` is sequence ``i`` as a numpy array [sizes[i]] of the file's dtype (a view
    into the memory map); ``ds.get(i, offset, length)`` a slice of it.
    """

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = str(prefix)
        ipath, bpath = idx_path(self.prefix), bin_path(self.prefix)
        for p in (ipath, bpath):
            if not os.path.isfile(p):
                given_a_file = self.prefix.endswith((".bin", ".idx"))
                hint = (f"name the prefix {self.prefix[:-4]}, without .bin or .idx" if given_a_file
                        else "tokenize data with python -m data_prep.tokenize")
                raise IndexedDatasetError(f"data file not found: {p} ({hint})")
        isize = os.path.getsize(ipath)
        if isize < HEADER_BYTES:
            raise IndexedDatasetError(f"{ipath}: truncated index ({isize} bytes, the header alone is {HEADER_BYTES})")
        with open(ipath, "rb") as f:
            head = f.read(HEADER_BYTES)
        if head[:9] != HEADER:
            raise IndexedDatasetError(f"{ipath}: not a Megatron MMapIndexedDataset index (bad magic {head[:9]!r})")
        (version,) = struct.unpack("<Q", head[9:17])
        if version != VERSION:
            raise IndexedDatasetError(f"{ipath}: unsupported index version {version} (expected {VERSION})")
        (code,) = struct.unpack("<B", head[17:18])
        if code not in DTYPE_CODES:
            raise IndexedDatasetError(f"{ipath}: unknown dtype code {code}")
        self.dtype = DTYPE_CODES[code]
        n, m = struct.unpack("<QQ", head[18:34])
        expected = HEADER_BYTES + 4 * n + 8 * n + 8 * m
        if isize != expected:
            what = "truncated" if isize < expected else "has trailing bytes (multimodal modes are not supported)"
            raise IndexedDatasetError(f"{ipath}: index {what}: {isize} bytes, header says {n} sequences and "
                                      f"{m} document entries = {expected} bytes")
        self._idx_map = np.memmap(ipath, mode="r", dtype=np.uint8)
        self.sizes = np.frombuffer(self._idx_map, dtype=np.int32, count=n, offset=HEADER_BYTES)
        self.pointers = np.frombuffer(self._idx_map, dtype=np.int64, count=n, offset=HEADER_BYTES + 4 * n)
        self.doc_idx = np.frombuffer(self._idx_map, dtype=np.int64, count=m, offset=HEADER_BYTES + 12 * n)
        self._validate(ipath, bpath)
        self._bin_map = np.memmap(bpath, mode="r", dtype=np.uint8) if self.num_tokens else np.zeros(0, np.uint8)

    def _validate(self, ipath: str, bpath: str) -> None:
        n = len(self.sizes)
        if n and int(self.sizes.min()) < 0:
            raise IndexedDatasetError(f"{ipath}: negative sequence size")
        item = self.dtype.itemsize
        self.num_tokens = int(self.sizes.sum(dtype=np.int64))
        if n:
            ends = np.cumsum(self.sizes, dtype=np.int64) * item
            if self.pointers[0] != 0 or not np.array_equal(self.pointers[1:], ends[:-1]):
                raise IndexedDatasetError(f"{ipath}: sequence pointers disagree with sizes (corrupt index)")
        bsize = os.path.getsize(bpath)
        if bsize != self.num_tokens * item:
            raise IndexedDatasetError(
                f"{bpath}: {bsize} bytes but {ipath} describes {self.num_tokens} tokens of {self.dtype} = "
                f"{self.num_tokens * item} bytes (truncated or mismatched .bin/.idx pair)")
        d = self.doc_idx  # GPTDataset does not use it; checked only for corruption (some writers omit the last end)
        if len(d) == 0 or d[0] != 0 or d[-1] > n or (len(d) > 1 and np.any(np.diff(d) < 0)):
            raise IndexedDatasetError(f"{ipath}: document index must rise from 0 to at most the sequence count {n}")

    def __getstate__(self) -> str:
        return self.prefix  # pickled by name (DataLoader workers reopen the maps, nothing is copied)

    def __setstate__(self, prefix: str) -> None:
        self.__init__(prefix)

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def tokens(self) -> np.ndarray:
        """Every token of the ``.bin``, back to back: a read-only memory-mapped [num_tokens] array of ``dtype``."""
        return np.frombuffer(self._bin_map, dtype=self.dtype, count=self.num_tokens)

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset + length)`` of sequence ``i`` (to its end when length is None)."""
        size = int(self.sizes[i])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"slice [{offset}, {offset + length}) outside sequence {i} of {size} tokens")
        start = int(self.pointers[i]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin_map, dtype=self.dtype, count=length, offset=start)

    def __getitem__(self, i: int) -> np.ndarray:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sequence {i} out of range for {len(self)} sequences in {self.prefix}")
        return self.get(int(i) % len(self))
