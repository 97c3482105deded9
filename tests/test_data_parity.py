"""GPT-NeoX's sample-count rules, written from its documented formulas (no GPT-NeoX code):

* blends: dataset i of a blend of N samples is built for ``ceil(N * w_i * 1.005)`` samples
  (``get_normalized_weights_and_num_samples``) and the blend holds the members' total length;
* validation: ``(train_iters // eval_interval + 1) * eval_iters * train_batch_size`` samples, read as
  one stream: evaluation k reads global batches ``[k * eval_iters, (k + 1) * eval_iters)`` (each
  ``gradient_accumulation_steps`` micro-batches per rank), modulo the set's whole global micro-batches;
* ``valid_data_weights`` weight the validation blend (equal weights when unset).
"""

import math

import numpy as np
import pytest
import torch
from test_data_datasets import SEQ, brute_force, write_docs, write_random

from neox_dar.config import load_config
from neox_dar.data import BlendedDataset, blend_sample_counts, build_datasets
from neox_dar.training.distributed import DistInfo
from neox_dar.training.validation import evaluation_micro_batches, validation_samples


def neox_counts(weights, n):
    """The documented rule: normalize the weights, then ceil(n * w * 1.005) samples each."""
    w = [x / sum(weights) for x in weights]
    return w, [int(math.ceil(n * x * 1.005)) for x in w]


def test_blend_sample_counts_are_gpt_neox_formula():
    assert blend_sample_counts([1.0, 1.0], 7600) == neox_counts([1, 1], 7600) == ([0.5, 0.5], [3819, 3819])
    assert blend_sample_counts([3.0, 7.0], 300) == neox_counts([3, 7], 300) == ([0.3, 0.7], [91, 212])
    assert blend_sample_counts([1.0], 100)[1] == [101]  # a lone dataset gets the 0.5% too
    assert blend_sample_counts([0.0, 1.0], 50)[1] == [0, 51]


def write_tokens(prefix, total, seed):
    """Random documents of 1..59 tokens holding exactly ``total`` tokens."""
    rng = np.random.default_rng(seed)
    ends = np.cumsum(rng.integers(1, 60, total))
    ends = np.append(ends[ends < total], total)
    return write_docs(prefix, np.split(rng.integers(1, 50277, total), ends[:-1]))


def test_half_half_blend_of_7600_uses_gpt_neox_counts_and_changes_the_first_samples(tmp_path):
    """Weights 0.5/0.5, N = 7600: each dataset is built for ceil(3800 * 1.005) = 3819 samples, not the old
    ceil(3800) + 1 = 3801. With 61,000 tokens per dataset and seq_length 16, 3801 samples fit in one epoch
    ((61000 - 1) // 16 = 3812) but 3819 need two, so every sample moves, blend samples 0 and 1 included."""
    a, b = write_tokens(tmp_path / "a", 61_000, seed=1), write_tokens(tmp_path / "b", 61_000, seed=2)
    cfg = load_config(overrides=[f"train_data_paths=[{tmp_path / 'a'}, {tmp_path / 'b'}]", f"seq_length={SEQ}"])
    train, _ = build_datasets(cfg, train_samples=7600, valid_samples=0)
    docs_a, docs_b = np.arange(len(a)), np.arange(len(b))
    want_a, epochs = brute_force(a, docs_a, 3819, SEQ, cfg.training.seed)
    want_b, _ = brute_force(b, docs_b, 3819, SEQ, cfg.training.seed)
    old_a, old_epochs = brute_force(a, docs_a, 3801, SEQ, cfg.training.seed)
    old_b, _ = brute_force(b, docs_b, 3801, SEQ, cfg.training.seed)
    assert (epochs, old_epochs) == (2, 1)
    assert list(train.dataset_index[:4]) == [0, 1, 0, 1]
    np.testing.assert_array_equal(train[0], want_a[0])
    np.testing.assert_array_equal(train[1], want_b[0])
    assert [d.num_samples for d in train.datasets] == [3819, 3819] and [d.num_epochs for d in train.datasets] == [2, 2]
    assert len(train) == len(want_a) - 1 + len(want_b) - 1  # GPT-NeoX: the members' total length
    np.testing.assert_array_equal(train[7599], [want_a, want_b][train.dataset_index[7599]][3799])
    assert not np.array_equal(want_a[0], old_a[0]) and not np.array_equal(want_b[0], old_b[0])  # the old rule's


def test_valid_data_weights_weight_the_validation_blend(tmp_path):
    write_random(tmp_path / "a", 60, seed=3)
    write_random(tmp_path / "b", 90, seed=4)
    paths = [f"train_data_paths=[{tmp_path / 'a'}]", f"valid_data_paths=[{tmp_path / 'a'}, {tmp_path / 'b'}]",
             f"seq_length={SEQ}"]
    _, valid = build_datasets(load_config(overrides=paths + ["valid_data_weights=[1, 3]"]), 10, 400)
    assert isinstance(valid, BlendedDataset) and list(valid.weights) == [0.25, 0.75]
    assert [d.num_samples for d in valid.datasets] == neox_counts([1, 3], 400)[1] == [101, 302]
    assert abs(np.mean(valid.dataset_index[:400] == 1) - 0.75) <= 1 / 400
    _, equal = build_datasets(load_config(overrides=paths), 10, 400)
    assert list(equal.weights) == [0.5, 0.5]  # GPT-NeoX's default, not token counts


class Indexed:
    """A dataset whose sample i is ``[i] * (SEQ + 1)``: batches show which samples they hold."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return np.full(SEQ + 1, i, dtype=np.int64)


def read(ds, cfg, world, evaluation):
    """Global sample indices evaluation ``evaluation`` reads, rank 0's micro-batch first, then rank 1's, ..."""
    per_rank = [[int(t[0]) for batch in evaluation_micro_batches(ds, cfg, DistInfo(r, world, r, torch.device("cpu")),
                                                               evaluation) for t in batch] for r in range(world)]
    micro = cfg.training.train_micro_batch_size_per_gpu
    steps = len(per_rank[0]) // micro
    return [i for s in range(steps) for r in range(world) for i in per_rank[r][s * micro:(s + 1) * micro]]


def test_validation_sample_count_is_gpt_neox_formula():
    cfg = load_config(overrides=["train_iters=143000", "eval_interval=1000", "eval_iters=10", "train_batch_size=1024",
                                 "train_micro_batch_size_per_gpu=16"])
    assert validation_samples(cfg, 8) == (143000 // 1000 + 1) * 10 * 1024 == 1_474_560
    cfg = load_config(overrides=["train_iters=6", "eval_interval=3", "eval_iters=2", "train_batch_size=8",
                                 "train_micro_batch_size_per_gpu=4"])
    assert validation_samples(cfg, 1) == validation_samples(cfg, 2) == 3 * 2 * 8
    assert validation_samples(load_config(overrides=["eval_interval=0"]), 1) == 0


@pytest.mark.parametrize("world, grad_accum", [(1, 2), (2, 1), (2, 3)])
def test_evaluations_read_the_validation_set_as_one_stream_of_global_batches(world, grad_accum):
    micro, eval_iters = 2, 3
    overrides = [f"train_micro_batch_size_per_gpu={micro}", f"gradient_accumulation_steps={grad_accum}",
                 f"eval_iters={eval_iters}", "eval_interval=5", "train_iters=20", "num_workers=0"]
    cfg = load_config(overrides=overrides)
    batch = micro * grad_accum * world  # train_batch_size
    n = validation_samples(cfg, world)
    assert n == 5 * eval_iters * batch
    ds = Indexed(n - 1)  # GPT-NeoX's len can be one short: the last global micro-batch is incomplete, dropped
    usable = (n - 1) // (micro * world) * (micro * world)
    stream = [i % usable for i in range(7 * eval_iters * batch)]
    for k in range(7):  # evaluations 0..6: each the next eval_iters * train_batch_size samples, wrapping at the end
        assert read(ds, cfg, world, k) == stream[k * eval_iters * batch:(k + 1) * eval_iters * batch], k
    fixed = load_config(overrides=[*overrides, "eval_mode=fixed"])
    assert read(ds, fixed, world, 0) == read(ds, fixed, world, 4) == list(range(eval_iters * batch))
