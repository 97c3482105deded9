"""Crash-safe shard journal: ``PREFIX.shards/journal.jsonl``.

Line 1 is the run's plan (inputs, tokenizer, settings that decide the output); every later
line is one completed shard, appended (and fsynced) only after the shard's ``.bin``/``.idx``
are fully written and renamed into place. A restart with the same plan skips the journaled
shards, so a crash at any point loses at most the shards in flight and never duplicates one.
A different plan in an existing directory is an error rather than a silent mix.
"""

from __future__ import annotations

import json
import os

from .encode import shard_prefix


class JournalError(RuntimeError):
    """A shard directory that belongs to a different run."""


class Journal:
    def __init__(self, directory: str, plan: dict):
        self.directory, self.path = directory, os.path.join(directory, "journal.jsonl")
        self.done: dict[int, dict] = {}
        os.makedirs(directory, exist_ok=True)
        if os.path.isfile(self.path) and os.path.getsize(self.path) > 0:
            self._resume(plan)
        else:
            with open(self.path, "w") as f:
                f.write(json.dumps({"plan": plan}, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def _resume(self, plan: dict) -> None:
        with open(self.path) as f:
            lines = f.read().split("\n")
        try:
            old = json.loads(lines[0])["plan"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise JournalError(f"{self.path}: unreadable journal header; delete {self.directory} to start over") from None
        if old != plan:
            diff = sorted(k for k in set(old) | set(plan) if old.get(k) != plan.get(k))
            raise JournalError(f"{self.directory} holds shards of a different run (differs in: {', '.join(diff)}); "
                               "delete it or choose another --out")
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line being written when the process died
            prefix = shard_prefix(self.directory, entry["shard"])
            if os.path.isfile(prefix + ".idx") and os.path.isfile(prefix + ".bin") \
                    and os.path.getsize(prefix + ".bin") == entry["bin_bytes"]:
                self.done[entry["shard"]] = entry
        # rewrite without any torn last line so later appends start on a fresh line
        with open(self.path + ".tmp", "w") as f:
            f.write(json.dumps({"plan": plan}, sort_keys=True) + "\n")
            for sid in sorted(self.done):
                f.write(json.dumps(self.done[sid], sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(self.path + ".tmp", self.path)

    def append(self, entry: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.done[entry["shard"]] = entry
