"""``build_datasets(cfg, train_samples, valid_samples, world_size)``: the training and validation datasets of a config.

GPT-NeoX's ``build_train_valid_test_data_loaders`` rules:

* ``data_path``: one dataset split into train/valid/test by ``split`` (document counts, see
  :func:`split_bounds`); a split part with no documents has no dataset (a validation share
  that rounds to zero documents gives no validation set, with a warning);
* ``train_data_paths`` + ``train_data_weights`` and ``valid_data_paths`` + ``valid_data_weights``
  (equal weights when unset): whole datasets blended; dataset i is asked for
  ``ceil(samples * w_i * 1.005)`` samples (:func:`blend_sample_counts`) and the blend holds the
  members' total length.

Every sample is ``int64[seq_length + 1]``; shuffling follows ``data_shuffle`` and ``seed``;
index maps are cached next to the data or in ``data_cache_path``.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from ..config import Config, ConfigError, split_shares
from .blended import BlendedDataset
from .conversations import ConversationDataset, open_pair
from .gpt_dataset import GPTDataset
from .indexed import IndexedDataset, IndexedDatasetError

log = logging.getLogger(__name__)


def split_bounds(split: str, num_docs: int) -> list[int]:
    """Document boundaries [4] of train/valid/test for ``split`` ("a,b,c", "a/b/c", "a,b" or "a") over ``num_docs``.

    GPT-NeoX's ``get_train_valid_test_split_``: missing shares are 0, each part gets
    round(fraction * num_docs) documents and the rounding error is taken from the end.
    """
    shares = split_shares(split)
    if shares is None:
        raise ValueError(f"malformed split {split!r}: expected up to three non-negative numbers 'train,valid,test'")
    total = sum(shares)
    bounds = [0]
    for p in shares:
        bounds.append(bounds[-1] + int(round(p / total * num_docs)))
    diff = bounds[-1] - num_docs
    return [bounds[0]] + [b - diff for b in bounds[1:]]


def blend_sample_counts(weights: list[float], num_samples: int) -> tuple[list[float], list[int]]:
    """GPT-NeoX's ``get_normalized_weights_and_num_samples``: the normalized weights and, for each
    dataset, ``ceil(num_samples * w * 1.005)`` samples to build (0.5% headroom for the interleaving)."""
    total = sum(weights)
    normalized = [w / total for w in weights]
    return normalized, [int(math.ceil(num_samples * w * 1.005)) for w in normalized]


def _gpt(name: str, indexed: IndexedDataset, docs: np.ndarray, samples: int, cfg: Config) -> GPTDataset:
    return GPTDataset(name, indexed, docs, samples, cfg.model.seq_length, cfg.training.seed,
                      shuffle=cfg.data.data_shuffle,
                      cache_dir=cfg.data.data_cache_path, fixed_length=cfg.data.data_fixed_length)


def _warn_if_wraps(name: str, ds, samples: int) -> None:
    wrap = getattr(ds, "first_wrap", None)
    if wrap is not None and wrap < samples:
        log.warning("%s data: sample %d onward of the %d needed reads past the end of a dataset and repeats its first "
                    "samples (GPT-NeoX does the same; only tiny datasets get here)", name, wrap, samples)


def _warn_if_cut(name: str, paths: list[str], seq_length: int) -> None:
    """A warning for chat data prepared with a ``--max-length`` above ``seq_length + 1`` (its manifest says): the
    loader cuts each conversation there, and one whose first assistant token lies beyond trains nothing (data_prep
    .chat at that length drops it, and counts it)."""
    from .check import manifest_of

    for path in paths:
        try:
            found = manifest_of(path)
        except IndexedDatasetError:  # not JSON: the start-up checks named it
            continue
        longest = found[1].get("max_length") if found else None
        if isinstance(longest, int) and longest > seq_length + 1:
            log.warning("%s data: %s was prepared with --max-length %d, longer than seq_length + 1 = %d: conversations "
                        "are cut to %d tokens, and those whose first assistant token lies beyond train nothing; "
                        "prepare it with python -m data_prep.chat ... --max-length %d (which drops those, counted "
                        "in its manifest)", name, path, longest, seq_length + 1, seq_length + 1, seq_length + 1)


def _blend(name: str, paths: list[str], weights: list[float] | None, samples: int, cfg: Config):
    """One dataset per path, each asked for its GPT-NeoX share of ``samples``, blended (a lone dataset as is)."""
    weights, counts = blend_sample_counts(weights or [1.0] * len(paths), samples)
    parts = []
    for path, count in zip(paths, counts):
        indexed = IndexedDataset(path)
        parts.append(_gpt(name, indexed, np.arange(len(indexed)), count, cfg))
    ds = parts[0] if len(parts) == 1 else BlendedDataset(parts, weights)
    _warn_if_wraps(name, ds, samples)
    return ds


def index_epochs(ds) -> list[int]:
    """The epochs each packed dataset under ``ds`` spans (GPT-NeoX's epoch rule), in order: its sample order is drawn
    for that many epochs, so another count (a longer ``train_iters`` that needs more data) is another order. Chat
    datasets add none (their epochs are drawn one after another: more of them leave the earlier ones' order)."""
    if isinstance(ds, GPTDataset):
        return [ds.num_epochs]
    if isinstance(ds, BlendedDataset):
        return [e for part in ds.datasets for e in index_epochs(part)]
    return []


def _at_least(ds, samples: int):
    """``ds``, or, when GPT-NeoX's counts leave it short of the ``samples`` training reads (tiny datasets only),
    ``ds`` read cyclically up to ``samples`` (GPT-NeoX's training iterator cycles too)."""
    if len(ds) >= samples:
        return ds
    cyclic = BlendedDataset([ds], [1.0], samples)
    _warn_if_wraps("train", cyclic, samples)
    return cyclic


def _conversations(cfg: Config, train_samples: int, valid_samples: int, world_size: int):
    """Chat SFT data (label paths set): :class:`ConversationDataset` over every train (and valid) pair, grouped by
    length in global batches (the same for any ``world_size`` that gives the config's ``train_batch_size``)."""
    group = cfg.training.global_batch_for(world_size)

    def build(name: str, paths: list[str], labels: list[str], samples: int) -> ConversationDataset:
        ds = ConversationDataset([open_pair(p, q) for p, q in zip(paths, labels)], samples, cfg.model.seq_length,
                                 cfg.training.seed, group, shuffle=cfg.data.data_shuffle)
        total = int(ds._offsets[-1])
        log.info("%s data: %d conversations, %d samples read (%.2f epochs)", name, total, samples, samples / total)
        _warn_if_cut(name, paths, cfg.model.seq_length)
        return ds

    d = cfg.data
    train = build("train", d.train_data_paths, d.train_label_data_paths, train_samples)
    valid = None
    if d.valid_data_paths and valid_samples > 0:
        valid = build("valid", d.valid_data_paths, d.valid_label_data_paths, valid_samples)
    return train, valid


def build_datasets(cfg: Config, train_samples: int, valid_samples: int, world_size: int = 1):
    """(train_ds, valid_ds or None); ``len(train_ds) >= train_samples``, ``ds[i]`` is ``int64[seq_length + 1]``
    (with label datasets: a conversation and its labels, :mod:`.conversations`).

    Validation data: ``valid_data_paths`` when set (with ``train_data_paths``, or beside ``data_path``, whose
    ``split`` must then give validation no share), else ``data_path``'s validation split. valid_ds is None when
    ``valid_samples`` is 0, when no validation data is configured, or when ``split`` gives validation no documents
    (a warning when its share is not 0).
    """
    if train_samples < 1:
        raise ValueError(f"train_samples must be >= 1, got {train_samples}")
    if cfg.data.train_label_data_paths:
        return _conversations(cfg, train_samples, valid_samples, world_size)
    if cfg.data.train_data_paths:
        train = _at_least(_blend("train", cfg.data.train_data_paths, cfg.data.train_data_weights, train_samples, cfg),
                          train_samples)
        valid = None
        if cfg.data.valid_data_paths and valid_samples > 0:
            valid = _blend("valid", cfg.data.valid_data_paths, cfg.data.valid_data_weights, valid_samples, cfg)
        return train, valid
    if not cfg.data.data_path:
        raise ConfigError("no training data: set 'data_path' (one dataset split by 'split') or 'train_data_paths'")
    indexed = IndexedDataset(cfg.data.data_path)
    b = split_bounds(cfg.data.split, len(indexed))
    train = _at_least(_gpt("train", indexed, np.arange(b[0], b[1]), train_samples, cfg), train_samples)
    valid = None
    if cfg.data.valid_data_paths:  # held-out files beside data_path (split then gives validation no share)
        if valid_samples > 0:
            valid = _blend("valid", cfg.data.valid_data_paths, cfg.data.valid_data_weights, valid_samples, cfg)
    elif valid_samples > 0 and b[2] > b[1]:
        valid = _gpt("valid", indexed, np.arange(b[1], b[2]), valid_samples, cfg)
    elif valid_samples > 0 and split_shares(cfg.data.split)[1] > 0:
        log.warning("split '%s' gives validation 0 of the %d documents in %s: no validation set (as in GPT-NeoX); "
                    "raise its share or use valid_data_paths", cfg.data.split, len(indexed), cfg.data.data_path)
    return train, valid
