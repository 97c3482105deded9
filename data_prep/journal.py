"""Crash-safe shard store of one run: ``PREFIX.shards/`` with its journal ``journal.jsonl``.

Line 1 of the journal is the run's plan (inputs, tokenizer, settings that decide the shards);
every later line is one completed shard, appended (and fsynced) only after the shard's
``shard_NNNNNNN.bin``/``.idx`` are fully written and renamed into place. A restart with the same
plan skips the journaled shards, so a crash at any point loses at most the shards in flight and
never duplicates one. Shards left by a run with a different plan (other inputs or settings, or a
journal whose first line was torn) are stale: they are removed and :attr:`Journal.discarded`
says why. The directory is ``flock``-ed while a run uses it, so two runs never share it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re

import numpy as np

from neox_dar.data.indexed import IndexedDataset, IndexedDatasetWriter, bin_path, idx_path

OWN_FILE = re.compile(r"journal\.jsonl(\.tmp)?|(shard_\d{7}|output_\d)(\.tmp)?\.(bin|idx)"
                      r"|(\.tmp-)?manifest\.json(\.\d+)?")
MANIFEST = "manifest.json"  # the outputs' manifest, written here before they are renamed into place


class JournalError(RuntimeError):
    """A shard directory this run cannot use (in use, or holding files that are not ours)."""


def shard_prefix(directory: str, shard_id: int) -> str:
    return os.path.join(directory, f"shard_{shard_id:07d}")


def shard_output(directory: str, output: int) -> str:
    """The prefix output ``output`` (0: the validation file when there is one) is merged to, before it is renamed
    into place."""
    return os.path.join(directory, f"output_{output}")


def _fsync_write(path: str, lines: list[dict]) -> None:
    with open(path, "w") as f:
        f.write("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())


class Journal:
    def __init__(self, directory: str, plan: dict):
        self.directory, self.path = directory, os.path.join(directory, "journal.jsonl")
        self.done: dict[int, dict] = {}
        self.discarded: str | None = None  # why shards found in the directory were removed
        os.makedirs(directory, exist_ok=True)
        self._lock = os.open(directory, os.O_RDONLY)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise JournalError(f"{directory} is in use by another data_prep.tokenize run with the same --out") from None
        names = os.listdir(directory)
        foreign = sorted(n for n in names if not OWN_FILE.fullmatch(n))
        if foreign:
            self.close()
            raise JournalError(f"{directory} holds files data_prep.tokenize did not write ({', '.join(foreign[:3])}); "
                               "remove it or choose another --out")
        lines = self._read()
        old = lines[0].get("plan") if lines and isinstance(lines[0], dict) else None
        if old == plan:
            self._resume(lines[1:])
        else:
            if old is not None:
                diff = sorted(k for k in set(old) | set(plan) if old.get(k) != plan.get(k))
                self.discarded = f"shards of a different run (differs in: {', '.join(diff)})"
            elif names:
                self.discarded = "shards of a run whose journal header is unreadable"
            for name in names:
                os.remove(os.path.join(directory, name))
        # rewrite without a torn last line, so later appends start on a fresh line
        _fsync_write(self.path + ".tmp", [{"plan": plan}, *(self.done[s] for s in sorted(self.done))])
        os.replace(self.path + ".tmp", self.path)

    def _read(self) -> list:
        """The journal's lines as JSON; a line that does not parse (torn by a crash) ends the list."""
        if not os.path.isfile(self.path):
            return []
        out = []
        with open(self.path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    break
        return out

    def _resume(self, entries: list[dict]) -> None:
        for entry in entries:
            prefix = shard_prefix(self.directory, entry["shard"])
            if os.path.isfile(idx_path(prefix)) and os.path.isfile(bin_path(prefix)) \
                    and os.path.getsize(bin_path(prefix)) == entry["bin_bytes"]:
                self.done[entry["shard"]] = entry

    def write_shard(self, shard_id: int, parts: list[dict], dtype: np.dtype) -> tuple[dict, np.ndarray]:
        """Write a shard from its pieces' results (in order), then journal it; returns (entry, sizes [D])."""
        prefix = shard_prefix(self.directory, shard_id)
        writer = IndexedDatasetWriter(prefix + ".tmp", dtype)
        for part in parts:
            writer.add_documents(part["tokens"], part["sizes"])
        writer.finalize()
        os.replace(idx_path(prefix + ".tmp"), idx_path(prefix))
        os.replace(bin_path(prefix + ".tmp"), bin_path(prefix))
        sizes = np.concatenate([p["sizes"] for p in parts])
        tokens = int(sizes.sum())
        entry = {"shard": shard_id, "records": sum(p["records"] for p in parts), "docs": len(sizes),
                 "tokens": tokens, "bin_bytes": tokens * dtype.itemsize, "bad": [b for p in parts for b in p["bad"]]}
        with open(self.path, "a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.done[shard_id] = entry
        return entry, sizes

    def sizes(self, shard_id: int) -> np.ndarray:
        """Tokens per document [D] of a written shard."""
        return IndexedDataset(shard_prefix(self.directory, shard_id)).sizes.astype(np.int64)

    def close(self) -> None:
        """Release the directory (it stays on disk)."""
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1
