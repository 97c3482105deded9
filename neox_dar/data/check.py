"""Start-up checks of the data files a config names: ``check_data_files(cfg)``, before any model is built, and the
command that runs them on prefixes a user names::

    python -m neox_dar.data.check PREFIX [PREFIX ...] [CONFIG.yml ...] [key=value ...] [--weights W ...]

The command checks each prefix as ``train.py`` and ``sweep plan`` do (below) for the config the files and
``key=value`` words give (none: the default config, the Pythia tokenizer's ``vocab_size``), with the prefixes as the
training data (``train_data_paths``, a blend when there are several, weighted by ``--weights``); without prefixes it
checks the data the config names. Per prefix it prints documents, tokens, dtype and the token-id range, and the
manifest ``data_prep.tokenize`` wrote beside it when there is one (its tokenizer, against the config's
``vocab_file``; its counts, against the files). A bad prefix or config is one line (``data.check: error: ...``,
exit 2). The epochs a token budget reads are the plan's (``python -m neox_dar.sweep SWEEP plan``).

For each ``.bin/.idx`` prefix (``data_path``, or ``train_data_paths`` + ``valid_data_paths``):

* the pair opens as an :class:`IndexedDataset` (magic, version, dtype code, index size, pointers
  against sizes, ``.bin`` size against the index) and holds tokens of an integer dtype;
* the directory the index maps go to (``data_cache_path`` or the data's own) is writable;
* with ``data_fixed_length: true``, every document holds ``seq_length + 1`` tokens;
* a label dataset (``train_label_data_paths``, ``valid_label_data_paths``) describes the same conversations as its
  token dataset, in a signed dtype;
* token ids lie in ``[0, vocab_size)`` (``data_token_check``): ``full`` scans the whole ``.bin``
  (chunked min/max over the memory map, a progress bar after 2 s) and caches the result in
  ``{prefix}_token_range.json`` next to the index maps, keyed by the sizes and mtimes of both
  files, so later runs read it back; ``sample`` scans 64 evenly spaced windows of 1M tokens
  (not cached); ``skip`` skips the scan.

A negative id is the sign of a wrong dtype (uint16 tokens declared int16); an id >= vocab_size
of a different tokenizer. Every problem is an :class:`IndexedDatasetError` with one line naming
the file and, for a token id, its sequence and position.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..config import Config, ConfigError, load_config, split_args
from ..progress import progress_bar
from .conversations import open_pair
from .gpt_dataset import file_lock
from .indexed import IndexedDataset, IndexedDatasetError
from ..notices import one_line_notices

CHUNK_TOKENS = 1 << 22  # 8 MiB of uint16 per min/max pass: stays in cache between the two passes
SAMPLE_WINDOWS, WINDOW_TOKENS = 64, 1 << 20


@dataclass
class TokenRange:
    """Smallest and largest token id of a ``.bin`` and the token positions where each first occurs."""

    min: int
    argmin: int
    max: int
    argmax: int
    scan: str  # "full" or "sample"


def data_prefixes(cfg: Config) -> list[str]:
    """The prefixes :func:`~neox_dar.data.build_datasets` reads, each once, in order."""
    d = cfg.data
    paths = [*d.train_data_paths, *(d.valid_data_paths or [])] if d.train_data_paths else [d.data_path]
    return list(dict.fromkeys(p for p in paths if p))


def _windows(num_tokens: int, scan: str) -> list[tuple[int, int]]:
    """Token ranges [start, stop) to scan: the whole file, or evenly spaced windows covering both ends."""
    if scan == "full" or num_tokens <= SAMPLE_WINDOWS * WINDOW_TOKENS:
        return [(0, num_tokens)]
    starts = np.linspace(0, num_tokens - WINDOW_TOKENS, SAMPLE_WINDOWS).astype(np.int64)
    return [(int(s), int(s) + WINDOW_TOKENS) for s in starts]


def scan_token_range(ds: IndexedDataset, scan: str = "full", progress: bool = True) -> TokenRange:
    """Min and max token id of ``ds`` (and where they first occur) over the whole file or a sample."""
    tokens = ds.tokens
    windows = _windows(len(tokens), scan)
    found = TokenRange(np.iinfo(np.int64).max, -1, np.iinfo(np.int64).min, -1,
                       "full" if windows == [(0, len(tokens))] else "sample")
    with progress_bar(total=sum(b - a for a, b in windows), unit="tok", unit_scale=True, delay=2.0, disable=not progress,
              desc=f"checking token ids of {ds.prefix}.bin") as bar:
        for start, stop in windows:
            for a in range(start, stop, CHUNK_TOKENS):
                chunk = tokens[a:min(a + CHUNK_TOKENS, stop)]
                i, j = int(chunk.argmin()), int(chunk.argmax())
                if chunk[i] < found.min:
                    found.min, found.argmin = int(chunk[i]), a + i
                if chunk[j] > found.max:
                    found.max, found.argmax = int(chunk[j]), a + j
                bar.update(len(chunk))
    return found


def _file_key(ds: IndexedDataset) -> dict:
    out = {"dtype": str(ds.dtype)}
    for ext in ("bin", "idx"):
        st = os.stat(f"{ds.prefix}.{ext}")
        out[f"{ext}_bytes"], out[f"{ext}_mtime_ns"] = st.st_size, st.st_mtime_ns
    return out


def token_range(ds: IndexedDataset, scan: str, cache_dir: str, progress: bool = True) -> TokenRange:
    """:func:`scan_token_range`, with full scans cached in ``cache_dir`` (one scanner at a time, under a lock)."""
    cache = os.path.join(cache_dir, os.path.basename(ds.prefix) + "_token_range.json")
    key = _file_key(ds)

    def cached() -> TokenRange | None:
        try:
            with open(cache) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            return None
        if saved.get("key") != key:
            return None
        return TokenRange(**saved["range"])

    found = cached()
    if found is not None or scan != "full":
        return found or scan_token_range(ds, scan, progress)
    with file_lock(cache + ".lock"):
        found = cached()  # another process may have scanned while this one waited
        if found is None:
            found = scan_token_range(ds, scan, progress)
            tmp = f"{cache}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({"key": key, "range": asdict(found)}, f)
            os.replace(tmp, cache)
    return found


def _where(ds: IndexedDataset, position: int) -> str:
    """'sequence i, token k' of the flat token ``position``."""
    seq = int(np.searchsorted(ds.pointers, position * ds.dtype.itemsize, side="right")) - 1
    return f"sequence {seq}, token {position - int(ds.pointers[seq]) // ds.dtype.itemsize}"


def check_data_file(prefix: str, cfg: Config, progress: bool = True) -> TokenRange | None:
    """Check one ``.bin/.idx`` pair for training with ``cfg``; raises :class:`IndexedDatasetError`. Returns the
    token-id range the check found (None with ``data_token_check: skip``)."""
    ds = IndexedDataset(prefix)
    if ds.dtype.kind not in "iu":
        raise IndexedDatasetError(f"{prefix}.idx: token dtype {ds.dtype} is not an integer type (token ids are)")
    if ds.num_tokens == 0:
        raise IndexedDatasetError(f"{prefix}.bin holds no tokens")
    cache_dir = cfg.data.data_cache_path or os.path.dirname(os.path.abspath(prefix))
    try:
        os.makedirs(cache_dir, exist_ok=True)
    except OSError as e:
        raise IndexedDatasetError(f"cannot create the index-map directory {cache_dir}: {e.strerror}") from None
    if not os.access(cache_dir, os.W_OK):
        raise IndexedDatasetError(f"index maps of {prefix} go to {cache_dir}, which is not writable: "
                                  f"set data_cache_path to a writable directory")
    if cfg.data.data_fixed_length:
        wrong = np.flatnonzero(ds.sizes != cfg.model.seq_length + 1)
        if wrong.size:
            raise IndexedDatasetError(f"{prefix}.idx: data_fixed_length is true but {wrong.size} of {len(ds)} "
                                      f"sequences do not hold seq_length + 1 = {cfg.model.seq_length + 1} tokens "
                                      f"(sequence {int(wrong[0])}: {int(ds.sizes[wrong[0]])})")
    if cfg.data.data_token_check == "skip":
        return None
    found = token_range(ds, cfg.data.data_token_check, cache_dir, progress)
    seen = "" if found.scan == "full" else " (in a sample; data_token_check=full scans everything)"
    if found.min < 0:
        raise IndexedDatasetError(f"{prefix}.bin: negative token id {found.min} at {_where(ds, found.argmin)}{seen}: "
                                  f"the .idx declares {ds.dtype}; was the file written with another dtype "
                                  f"(e.g. uint16 tokens declared int16)?")
    if found.max >= cfg.model.vocab_size:
        raise IndexedDatasetError(f"{prefix}.bin: token id {found.max} at {_where(ds, found.argmax)} is >= vocab_size "
                                  f"{cfg.model.vocab_size}{seen}: tokenized with another tokenizer, or vocab_size is "
                                  "wrong")
    return found


def check_data_files(cfg: Config, progress: bool = True) -> dict[str, TokenRange | None]:
    """:func:`check_data_file` for every prefix the config reads, and each label dataset against its token
    dataset (:func:`~neox_dar.data.conversations.open_pair`: same conversations, signed dtype). Returns each
    prefix's token-id range."""
    found = {prefix: check_data_file(prefix, cfg, progress) for prefix in data_prefixes(cfg)}
    d = cfg.data
    for paths, labels in ((d.train_data_paths, d.train_label_data_paths), (d.valid_data_paths, d.valid_label_data_paths)):
        for prefix, label in zip(paths or (), labels or ()):
            open_pair(prefix, label)
    return found


# ---------------------------------------------------------------------------------------------------------------
# the command



def manifest_of(prefix: str) -> tuple[str, dict] | None:
    """The manifest ``data_prep.tokenize`` wrote for ``prefix``: its path and the entry of this file (documents,
    tokens) with the manifest's ``tokenizer``; ``PREFIX_valid`` is the held-out file of ``PREFIX``'s manifest. None
    when there is none; IndexedDatasetError when it is not JSON."""
    candidates = [(f"{prefix}.manifest.json", None)]
    if prefix.endswith("_valid"):
        candidates.append((f"{prefix.removesuffix('_valid')}.manifest.json", "valid"))
    for path, part in candidates:
        try:
            with open(path) as f:
                manifest = json.load(f)
        except OSError:
            continue
        except ValueError as e:
            raise IndexedDatasetError(f"{path}: not a JSON manifest ({e})") from None
        entry = manifest.get(part) if part else manifest
        if isinstance(entry, dict):
            return path, {**entry, "tokenizer": manifest.get("tokenizer") or {}}
    return None


def describe_prefix(prefix: str, cfg: Config, found: TokenRange | None) -> tuple[list[str], list[str]]:
    """What the command prints for a checked prefix: (lines, warnings). Warnings: the manifest's counts differ from
    the files (replaced after tokenizing), or its tokenizer is not the config's ``vocab_file`` (by sha256)."""
    ds = IndexedDataset(prefix)
    ids = ("token ids not scanned (data_token_check: skip)" if found is None else
           f"token ids {found.min}..{found.max} < vocab_size {cfg.model.vocab_size} ({found.scan} scan)")
    lines = [f"{prefix}: ok: {len(ds):,} documents, {ds.num_tokens:,} tokens, {ds.dtype}, {ids}"]
    warns = []
    manifest = manifest_of(prefix)
    if manifest is None:
        return lines + ["  no manifest (not written by python -m data_prep.tokenize)"], warns
    path, entry = manifest
    tok = entry["tokenizer"]
    # data_prep.tokenize counts documents; data_prep.chat counts conversations, one document each
    documents = entry.get("documents", (entry.get("conversations") or {}).get("written"))
    kind = f"{tok['kind']}, " if tok.get("kind") else ""
    lines.append(f"  manifest {path}: tokenizer {tok.get('path')} ({kind}vocabulary "
                 f"{tok.get('vocab_size')}, sha256 {str(tok.get('sha256'))[:12]}), written with "
                 f"{documents or 0:,} documents, {entry.get('tokens', 0):,} tokens")
    if (documents, entry.get("tokens")) != (len(ds), ds.num_tokens):
        warns.append(f"{prefix}: the manifest says {documents} documents and {entry.get('tokens')} "
                     f"tokens, the files hold {len(ds)} and {ds.num_tokens}: they were replaced after tokenizing")
    if other := other_tokenizer(prefix, cfg, tok):
        warns.append(other)
    return lines, warns


def other_tokenizer(prefix: str, cfg: Config, tok: dict | None = None) -> str | None:
    """A warning when ``prefix``'s manifest names another tokenizer (by sha256) than the config's ``vocab_file``
    (``tok``: the manifest's ``tokenizer`` entry, read here when None); None when they agree or either is unknown."""
    from ..tokenizer import TokenizerError, config_vocab_file

    try:
        vocab_file = config_vocab_file(cfg.model)
    except TokenizerError:
        return None  # train.py reports a missing vocab_file; here only a present one is compared
    if vocab_file is None:
        return None
    return tokenized_with_other(prefix, vocab_file, "the config's vocab_file", tok)


def tokenized_with_other(prefix: str, tokenizer: str | Path, whose: str, tok: dict | None = None) -> str | None:
    """A warning when ``prefix``'s manifest names another tokenizer (by sha256) than the file ``tokenizer``
    (``whose``: what it is, for the warning; ``tok``: the manifest's ``tokenizer`` entry, read here when None); None
    when they agree or the manifest names none."""
    from ..tokenizer import tokenizer_sha256

    if tok is None:
        manifest = manifest_of(prefix)
        tok = manifest[1]["tokenizer"] if manifest else {}
    if not tok.get("sha256"):
        return None
    ours = tokenizer_sha256(tokenizer)
    if ours == tok["sha256"]:
        return None
    return (f"{prefix} was tokenized with {tok.get('path')} (sha256 {tok['sha256'][:12]}), not {whose} "
            f"{tokenizer} (sha256 {ours[:12]})")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m neox_dar.data.check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("words", nargs="*", metavar="PREFIX|CONFIG.yml|KEY=VALUE",
                   help="data prefixes (PREFIX.bin/.idx), config files (.yml, .yaml) and key=value overrides, in any "
                        "order")
    p.add_argument("--weights", type=float, nargs="+", help="blend weights of the prefixes (train_data_weights)")
    return p


def main(argv: list[str] | None = None) -> int:
    one_line_notices()  # this package's warnings as `warning: ...`, one line
    args = build_parser().parse_args(argv)
    paths, overrides = split_args(args.words)
    configs = [w for w in paths if w.endswith((".yml", ".yaml"))]
    prefixes = [w for w in paths if w not in configs]
    if prefixes:
        overrides += ["data_path=null", f"train_data_paths={json.dumps(prefixes)}"]
        if args.weights is not None:
            overrides.append(f"train_data_weights={json.dumps(args.weights)}")
    try:
        if args.weights is not None and len(args.weights) != len(prefixes):
            raise ConfigError(f"--weights gives {len(args.weights)} weight(s) for {len(prefixes)} prefix(es)")
        cfg = load_config(*configs, overrides=overrides)
        if not data_prefixes(cfg):
            raise ConfigError("no data to check: name a PREFIX, or a config with data_path or train_data_paths")
        found = check_data_files(cfg)
        for prefix, token_range in found.items():
            lines, warns = describe_prefix(prefix, cfg, token_range)
            print("\n".join(lines))
            for w in warns:
                print(f"warning: {w}", file=sys.stderr)
    except (ConfigError, IndexedDatasetError) as e:
        print(f"data.check: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
