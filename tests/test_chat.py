"""Chat SFT data: rendering with the model's chat template, assistant-only labels, conversation batches and the
masked loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from builders import ROOT, config, tiny_model

from data_prep.chat import load_chat_tokenizer, main, run
from neox_dar.data.conversations import IGNORE, ConversationDataset, open_pair, pad_collate
from neox_dar.data.indexed import IndexedDataset
from neox_dar.training.batches import inputs_and_targets, lm_loss

SAMPLE = ROOT / "data" / "sample" / "chat_sample.jsonl"
TEMPLATE = ROOT / "data" / "chat" / "tulu.jinja"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A model folder as ``convert from-hf`` leaves it: tokenizer.json with a tokenizer_config.json holding the
    special tokens and the chat template (the Tülu 3 / OLMo-2 SFT template over the Pythia vocabulary)."""
    folder = tmp_path_factory.mktemp("tok")
    (folder / "tokenizer.json").write_bytes((ROOT / "data" / "20B_tokenizer.json").read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "chat_template": TEMPLATE.read_text()}))
    return folder


@pytest.fixture(scope="module")
def prepared(tokenizer_dir, tmp_path_factory) -> tuple[Path, dict]:
    prefix = tmp_path_factory.mktemp("chat") / "sample"
    manifest = run([str(SAMPLE), "--tokenizer", str(tokenizer_dir), "--out", str(prefix), "--workers", "1",
                    "--no-progress"])
    return prefix, manifest


def conversations() -> list[list[dict]]:
    return [json.loads(line)["messages"] for line in SAMPLE.read_text().splitlines()]


def test_ids_are_apply_chat_template_and_labels_cover_assistant_turns(prepared, tokenizer_dir):
    prefix, manifest = prepared
    tok = load_chat_tokenizer(str(tokenizer_dir))
    ids, labels = IndexedDataset(prefix), IndexedDataset(f"{prefix}_label")
    assert manifest["conversations"]["written"] == len(ids) == 8 and labels.dtype == np.int32
    by_ids = {tuple(ids[i].tolist()): labels[i].tolist() for i in range(len(ids))}
    for messages in conversations():
        expected = tok.apply_chat_template(messages, tokenize=True, return_dict=False)
        assert tuple(expected) in by_ids  # exactly transformers' rendering
        lab = by_ids[tuple(expected)]
        kept = tok.decode([t for t in lab if t != IGNORE])
        wanted = "".join(m["content"] + "<|endoftext|>" for m in messages if m["role"] == "assistant")
        assert kept.replace("\n", "") == wanted.replace("\n", "")  # assistant text and end-of-turn, nothing else
        assert all(t == IGNORE or t == i for t, i in zip(lab, expected))
    assert manifest["assistant_tokens"] == sum(int((labels[i] != IGNORE).sum()) for i in range(len(labels)))


def test_overlong_bad_records_and_the_manifest(tokenizer_dir, tmp_path, capsys):
    source = tmp_path / "mixed.jsonl"
    lines = SAMPLE.read_text().splitlines()
    source.write_text("\n".join([lines[0], '{"messages": [{"role": "user", "content": "hi"}]}', "{not json",
                                 lines[5]]) + "\n")
    out = tmp_path / "x"
    manifest = run([str(source), "--tokenizer", str(tokenizer_dir), "--out", str(out), "--max-length", "60",
                    "--workers", "1", "--no-progress"])
    c = manifest["conversations"]
    assert (c["read"], c["written"], c["truncated"], c["bad"]) == (4, 2, 1, 2)
    assert sorted(IndexedDataset(out).sizes) == [48, 60]
    reasons = [r for _, r in manifest["bad_records"]]
    assert reasons[0] == "no assistant message" and reasons[1].startswith("malformed JSON")
    manifest = run([str(source), "--tokenizer", str(tokenizer_dir), "--out", str(out), "--max-length", "60",
                    "--overlong", "drop", "--workers", "1", "--no-progress"])
    assert manifest["conversations"]["written"] == 1 and manifest["conversations"]["dropped: overlong"] == 1
    assert main([str(source), "--tokenizer", str(ROOT / "data" / "20B_tokenizer.json"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "20B_tokenizer.json has no chat template beside it in" in err
    # a template file that is empty, missing or not text: one line naming it (a traceback, or "has no template")
    (tmp_path / "empty.jinja").write_text("")
    (tmp_path / "binary.jinja").write_bytes(b"\xff\xfe")
    for name, said in (("empty.jinja", "is empty"), ("missing.jinja", "No such file"), ("binary.jinja", "not UTF-8")):
        assert main([str(source), "--tokenizer", str(tokenizer_dir), "--chat-template", str(tmp_path / name),
                     "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--chat-template {tmp_path / name}" in err and said in err and err.count("\n") == 1, err
    assert main([str(source), "--tokenizer", str(tokenizer_dir), "--out", str(out), "--strict", "--workers",
                 "1", "--no-progress"]) == 2
    assert f"{source}:2: no assistant message" in capsys.readouterr().err


def test_workers_give_the_same_files(prepared, tokenizer_dir, tmp_path):
    prefix, _ = prepared
    run([str(SAMPLE), "--tokenizer", str(tokenizer_dir), "--out", str(tmp_path / "w2"), "--workers", "2",
         "--no-progress"])
    for suffix in (".bin", ".idx", "_label.bin", "_label.idx"):
        assert Path(f"{prefix}{suffix}").read_bytes() == (tmp_path / f"w2{suffix}").read_bytes()


def _dataset(prefix: Path, micro: int = 4) -> ConversationDataset:
    return ConversationDataset([open_pair(str(prefix), f"{prefix}_label")], 8, 128, 1234, micro)


def test_loss_is_cross_entropy_over_assistant_tokens_only(prepared):
    """The training loss of a padded micro-batch equals the cross-entropy over the assistant tokens, computed by
    hand conversation by conversation from each one's own forward."""
    prefix, _ = prepared
    model, _ = tiny_model(seed=3, seq_length=128)
    ds = _dataset(prefix)
    batch = pad_collate([ds[i] for i in range(4)])
    x, y, _ = inputs_and_targets(batch, torch.device("cpu"))
    with torch.no_grad():
        loss = lm_loss(model(x), y)
    total, count = 0.0, 0
    for i in range(4):
        tokens, labels = ds[i]
        with torch.no_grad():
            logp = F.log_softmax(model(torch.from_numpy(tokens[None, :-1]))[0].double(), dim=-1)
        for t in range(len(tokens) - 1):
            if labels[t + 1] != IGNORE:
                assert labels[t + 1] == tokens[t + 1]
                total -= logp[t, tokens[t + 1]].item()
                count += 1
    assert count == int((y != IGNORE).sum()) and count < y.numel()
    assert loss.item() == pytest.approx(total / count, rel=1e-5)


def test_padded_batch_equals_one_by_one(prepared):
    """Each conversation's loss in a padded batch equals its loss alone (no conversation sees another, nor the
    padding)."""
    prefix, _ = prepared
    model, _ = tiny_model(seed=4, seq_length=128)
    ds = _dataset(prefix)
    samples = [ds[i] for i in range(8)]
    assert len({len(t) for t, _ in samples}) > 1
    x, y, real = inputs_and_targets(pad_collate(samples), torch.device("cpu"))
    with torch.no_grad():
        logits = model(x)
    assert real.sum(1).tolist() == [len(t) - 1 for t, _ in samples]
    for row, sample in enumerate(samples):
        xi, yi, _ = inputs_and_targets(pad_collate([sample]), torch.device("cpu"))
        with torch.no_grad():
            alone = lm_loss(model(xi), yi)
        n = xi.shape[1]
        assert lm_loss(logits[row:row + 1, :n], y[row:row + 1, :n]).item() == pytest.approx(alone.item(), rel=1e-5)


def test_ahas_l1_term_and_mu_f_leave_the_padding_out(prepared):
    """In a padded micro-batch AHA's L1 term and the logged mu_f are means over the real positions: the
    conversations' own terms weighted by their lengths (before: the padding's router scores counted too, so the
    term's weight on real tokens shrank with the padding's share)."""
    prefix, _ = prepared
    model, _ = tiny_model(seed=5, seq_length=128, attention_type="aha", window_size=4, aha_l1_coef=0.1)
    ds = _dataset(prefix)
    samples = [ds[i] for i in range(8)]
    x, _, real = inputs_and_targets(pad_collate(samples), torch.device("cpu"))
    assert not real.all()
    with torch.no_grad():
        model(x)
        padded = model.aux_loss(real).item(), model.attention_stats(real)
        unmasked = model.aux_loss().item()
    aux, mu_f, n = 0.0, 0.0, 0
    for sample in samples:
        xi, _, _ = inputs_and_targets(pad_collate([sample]), torch.device("cpu"))
        with torch.no_grad():
            model(xi)
        aux += model.aux_loss().item() * xi.shape[1]
        mu_f += model.attention_stats()["layer1/mu_f"].double() * xi.shape[1]
        n += xi.shape[1]
    assert padded[0] == pytest.approx(aux / n, rel=1e-5) and unmasked != pytest.approx(aux / n, rel=1e-3)
    torch.testing.assert_close(padded[1]["layer1/mu_f"].double(), mu_f / n)


def test_length_grouped_order_is_seeded_and_complete(prepared):
    """Every conversation once per epoch, micro-batches of similar lengths, the same order for the same seed."""
    prefix, _ = prepared
    pair = open_pair(str(prefix), f"{prefix}_label")
    ds = ConversationDataset([pair], 16, 128, 1234, 2)
    again = ConversationDataset([pair], 16, 128, 1234, 2)
    assert np.array_equal(ds.order, again.order)
    assert sorted(ds.order[:8].tolist()) == sorted(ds.order[8:].tolist()) == list(range(8))
    lengths = pair[0].sizes[ds.order[:8]]
    spread = [abs(int(lengths[i]) - int(lengths[i + 1])) for i in range(0, 8, 2)]
    assert max(spread) <= int(lengths.max() - lengths.min())


def test_an_epoch_is_whole_steps_each_one_length_group(prepared):
    """8 conversations in global batches of 3: each epoch is 3 whole steps holding every conversation (one of them
    twice, in the last step, never twice in one step), and every step's lengths fall (one length group). The partial
    batch was shuffled in among the others, shifting each later step across two groups (in a real mixture, about a
    quarter of the tokens padding), and the next epoch began inside the last step."""
    prefix, _ = prepared
    pair = open_pair(str(prefix), f"{prefix}_label")
    ds = ConversationDataset([pair], 27, 2048, 1234, 3)
    lengths = pair[0].sizes
    steps = ds.order.reshape(9, 3)
    for step in steps:
        assert list(lengths[step]) == sorted(lengths[step], reverse=True) and len(set(step.tolist())) == 3, step
    for epoch in range(3):
        assert set(ds.order[9 * epoch:9 * (epoch + 1)].tolist()) == set(range(8))
    assert ds.epochs == 3


def test_every_world_size_reads_the_same_conversations_in_each_step(prepared):
    """Conversations are length-grouped per global batch: with train_batch_size 4, one rank (micro 2, two
    accumulation steps), two ranks (micro 2) and four (micro 1) read the same conversations in every step, and the
    same micro-batches where the micro-batch size is the same (grouped per global micro-batch before, another world
    size read another order)."""
    from neox_dar.data import DataParallelSampler, build_datasets

    prefix, _ = prepared
    paths = {"train_data_paths": [str(prefix)], "train_label_data_paths": [f"{prefix}_label"]}

    def steps(world: int, micro: int) -> tuple[list[set], list[set]]:
        cfg = config("configs/tiny.yml", train_batch_size=4, train_micro_batch_size_per_gpu=micro, **paths)
        ds, _ = build_datasets(cfg, 16, 0, world_size=world)
        per_step, micro_batches = [set() for _ in range(4)], []
        for rank in range(world):
            for k, idx in enumerate(DataParallelSampler(16, 0, micro, rank, world)):
                docs = frozenset(int(ds.order[i]) for i in idx)
                per_step[k * micro * world // 4] |= docs
                micro_batches.append(docs)
        return per_step, sorted(micro_batches, key=sorted)

    one, two, four = steps(1, 2), steps(2, 2), steps(4, 1)
    assert one[0] == two[0] == four[0] and all(len(s) == 4 for s in one[0])
    assert one[1] == two[1]


def test_per_token_weights_give_the_summed_cross_entropy_over_the_steps_labelled_tokens(prepared):
    """``calculate_per_token_loss``: two micro-batches of different labelled counts, each mean loss times its weight
    and divided by the accumulation steps (as DeepSpeed's backward does), give the cross-entropy summed over both
    divided by their labelled tokens, with its gradients; the micro-batch mean (the default) differs."""
    from neox_dar.training.batches import token_weights

    prefix, _ = prepared
    model, _ = tiny_model(seed=3, seq_length=128)
    ds = _dataset(prefix)
    steps = [inputs_and_targets(pad_collate([ds[i] for i in pair]), torch.device("cpu")) for pair in ((0, 1), (2, 3))]
    counts = [int((y != IGNORE).sum()) for _, y, _ in steps]
    assert counts[0] != counts[1]
    weights = token_weights([y for _, y, _ in steps], world_size=1)
    assert [float(w) for w in weights] == pytest.approx([2 * n / sum(counts) for n in counts])

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    weighted, g_weighted = grads(sum(lm_loss(model(x), y) * w for (x, y, _), w in zip(steps, weights)) / 2)
    by_hand, g_hand = grads(sum(F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE,
                                                reduction="sum") for x, y, _ in steps) / sum(counts))
    torch.testing.assert_close(weighted, by_hand)
    for a, b in zip(g_weighted, g_hand):
        torch.testing.assert_close(a, b)
    per_micro = sum(lm_loss(model(x), y) for x, y, _ in steps).detach() / 2  # a random model: every loss ~ log V
    assert not torch.allclose(per_micro, by_hand, rtol=1e-6, atol=0)


def test_a_per_token_step_is_the_same_on_two_ranks_as_in_one_micro_batch(tmp_path):
    """train.py with ``calculate_per_token_loss: true`` on chat data: two ranks with a micro-batch of 2 conversations
    each take the step one rank takes with all 4 in one micro-batch (the same loss, gradient norm, validation loss
    and weights): the labelled-token count is summed over the ranks. (With per micro-batch means the two ranks'
    micro-batches weigh alike whatever their labelled tokens, and the step differs.)"""
    from safetensors.torch import load_file
    from trainrun import train

    prefix = tmp_path / "chat"
    run([str(SAMPLE), "--tokenizer", str(ROOT / "data" / "byte_tokenizer.json"), "--chat-template", str(TEMPLATE),
         "--out", str(prefix), "--max-length", "257", "--workers", "1", "--no-progress"])
    chat = [f"train_data_paths=[{prefix}]", f"train_label_data_paths=[{prefix}_label]", f"valid_data_paths=[{prefix}]",
            f"valid_label_data_paths=[{prefix}_label]", "data_path=null"]
    keys = [f"vocab_file={ROOT / 'data' / 'byte_tokenizer.json'}", "vocab_size=257", "seq_length=256",
            "train_iters=1", "train_batch_size=4", "eval_interval=1", "eval_iters=1", "checkpoint_factor=1", *chat]
    rows = {}
    for nproc in (1, 2):
        train(tmp_path / f"ranks{nproc}", "unused", *keys, f"train_micro_batch_size_per_gpu={4 // nproc}",
              "calculate_per_token_loss=true", nproc=nproc)
        metrics = (tmp_path / f"ranks{nproc}" / "metrics.jsonl").read_text()
        rows[nproc] = [json.loads(line) for line in metrics.splitlines()]
    (one, one_valid), (two, two_valid) = rows[1], rows[2]
    assert one["lm_loss"] == pytest.approx(two["lm_loss"], rel=1e-6)
    assert one["grad_norm"] == pytest.approx(two["grad_norm"], rel=1e-5)
    assert one_valid["valid_loss"] == pytest.approx(two_valid["valid_loss"], rel=1e-6)
    weights = [load_file(str(tmp_path / f"ranks{n}" / "checkpoints" / "step_00000001" / "model.safetensors"))
               for n in (1, 2)]
    for name, tensor in weights[0].items():  # Adam's first step is ~lr * sign(g): near-zero g differ in rounding
        torch.testing.assert_close(tensor, weights[1][name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per_token", [False, True])
def test_validation_scores_labelled_tokens_only_and_nan_without_any(prepared, tmp_path, per_token):
    """The validation loss of conversations cut before every assistant turn (no labelled token) is NaN, not 0 (a
    perfect score); with some labelled micro-batches, a micro-batch without one does not pull the mean to 0."""
    import math

    import torch.distributed as dist

    from neox_dar.training.distributed import DistInfo
    from neox_dar.training.validation import evaluate

    prefix, _ = prepared
    info = DistInfo(0, 1, 0, torch.device("cpu"))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        results = {}
        for seq_length in (16, 32):
            cfg = config("configs/tiny.yml", seq_length=seq_length, train_micro_batch_size_per_gpu=1,
                         train_batch_size=1, eval_iters=8, save=str(tmp_path / "run"),
                         calculate_per_token_loss=per_token)
            ds = ConversationDataset([open_pair(str(prefix), f"{prefix}_label")], 8, seq_length, 1234, 1)
            labelled = [int((ds[i][1][1:] != IGNORE).sum()) for i in range(8)]
            model, _ = tiny_model(seed=3, seq_length=seq_length)
            with torch.no_grad():  # each conversation's mean loss, by hand
                means = [float(lm_loss(model(x), y)) for x, y, _ in
                         (inputs_and_targets(pad_collate([ds[i]]), torch.device("cpu")) for i in range(8))]
            results[seq_length] = (labelled, means, evaluate(model, ds, cfg, info, 0)["valid_loss"])
    finally:
        dist.destroy_process_group()
    (none, _, short_loss), (some, means, loss) = results[16], results[32]
    assert sum(none) == 0 and math.isnan(short_loss)
    assert 0 in some and sum(some) > 0
    if per_token:
        expected = sum(m * n for m, n in zip(means, some)) / sum(some)
    else:  # the micro-batches (one conversation each) that hold a labelled token
        expected = sum(m for m, n in zip(means, some) if n) / sum(1 for n in some if n)
    assert loss == pytest.approx(expected, rel=1e-5)


def test_label_paths_must_pair_with_data_paths():
    with pytest.raises(Exception, match="train_label_data_paths"):
        config("configs/tiny.yml", train_data_paths=["a", "b"], train_label_data_paths=["a_label"])


BAD_CONVERSATIONS = {  # a record -> the reason it is skipped
    '{"messages": [{"role": "user", "content": "\\ud800"}, {"role": "assistant", "content": "x"}]}':
        "message 0: invalid Unicode (lone surrogate escape)",
    '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}": "malformed JSON: nested too deeply",
    json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                             {"role": "assistant", "content": "c"}]}):
        "the chat template does not render this conversation prefix by prefix",
}


def _with_bad_conversations(path: Path) -> Path:
    lines = SAMPLE.read_text().splitlines()
    path.write_text("\n".join([lines[0], *BAD_CONVERSATIONS, lines[1]]) + "\n")
    return path


def test_every_bad_conversation_is_skipped_and_counted_with_its_reason(tokenizer_dir, tmp_path):
    """A lone surrogate, JSON nested past Python's recursion limit and two assistant turns in a row (which the
    template cannot render prefix by prefix) are bad records like any other: skipped, counted, the run goes on."""
    source = _with_bad_conversations(tmp_path / "bad.jsonl")
    manifest = run([str(source), "--tokenizer", str(tokenizer_dir), "--out", str(tmp_path / "x"), "--workers", "1",
                    "--no-progress"])
    c = manifest["conversations"]
    assert (c["read"], c["written"], c["bad"]) == (5, 2, 3)
    for (where, reason), (line, expected) in zip(manifest["bad_records"], enumerate(BAD_CONVERSATIONS.values(), 2)):
        assert where == f"{source}:{line}" and reason.startswith(expected), reason


def test_bad_conversations_with_workers_give_one_line(tokenizer_dir, tmp_path):
    """With --workers 2 the bad records are skipped as with one; with --strict the first one stops the run in one
    line: no traceback from the pool (a process of its own, so the pool's shutdown is seen)."""
    source = _with_bad_conversations(tmp_path / "bad.jsonl")
    command = [sys.executable, "-m", "data_prep.chat", str(source), "--tokenizer", str(tokenizer_dir), "--out",
               str(tmp_path / "x"), "--workers", "2", "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "3 bad records skipped" in done.stderr
    done = subprocess.run(command + ["--strict"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"data_prep.chat: error: {source}:2: message 0: invalid Unicode")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "x.bin", "x.idx", "x.manifest.json",
                                                          "x_label.bin", "x_label.idx"]


def test_files_of_a_killed_run_are_removed_at_the_next_start(tokenizer_dir, tmp_path, capsys):
    """A SIGKILLed run leaves its PREFIX.tmp-PID files; the next run with that prefix removes them, but never the
    files of a run still writing (it holds a lock on them)."""
    import fcntl

    out = tmp_path / "x"
    killed = [tmp_path / f"x.tmp-4242{suffix}" for suffix in (".bin", ".idx", "_label.bin", "_label.idx",
                                                              ".manifest.json")]
    for path in killed:
        path.write_bytes(b"partial")
    live = tmp_path / "x.tmp-4343.bin"
    live.write_bytes(b"writing")
    other = tmp_path / "xy.tmp-4242.bin"  # another prefix's
    other.write_bytes(b"other")
    with open(live, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert main([str(SAMPLE), "--tokenizer", str(tokenizer_dir), "--out", str(out), "--workers", "1",
                     "--no-progress"]) == 0
    assert "removed 5 files of an interrupted data_prep.chat run" in capsys.readouterr().err
    assert not any(p.exists() for p in killed) and live.exists() and other.exists()


def test_a_rerun_killed_in_its_renames_leaves_a_set_training_refuses(tmp_path):
    """A rerun into the same PREFIX (another --max-length) SIGKILLed after its new manifest is in place, before the
    token files: training's data check refuses the tokens the manifest does not describe (before: the old manifest
    stayed over new files, or new tokens over old labels, and the manifest's tokenizer and counts were read as
    theirs); the next run completes the set."""
    from neox_dar.data.identity import prefix_identity
    from neox_dar.data.indexed import IndexedDatasetError

    prefix = tmp_path / "x"
    byte = ["--tokenizer", str(ROOT / "data" / "byte_tokenizer.json"), "--chat-template", str(TEMPLATE), "--out",
            str(prefix), "--workers", "1", "--no-progress"]
    run([str(SAMPLE), *byte])
    prefix_identity(str(prefix))
    env = {**os.environ, "NEOX_DAR_KILL_AT": "chat-replacing", "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, "-m", "data_prep.chat", str(SAMPLE), *byte, "--max-length", "64"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert json.loads((tmp_path / "x.manifest.json").read_text())["max_length"] == 64
    with pytest.raises(IndexedDatasetError, match="is not the file .*x.manifest.json describes"):
        prefix_identity(str(prefix))
    run([str(SAMPLE), *byte, "--max-length", "64"])
    assert prefix_identity(str(prefix))["idx_sha256"] == json.loads((tmp_path / "x.manifest.json").read_text())[
        "idx_sha256"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bin", "x.idx", "x.manifest.json", "x_label.bin",
                                                          "x_label.idx"]


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C during data_prep.chat (a jinja traceback before) says what is left and exits 130, as tokenize."""
    import data_prep.chat as chat

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(chat, "run", interrupted)
    assert main(["x.jsonl", "--tokenizer", "t", "--out", "o"]) == 130
    err = capsys.readouterr().err
    assert err.startswith("data_prep.chat: interrupted (Ctrl-C): nothing was written") and err.count("\n") == 1


def test_chat_data_longer_than_the_training_sequence_is_warned(prepared, caplog):
    """Data prepared at --max-length 2048 (the default) trained at seq_length 32: the loader cuts conversations to 33
    tokens, so those whose assistant turn starts later train nothing; a warning says so and how to prepare the data
    (before: silence, with most samples of a real mixture empty). At seq_length >= max_length - 1, no warning."""
    import logging

    from neox_dar.data import build_datasets

    prefix, manifest = prepared
    assert manifest["max_length"] == 2048
    paths = {"train_data_paths": [str(prefix)], "train_label_data_paths": [f"{prefix}_label"]}
    with caplog.at_level(logging.WARNING, logger="neox_dar.data.build"):
        build_datasets(config("configs/tiny.yml", seq_length=32, **paths), 8, 0)
    said = [r.getMessage() for r in caplog.records if "--max-length 2048" in r.getMessage()]
    assert len(said) == 1 and "longer than seq_length + 1 = 33" in said[0] and "--max-length 33" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="neox_dar.data.build"):
        build_datasets(config("configs/tiny.yml", seq_length=2048, max_position_embeddings=2048, **paths), 8, 0)
    assert not [r for r in caplog.records if "--max-length" in r.getMessage()]


def test_the_epochs_of_chat_data_count_conversations(prepared, caplog):
    """The start-up line's (and sweep plan's) epochs of chat data are the samples read over the conversations, as
    the data loader reads them (one conversation a sample, padded or cut): they were the tokens of train_iters full
    sequences over the data's tokens, 5.01 epochs where the loader read 3.00."""
    import logging

    from neox_dar.data import build_datasets
    from neox_dar.training.checks import data_epochs

    prefix, _ = prepared
    cfg = config("configs/tiny.yml", seq_length=32, train_iters=3, train_batch_size=8,
                 train_micro_batch_size_per_gpu=8, train_data_paths=[str(prefix)],
                 train_label_data_paths=[f"{prefix}_label"])
    tokens, epochs = data_epochs(cfg, 1)
    assert (tokens, epochs) == (3 * 8 * 32, 3 * 8 / 8)  # 24 samples of the sample's 8 conversations
    with caplog.at_level(logging.INFO, logger="neox_dar.data.build"):
        build_datasets(cfg, 24, 0)
    assert "train data: 8 conversations, 24 samples read (3.00 epochs)" in caplog.text


def test_data_check_reads_a_chat_manifest(prepared, tokenizer_dir, capsys):
    """data.check on data_prep.chat's output: its conversations are the documents (it warned that the files were
    replaced, reading 'None documents', and printed the tokenizer kind as None)."""
    from neox_dar.data.check import main as check

    prefix, manifest = prepared
    assert check([str(prefix), f"train_label_data_paths=[{prefix}_label]", "seq_length=32",
                  f"vocab_file={tokenizer_dir / 'tokenizer.json'}"]) == 0
    out = capsys.readouterr()
    assert f"written with {manifest['conversations']['written']:,} documents" in out.out, out.out
    assert "replaced" not in out.out + out.err and "None" not in out.out, out
