"""What identifies the data a run trains on: recorded in every checkpoint (``state.json``'s ``data``) and compared
when the run resumes, so data replaced between a stop and a resume is noticed, never trained on silently.

A prefix's identity is the size of its ``.bin``, the sha256 of its ``.idx`` (every document's length: another
corpus or tokenizer changes it) and, when ``data_prep.tokenize`` wrote ``PREFIX.manifest.json`` beside it, the
manifest's tokenizer sha256. A manifest whose ``idx_sha256`` is not the ``.idx`` there (a tokenize run killed while
it renamed a new set into place) makes the prefix unusable until that run completes.
"""

from __future__ import annotations

import hashlib
import json
import os

from ..config import Config
from .indexed import IndexedDatasetError, bin_path, idx_path

# the data keys whose prefixes a run reads, in the order their identities are recorded
DATA_KEYS = ("data_path", "train_data_paths", "valid_data_paths", "train_label_data_paths", "valid_label_data_paths")
COMPARED = ("bin_bytes", "idx_sha256", "tokenizer_sha256")


def sha256_file(path: str, chunk: int = 1 << 22) -> str:
    """sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def prefix_identity(prefix: str) -> dict:
    """``{"prefix", "bin_bytes", "idx_sha256", "tokenizer_sha256"}`` of one ``.bin/.idx`` pair (the tokenizer's: from
    its manifest, None without one); IndexedDatasetError when its manifest describes another ``.idx``."""
    try:
        idx_sha = sha256_file(idx_path(prefix))
        bin_bytes = os.path.getsize(bin_path(prefix))
    except OSError as e:
        raise IndexedDatasetError(f"cannot read {prefix}: {e.strerror or e}") from None
    manifest_path = f"{prefix}.manifest.json"
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        manifest = {}
    except (OSError, ValueError) as e:
        raise IndexedDatasetError(f"{manifest_path}: not a readable manifest ({e})") from None
    if manifest.get("idx_sha256") not in (None, idx_sha):
        raise IndexedDatasetError(
            f"{idx_path(prefix)} is not the file {manifest_path} describes (its sha256 differs): a data_prep run was "
            "cut short while it replaced them, or the files were replaced by hand; run that data_prep command again "
            "(or delete the manifest if these files are the ones you mean)")
    return {"prefix": prefix, "bin_bytes": bin_bytes, "idx_sha256": idx_sha,
            "tokenizer_sha256": (manifest.get("tokenizer") or {}).get("sha256")}


def data_identity(cfg: Config) -> dict[str, list[dict]]:
    """``{data key: [prefix identity, ...]}`` for every data key of :data:`DATA_KEYS` the config sets."""
    out = {}
    for key in DATA_KEYS:
        value = getattr(cfg.data, key)
        if value:
            out[key] = [prefix_identity(p) for p in ([value] if isinstance(value, str) else value)]
    return out


def data_change(recorded: dict | None, now: dict[str, list[dict]]) -> str | None:
    """How the data ``now`` differ from the data a checkpoint ``recorded`` (None: the same, or a checkpoint that
    records none)."""
    if recorded is None:
        return None
    for key in [k for k in DATA_KEYS if k in recorded or k in now]:
        old, new = recorded.get(key, []), now.get(key, [])
        if len(old) != len(new):
            return f"{key} names {len(new)} dataset(s), the checkpoint was trained on {len(old)}"
        for a, b in zip(old, new):
            differ = [field for field in COMPARED if a.get(field) != b.get(field)]
            if differ:
                return (f"{b['prefix']} is not the data the checkpoint was trained on ({a['prefix']}; "
                        f"{', '.join(differ)} differ)")
    return None
