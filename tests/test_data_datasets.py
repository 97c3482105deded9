"""GPT-NeoX sample packing, index-map cache, Pythia's fixed sequences, blends, splits, sampler, data keys."""

import logging
import threading

import numpy as np
import pytest

from neox_dar.config import ConfigError, load_config
from neox_dar.data import (
    BlendedDataset,
    DataParallelSampler,
    DataSplitError,
    GPTDataset,
    IndexedDataset,
    IndexedDatasetWriter,
    build_datasets,
    split_bounds,
)

SEQ = 16


def write_docs(prefix, docs, dtype=np.uint16):
    """A .bin/.idx pair holding ``docs`` (token arrays), one sequence each; its IndexedDataset."""
    w = IndexedDatasetWriter(prefix, dtype)
    for d in docs:
        w.add_document(d)
    w.finalize()
    return IndexedDataset(prefix)


def write_random(prefix, n_docs, seed, max_len=40, vocab=50277, zero_docs=()):
    rng = np.random.default_rng(seed)
    return write_docs(prefix, [rng.integers(1, vocab, 0 if i in zero_docs else int(rng.integers(1, max_len)))
                               for i in range(n_docs)])


def brute_force(indexed, documents, num_samples, seq_length, seed, shuffle=True):
    """All S built samples (GPT-NeoX's dataset exposes the first S - 1) by concatenating the (shuffled)
    epochs' documents and slicing, GPT-NeoX's definition; and the epoch count."""
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
    assert ds.num_epochs == epochs >= 3 and len(ds) == len(want) - 1 >= want_samples - 1  # GPT-NeoX's len: S - 1
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
    write_docs(tmp_path / "pile_preshuffled", seqs)
    cfg = load_config(overrides=[f"data_path={tmp_path / 'pile_preshuffled'}", "seq_length=2048", "split=1,0,0",
                                 "data_shuffle=false"])
    train, valid = build_datasets(cfg, train_samples=20, valid_samples=0)
    assert valid is None and len(train) == 24  # two passes over the 12 sequences
    for i in range(len(train)):
        np.testing.assert_array_equal(train[i], seqs[i % 12])


def test_fixed_length_mode_never_silently_with_shuffling(tmp_path):
    """2049-token documents with data_shuffle on are packed as GPT-NeoX packs them, unless data_fixed_length asks."""
    rng = np.random.default_rng(18)
    seqs = rng.integers(1, 50277, size=(12, 2049))
    indexed = write_docs(tmp_path / "p", seqs)
    base = [f"data_path={tmp_path / 'p'}", "seq_length=2048", "split=1,0,0"]
    packed, _ = build_datasets(load_config(overrides=base), train_samples=20, valid_samples=0)
    want, _ = brute_force(indexed, np.arange(12), 20, 2048, 1234)
    assert not packed.fixed_sequences and len(packed) == len(want) - 1
    for i in (0, 1, len(packed) - 1):
        np.testing.assert_array_equal(packed[i], want[i])
    asked, _ = build_datasets(load_config(overrides=base + ["data_fixed_length=true"]), 20, 0)
    assert asked.fixed_sequences and len(asked) == 24
    order = [next(k for k in range(12) if np.array_equal(asked[i], seqs[k])) for i in range(24)]
    assert sorted(order) == sorted(list(range(12)) * 2) and order != list(range(12)) * 2  # whole sequences, shuffled
    write_docs(tmp_path / "q", [seqs[0], seqs[1][:100]])
    cfg = load_config(overrides=[f"data_path={tmp_path / 'q'}", "seq_length=2048", "split=1,0,0",
                                 "data_fixed_length=true"])
    with pytest.raises(DataSplitError, match="document 1 of .* holds 100 tokens, not seq_length \\+ 1 = 2049"):
        build_datasets(cfg, train_samples=2, valid_samples=0)


def test_blend_follows_weights_and_returns_member_samples(tmp_path):
    a = write_random(tmp_path / "a", 50, seed=9)
    b = write_random(tmp_path / "b", 80, seed=10)
    cfg = load_config(overrides=[f"train_data_paths=[{tmp_path / 'a'}, {tmp_path / 'b'}]", "train_data_weights=[3, 7]",
                                 f"valid_data_paths=[{tmp_path / 'b'}]", f"seq_length={SEQ}"])
    train, valid = build_datasets(cfg, train_samples=300, valid_samples=20)
    assert isinstance(train, BlendedDataset) and len(train) == sum(len(d) for d in train.datasets) >= 300
    assert len(valid) >= 20
    idx = train.dataset_index.astype(np.int64)
    counts = np.cumsum(idx == 1)
    steps = np.arange(1, len(train) + 1)
    assert np.all(np.abs(counts - 0.7 * steps) <= 1.0 + 1e-9)  # every prefix within one sample of the weights
    for i in (0, 1, 2, 150, 299):
        member = train.datasets[idx[i]]
        np.testing.assert_array_equal(train[i], member[int(train.dataset_sample_index[i])])
    np.testing.assert_array_equal(valid[3], GPTDataset("valid", b, np.arange(80), 21, SEQ, cfg.training.seed)[3])  # 20 * 1.005
    assert a.num_tokens > 0


def test_split_bounds_follow_gpt_neox_rounding():
    assert split_bounds("969,30,1", 1000) == [0, 969, 999, 1000]
    assert split_bounds("949,50,1", 1000) == [0, 949, 999, 1000]
    assert split_bounds("1,0,0", 7) == [0, 7, 7, 7]
    assert split_bounds("98,1,1", 10) == [0, 10, 10, 10]
    # GPT-NeoX's get_train_valid_test_split_: '/' works too and missing shares are 0
    assert split_bounds("98,2", 100) == split_bounds("98,2,0", 100) == [0, 98, 100, 100]
    assert split_bounds("969/30/1", 1000) == [0, 969, 999, 1000]
    assert split_bounds("1", 9) == [0, 9, 9, 9]


def test_split_with_missing_shares_is_accepted_and_bad_ones_are_config_errors():
    assert load_config(overrides=["split=98,2"]).data.split == "98,2"
    for bad in ("1,2,3,4", "a,b", "1,-1,0", "0,0,0"):
        with pytest.raises(ConfigError, match="invalid value for 'split' in the command line"):
            load_config(overrides=[f"split={bad}"])


def test_split_that_rounds_to_zero_documents_gives_no_validation_set_with_a_warning(tmp_path, caplog):
    write_random(tmp_path / "tiny", 5, seed=12)
    cfg = load_config(overrides=[f"data_path={tmp_path / 'tiny'}", "split=969,30,1", f"seq_length={SEQ}"])
    with caplog.at_level(logging.WARNING, logger="neox_dar.data.build"):
        train, valid = build_datasets(cfg, train_samples=10, valid_samples=4)
    assert valid is None and len(train) >= 10  # GPT-NeoX: no validation set, training goes on
    assert "split '969,30,1' gives validation 0 of the 5 documents" in caplog.text
    caplog.clear()
    train, valid = build_datasets(cfg, train_samples=10, valid_samples=0)
    assert valid is None and len(train) >= 10 and "validation" not in caplog.text
    with pytest.raises(ConfigError, match="gives training no share"):  # refused with the config, before any work
        load_config(overrides=[f"data_path={tmp_path / 'tiny'}", "split=0,1,0", f"seq_length={SEQ}"])
    cfg = load_config(overrides=[f"data_path={tmp_path / 'tiny'}", "split=1,1000,0", f"seq_length={SEQ}"])
    with pytest.raises(DataSplitError, match="split 'train' .* has 0 documents"):  # a share that rounds to none
        build_datasets(cfg, train_samples=10, valid_samples=0)


def test_valid_data_paths_beside_data_path_are_the_validation_set(tmp_path):
    """data_path with split '1000,0,0' and valid_data_paths: validation reads the held-out files (they were ignored,
    so such a run silently had no valid_loss); a split that also gives validation a share is a config error."""
    write_random(tmp_path / "train", 30, seed=1)
    held = write_random(tmp_path / "held", 10, seed=2, vocab=7)  # ids 1..6: recognisably the held-out file
    keys = [f"data_path={tmp_path / 'train'}", f"valid_data_paths=[{tmp_path / 'held'}]", f"seq_length={SEQ}"]
    cfg = load_config(overrides=[*keys, "split=1000,0,0"])
    train, valid = build_datasets(cfg, train_samples=10, valid_samples=4)
    assert valid is not None and len(valid) >= 4
    assert all(int(valid[i].max()) < 7 for i in range(4)) and int(train[0].max()) >= 7
    assert set(np.concatenate([valid[i] for i in range(len(valid))]).tolist()) <= set(
        np.concatenate([held[i] for i in range(len(held))]).tolist())
    with pytest.raises(ConfigError, match="'split'.*valid_data_paths names the validation data"):
        load_config(overrides=[*keys, "split=969,30,1"])


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


def test_seed_outside_numpy_range_is_a_config_error():
    for bad in (-1, 2**32):
        with pytest.raises(ConfigError, match=f"invalid value for 'seed' in the command line: {bad} "
                                              r"\(must be in \[0, 2\*\*32 - 1\]"):
            load_config(overrides=[f"seed={bad}"])
    assert load_config(overrides=[f"seed={2**32 - 1}"]).training.seed == 2**32 - 1


def test_value_errors_name_the_file_that_set_the_key(tmp_path):
    (tmp_path / "x.yml").write_text("dar_d_down: 600\nattention_type: dar\n")
    with pytest.raises(ConfigError, match=r"^invalid value for 'dar_d_down' in .*x\.yml: 600 \(must be in 1\.\."):
        load_config(tmp_path / "x.yml")
    (tmp_path / "w.yml").write_text("train_data_paths: [a, b]\ntrain_data_weights: [1, -1]\n")
    with pytest.raises(ConfigError, match=r"'train_data_weights' in .*w\.yml: \[1\.0, -1\.0\]"):
        load_config(tmp_path / "w.yml")
    with pytest.raises(ConfigError, match=r"'valid_data_weights' in the command line: \[1\.0\] \(needs one weight"):
        load_config(tmp_path / "w.yml", overrides=["train_data_weights=null", "valid_data_paths=[a, b]",
                                                    "valid_data_weights=[1]"])
    (tmp_path / "g.yml").write_text("gas: 0\n")  # a GPT-NeoX spelling keeps its file
    with pytest.raises(ConfigError, match=r"'gradient_accumulation_steps' in .*g\.yml: 0"):
        load_config(tmp_path / "g.yml")
    (tmp_path / "m.yml").write_text("max_position_embeddings: 1024\n")  # seq_length keeps its default: no origin
    with pytest.raises(ConfigError, match=r"^invalid value for 'seq_length': 2048 \(must be <="):
        load_config(tmp_path / "m.yml")
