"""GPT-NeoX sample packing, index-map cache, Pythia's fixed sequences, blends, split guard, sampler."""

import threading

import numpy as np
import pytest

from neox_dar.config import load_config
from neox_dar.data import (BlendedDataset, DataParallelSampler, DataSplitError, GPTDataset, IndexedDataset,
                           IndexedDatasetWriter, build_datasets, split_bounds)

SEQ = 16


def write_random(prefix, n_docs, seed, max_len=40, vocab=50277, zero_docs=()):
    rng = np.random.default_rng(seed)
    w = IndexedDatasetWriter(prefix, np.uint16)
    for i in range(n_docs):
        w.add_document(np.zeros(0, np.int64) if i in zero_docs else rng.integers(1, vocab, int(rng.integers(1, max_len))))
    w.finalize()
    return IndexedDataset(prefix)


def brute_force(indexed, documents, num_samples, seq_length, seed, shuffle):
    """Samples by concatenating the (shuffled) epochs' documents and slicing, GPT-NeoX's definition."""
    tokens_per_epoch = int(indexed.sizes[documents].sum())
    epochs = 1
    while (epochs * tokens_per_epoch - 1) // seq_length < num_samples:
        epochs += 1
    rng = np.random.RandomState(seed)
    doc_idx = np.tile(documents, epochs)
    if shuffle:
        rng.shuffle(doc_idx)
    stream = np.concatenate([indexed[int(d)] for d in doc_idx]).astype(np.int64)
    n = (epochs * tokens_per_epoch - 1) // seq_length
    order = np.arange(n)
    if shuffle:
        order = order.astype(np.uint32)
        rng.shuffle(order)
    return [stream[j * seq_length: j * seq_length + seq_length + 1] for j in order], epochs


@pytest.mark.parametrize("shuffle", [True, False])
def test_samples_equal_brute_force_concatenation_over_epochs(tmp_path, shuffle):
    indexed = write_random(tmp_path / "d", 60, seed=3, zero_docs=(0, 17))
    documents = np.arange(5, 50)
    tokens = int(indexed.sizes[documents].sum())
    want_samples = 3 * tokens // SEQ  # about three epochs
    ds = GPTDataset("train", indexed, documents, want_samples, SEQ, seed=11, shuffle=shuffle)
    want, epochs = brute_force(indexed, documents, want_samples, SEQ, 11, shuffle)
    assert ds.num_epochs == epochs >= 3 and len(ds) == len(want) >= want_samples
    for i in range(len(ds)):
        sample = ds[i]
        assert sample.dtype == np.int64 and sample.shape == (SEQ + 1,)
        np.testing.assert_array_equal(sample, want[i])


def test_index_maps_are_cached_and_reloaded(tmp_path):
    indexed = write_random(tmp_path / "d", 30, seed=4)
    a = GPTDataset("train", indexed, np.arange(30), 50, SEQ, seed=5)
    files = a.cache_files
    assert all(f.startswith(str(tmp_path / "d_train_indexmap_50ns_16sl_5s_")) for f in files.values())
    mtimes = {k: (tmp_path / f).stat().st_mtime_ns for k, f in files.items()}
    b = GPTDataset("train", indexed, np.arange(30), 50, SEQ, seed=5)
    assert {k: (tmp_path / f).stat().st_mtime_ns for k, f in b.cache_files.items()} == mtimes
    assert all(np.array_equal(a[i], b[i]) for i in range(len(a)))
    c = GPTDataset("train", indexed, np.arange(30), 50, SEQ, seed=5, cache_dir=str(tmp_path / "cache"))
    assert all(f.startswith(str(tmp_path / "cache")) for f in c.cache_files.values())
    other = GPTDataset("train", indexed, np.arange(10, 30), 50, SEQ, seed=5)  # a different split: a new map
    assert other.cache_files != a.cache_files
    retokenized = write_random(tmp_path / "d", 30, seed=99)  # same prefix and document count, new content
    assert GPTDataset("train", retokenized, np.arange(30), 50, SEQ, seed=5).cache_files != a.cache_files


def test_datasets_pickle_by_reference_for_data_loader_workers(tmp_path):
    import pickle

    indexed = write_random(tmp_path / "d", 300, seed=13)
    ds = GPTDataset("train", indexed, np.arange(300), 400, SEQ, seed=14)
    blob = pickle.dumps(ds)
    assert len(blob) < 4096 < indexed.num_tokens * 2  # no token or index-map data inside
    copy = pickle.loads(blob)
    assert len(copy) == len(ds) and all(np.array_equal(copy[i], ds[i]) for i in range(0, len(ds), 37))


def test_concurrent_builders_share_one_build(tmp_path):
    indexed = write_random(tmp_path / "d", 40, seed=6)
    out, errors = [], []

    def build():
        try:
            out.append(GPTDataset("train", indexed, np.arange(40), 80, SEQ, seed=7))
        except Exception as e:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(out) == 4
    for ds in out[1:]:
        np.testing.assert_array_equal(ds.shuffle_idx, out[0].shuffle_idx)
        np.testing.assert_array_equal(ds.sample_idx, out[0].sample_idx)
    assert not list(tmp_path.glob("*.tmp*"))


def test_pythia_fixed_2049_token_sequences_load_in_order(tmp_path):
    rng = np.random.default_rng(8)
    seqs = rng.integers(0, 50277, size=(12, 2049))
    w = IndexedDatasetWriter(tmp_path / "pile_preshuffled", np.uint16)
    for s in seqs:
        w.add_document(s)
    w.finalize()
    cfg = load_config(overrides=[f"data_path={tmp_path / 'pile_preshuffled'}", "seq_length=2048", "split=1,0,0",
                                 "data_shuffle=false"])
    train, valid = build_datasets(cfg, train_samples=20, valid_samples=0)
    assert valid is None and len(train) == 24  # two passes over the 12 sequences
    for i in range(len(train)):
        np.testing.assert_array_equal(train[i], seqs[i % 12])


def test_blend_follows_weights_and_returns_member_samples(tmp_path):
    a = write_random(tmp_path / "a", 50, seed=9)
    b = write_random(tmp_path / "b", 80, seed=10)
    cfg = load_config(overrides=[f"train_data_paths=[{tmp_path / 'a'}, {tmp_path / 'b'}]", "train_data_weights=[3, 7]",
                                 f"valid_data_paths=[{tmp_path / 'b'}]", f"seq_length={SEQ}"])
    train, valid = build_datasets(cfg, train_samples=300, valid_samples=20)
    assert isinstance(train, BlendedDataset) and len(train) == 300 and len(valid) >= 20
    idx = train.dataset_index.astype(np.int64)
    counts = np.cumsum(idx == 1)
    steps = np.arange(1, 301)
    assert np.all(np.abs(counts - 0.7 * steps) <= 1.0 + 1e-9)  # every prefix within one sample of the weights
    for i in (0, 1, 2, 150, 299):
        member = train.datasets[idx[i]]
        np.testing.assert_array_equal(train[i], member[int(train.dataset_sample_index[i])])
    np.testing.assert_array_equal(valid[3], GPTDataset("valid", b, np.arange(80), 20, SEQ, cfg.seed)[3])
    assert a.num_tokens > 0


def test_split_bounds_follow_gpt_neox_rounding():
    assert split_bounds("969,30,1", 1000) == [0, 969, 999, 1000]
    assert split_bounds("949,50,1", 1000) == [0, 949, 999, 1000]
    assert split_bounds("1,0,0", 7) == [0, 7, 7, 7]
    assert split_bounds("98,1,1", 10) == [0, 10, 10, 10]


def test_split_that_rounds_to_zero_documents_is_an_error_not_a_spin(tmp_path):
    write_random(tmp_path / "tiny", 5, seed=12)
    cfg = load_config(overrides=[f"data_path={tmp_path / 'tiny'}", "split=969,30,1", f"seq_length={SEQ}"])
    with pytest.raises(DataSplitError, match="gives validation 0 of the 5 documents"):
        build_datasets(cfg, train_samples=10, valid_samples=4)
    train, valid = build_datasets(cfg, train_samples=10, valid_samples=0)
    assert valid is None and len(train) >= 10
    cfg = load_config(overrides=[f"data_path={tmp_path / 'tiny'}", "split=0,1,0", f"seq_length={SEQ}"])
    with pytest.raises(DataSplitError, match="split 'train' .* has 0 documents"):
        build_datasets(cfg, train_samples=10, valid_samples=0)


def test_sampler_ranks_are_disjoint_and_cover_every_sample():
    total, micro, world = 103, 3, 4
    per_rank = [list(DataParallelSampler(total, 0, micro, r, world)) for r in range(world)]
    assert all(len(b) == 8 for b in per_rank)
    seen = [i for r in per_rank for batch in r for i in batch]
    assert len(seen) == len(set(seen)) == 96 and set(seen) == set(range(96))
    for step in range(8):  # global micro-batch `step` is ranks' slices side by side
        assert sum((per_rank[r][step] for r in range(world)), []) == list(range(step * 12, step * 12 + 12))


def test_sampler_resumes_exactly_from_consumed_samples():
    total, micro, world = 200, 2, 3
    for rank in range(world):
        full = list(DataParallelSampler(total, 0, micro, rank, world))
        consumed = 7 * micro * world  # 7 global micro-batches done before the restart
        resumed = list(DataParallelSampler(total, consumed, micro, rank, world))
        assert resumed == full[7:]
    with pytest.raises(ValueError, match="rank 3 is outside world_size 3"):
        DataParallelSampler(total, 0, micro, 3, world)
    with pytest.raises(ValueError, match="consumed_samples"):
        DataParallelSampler(total, 201, micro, 0, world)


def _rank_builds(rank, world, init_file, prefix, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        ds = GPTDataset("train", IndexedDataset(prefix), np.arange(40), 90, SEQ, seed=21)
        np.save(f"{out_dir}/rank{rank}.npy", np.stack([ds[i] for i in range(len(ds))]))
    finally:
        dist.destroy_process_group()


def test_torch_distributed_ranks_build_once_and_agree(tmp_path):
    import torch.multiprocessing as mp

    write_random(tmp_path / "d", 40, seed=20)
    mp.spawn(_rank_builds, args=(2, str(tmp_path / "init"), str(tmp_path / "d"), str(tmp_path)), nprocs=2)
    a, b = np.load(tmp_path / "rank0.npy"), np.load(tmp_path / "rank1.npy")
    np.testing.assert_array_equal(a, b)
    assert len(list(tmp_path.glob("d_train_indexmap_*_idx.npy"))) == 3
