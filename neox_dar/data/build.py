"""``build_datasets(cfg, train_samples, valid_samples)``: the training and validation datasets of a config.

* ``data_path``: one dataset split into train/valid/test by ``split`` (GPT-NeoX's rule on
  document counts, see :func:`split_bounds`);
* ``train_data_paths`` (+ ``train_data_weights``, equal weights when unset) and
  ``valid_data_paths``: whole datasets blended (validation datasets weighted by their
  token counts).

Every sample is ``int64[seq_length + 1]``; shuffling follows ``data_shuffle`` and ``seed``;
index maps are cached next to the data or in ``data_cache_path``.
"""

from __future__ import annotations

import math

import numpy as np

from ..config import Config, ConfigError
from .blended import BlendedDataset
from .gpt_dataset import DataSplitError, GPTDataset
from .indexed import IndexedDataset


def split_bounds(split: str, num_docs: int) -> list[int]:
    """Document boundaries [4] of train/valid/test for ``split`` "a,b,c" over ``num_docs`` documents.

    GPT-NeoX's ``get_train_valid_test_split_``: each part gets round(fraction * num_docs)
    documents and the rounding error is taken from the end.
    """
    parts = [float(s) for s in split.replace("/", ",").split(",")]
    parts = (parts + [0.0, 0.0, 0.0])[:3]
    total = sum(parts)
    bounds = [0]
    for p in parts:
        bounds.append(bounds[-1] + int(round(p / total * num_docs)))
    diff = bounds[-1] - num_docs
    return [bounds[0]] + [b - diff for b in bounds[1:]]


def _gpt(name: str, indexed: IndexedDataset, docs: np.ndarray, samples: int, cfg: Config) -> GPTDataset:
    return GPTDataset(name, indexed, docs, samples, cfg.seq_length, cfg.seed, shuffle=cfg.data_shuffle,
                      cache_dir=cfg.data_cache_path)


def _blend(name: str, paths: list[str], weights: list[float] | None, samples: int, cfg: Config):
    stores = [IndexedDataset(p) for p in paths]
    if weights is None:
        weights = [s.num_tokens for s in stores] if name != "train" else [1.0] * len(stores)
    w = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    if len(stores) == 1:
        return _gpt(name, stores[0], np.arange(len(stores[0])), samples, cfg)
    parts = [_gpt(name, s, np.arange(len(s)), math.ceil(wi * samples) + 1, cfg) for s, wi in zip(stores, w)]
    return BlendedDataset(parts, list(w), samples)


def build_datasets(cfg: Config, train_samples: int, valid_samples: int):
    """(train_ds, valid_ds or None); ``len(train_ds) >= train_samples``, ``ds[i]`` is ``int64[seq_length + 1]``.

    valid_ds is None when ``valid_samples`` is 0, when no validation data is configured, or
    when ``split`` gives validation a zero share. A share that rounds to zero documents is a
    :class:`DataSplitError` (never an endless loop).
    """
    if train_samples < 1:
        raise ValueError(f"train_samples must be >= 1, got {train_samples}")
    if cfg.train_data_paths:
        train = _blend("train", cfg.train_data_paths, cfg.train_data_weights, train_samples, cfg)
        valid = None
        if cfg.valid_data_paths and valid_samples > 0:
            valid = _blend("valid", cfg.valid_data_paths, None, valid_samples, cfg)
        return train, valid
    if not cfg.data_path:
        raise ConfigError("no training data: set 'data_path' (one dataset split by 'split') or 'train_data_paths'")
    indexed = IndexedDataset(cfg.data_path)
    b = split_bounds(cfg.split, len(indexed))
    shares = [float(s) for s in cfg.split.replace("/", ",").split(",")]
    train = _gpt("train", indexed, np.arange(b[0], b[1]), train_samples, cfg)
    valid = None
    if valid_samples > 0 and shares[1] > 0:
        if b[2] == b[1]:
            raise DataSplitError(f"split '{cfg.split}' gives validation 0 of the {len(indexed)} documents in "
                                 f"{cfg.data_path}; raise its share, set it to 0, or use valid_data_paths")
        valid = _gpt("valid", indexed, np.arange(b[1], b[2]), valid_samples, cfg)
    return train, valid
