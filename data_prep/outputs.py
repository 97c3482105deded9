"""The outputs of a tokenize run (:mod:`data_prep.tokenize`): the journaled shards merged, in order, into staged
``.bin/.idx`` files, each output's manifest entry, and the renames into place (the manifest first, the training
file's ``.idx`` last).
"""

from __future__ import annotations

import json
import os

import numpy as np

from neox_dar.data.identity import sha256_file
from neox_dar.data.indexed import IndexedDataset, IndexedDatasetWriter, bin_path, idx_path
from neox_dar.rundir import check_writable, fault_point, uninterrupted

from .budget import Budget, Segment
from .journal import shard_prefix


def make_out_dir(prefix: str) -> None:
    """Create the directory of an output ``PREFIX`` (whose files are ``PREFIX.bin``, ``PREFIX.idx``, ...). ValueError
    (one line) for a prefix that names a directory (``DIR/`` would write hidden ``DIR/.bin``, ``DIR/.idx``) or that
    lies under a file."""
    if prefix.endswith(("/", os.sep)) or os.path.isdir(prefix):
        raise ValueError(f"--out {prefix} names a directory, not a prefix of files: e.g. --out "
                         f"{os.path.join(prefix, 'data')} writes data.bin, data.idx, ... in it")
    check_writable(prefix, "--out")  # the nearest existing folder above: a folder, writable
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)


def merge_shards(directory: str, plan: list[tuple[int, list[Segment]]], prefixes: list[str], dtype: np.dtype) -> None:
    """Copy each segment of the plan's shards, in order, to its output ``prefixes[output].bin/.idx``."""
    writers = [IndexedDatasetWriter(f"{prefix}.tmp", dtype) for prefix in prefixes]
    for sid, segments in plan:
        shard = IndexedDataset(shard_prefix(directory, sid))
        starts = np.concatenate([[0], np.cumsum(shard.sizes, dtype=np.int64)])
        for out, first, sizes in segments:
            begin = int(starts[first])
            writers[out].add_documents(shard.tokens[begin:begin + int(sizes.sum())], sizes)
    for writer, prefix in zip(writers, prefixes):
        writer.finalize()
        os.replace(bin_path(writer.prefix), bin_path(prefix))
        os.replace(idx_path(writer.prefix), idx_path(prefix))


def output_entry(staged: str, prefix: str, budget: Budget, i: int) -> dict:
    """The manifest's entry of output ``i``: written at ``staged``, to be renamed to ``prefix``."""
    ds = IndexedDataset(staged)
    return {"prefix": os.path.abspath(prefix), "bin_sha256": sha256_file(bin_path(staged)),
            "idx_sha256": sha256_file(idx_path(staged)), "documents": len(ds), "tokens": ds.num_tokens,
            "truncated_last_document": budget.truncated[i]}


def replace_outputs(staged: list[str], prefixes: list[str], manifest: str, out: str) -> list[str]:
    """Rename the staged outputs into place, the manifest ``PREFIX.manifest.json`` first and the training file's
    ``.idx`` (the last of ``prefixes``) last, so that until the set is complete the manifest describes another
    ``PREFIX.idx`` than the one there; Ctrl-C waits for the last rename (:func:`~neox_dar.rundir.uninterrupted`).

    When the new set has no held-out file but the output it replaces had one (``PREFIX_valid.bin/.idx``, recorded
    in the old manifest), those two files are removed last: left in place, ``valid_data_paths: [PREFIX_valid]``
    would pair the new training file with the old inputs' validation. Returns the removed paths."""
    stale = _stale_valid(out, prefixes)
    with uninterrupted():
        os.replace(manifest, f"{out}.manifest.json")
        fault_point("data-replacing")
        for stage, prefix in zip(staged, prefixes):
            os.replace(bin_path(stage), bin_path(prefix))
            os.replace(idx_path(stage), idx_path(prefix))
        for path in stale:
            os.remove(path)
    return stale


def _stale_valid(out: str, prefixes: list[str]) -> list[str]:
    """The ``PREFIX_valid.bin/.idx`` files the existing manifest of ``out`` records as its held-out output, when
    the new outputs ``prefixes`` have none (a file of that name no manifest describes is left alone)."""
    valid = f"{out}_valid"
    if valid in prefixes:
        return []
    try:
        with open(f"{out}.manifest.json") as f:
            entry = json.load(f).get("valid")
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(entry, dict) or entry.get("prefix") != os.path.abspath(valid):
        return []
    return [p for p in (bin_path(valid), idx_path(valid)) if os.path.isfile(p)]
