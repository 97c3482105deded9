"""Incremental decoding (``neox_dar.generate``, each variant's cache): logits equal the full forward for every
variant and family, greedy generation equals re-running the full forward, batched equals one-by-one, cache sizes
equal ``describe``'s formulas, AHA's local heads read only their window, and the command line's outputs and
one-line errors."""

import json
from types import SimpleNamespace

import pytest
import torch
from builders import FAMILY_PRESETS, TINY_FAMILY_KEYS, config, saved_model, saved_run

from neox_dar.describe import kv_cache_bytes_per_token
from neox_dar.generate import GenerationError, Sampling, generate
from neox_dar.model import build_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny ops: one thread is several times faster on a shared CPU

W = 4  # base window: MSWA's windows are 1..8, so contexts of 20+ tokens are longer than every window
VARIANTS = {
    "vanilla": {},
    "swa": {"window_size": W},
    "mswa": {"window_size": W},
    "aha": {"window_size": W},
    "dar": {"window_size": W, "dar_d_down": 16},
    "uniform": {"dar_d_down": 16},
    "linear": {"linear_feature_dim": 8},
    "dimpo": {"dimpo_d_proj": 6},
    "mixed": {"num_layers": 4, "attention_config": [[["linear", "mswa", "dar", "aha"], 1]], "window_size": W,
              "dar_d_down": 16, "linear_feature_dim": 8},
}


def family_model(family: str, variant: str | None, seed: int = 0, **keys):
    """A tiny random model of the family's preset (GQA where the family has it) with the variant (None: ``keys`` say
    the attention), every parameter moved by 0.05 standard deviations so that norms, biases and the bottleneck all
    matter; eval mode, float32."""
    keys = {**TINY_FAMILY_KEYS, "seq_length": 64, **VARIANTS.get(variant, {}), **keys}
    if variant not in ("mixed", None):
        keys["attention_type"] = variant
    if family == "gpt_neox":
        keys["num_kv_heads"] = 4  # GPT-NeoX's fused layout has one key/value head per query head
    cfg = config(FAMILY_PRESETS[family], **keys).model
    torch.manual_seed(seed)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def incremental_logits(model, seqs: list[torch.Tensor], prompt_lengths: list[int]) -> torch.Tensor:
    """Prefill each row's prompt, then feed its next tokens one per step: logits (B, N, V) predicting tokens
    ``prompt_length .. prompt_length + N - 1`` of each row."""
    N = seqs[0].numel() - prompt_lengths[0]
    with torch.inference_mode():
        cache = model.new_cache(prompt_lengths, N)
        out = [model.prefill([s[:n] for s, n in zip(seqs, prompt_lengths)], cache)[:, None]]
        for t in range(N - 1):
            out.append(model.decode(torch.stack([s[n + t] for s, n in zip(seqs, prompt_lengths)])[:, None], cache))
    return torch.cat(out, 1)


def check_decoding(model, lengths: list[int], N: int, seed: int) -> None:
    """Random sequences of ``lengths[b] + N`` tokens: the incremental logits after each prompt equal the full
    forward's on each whole sequence."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, model.cfg.vocab_size, (n + N,), generator=g) for n in lengths]
    got = incremental_logits(model, seqs, lengths)
    with torch.inference_mode():
        for b, (s, n) in enumerate(zip(seqs, lengths)):
            assert_logits_close(got[b], model(s[None])[0, n - 1:n + N - 1])


def assert_logits_close(got: torch.Tensor, full: torch.Tensor) -> None:
    """float32, 1e-4 relative (to the largest logit: near-zero logits have no meaningful relative error)."""
    torch.testing.assert_close(got, full, rtol=1e-4, atol=1e-4 * full.abs().max().item())


@pytest.mark.parametrize("family", list(FAMILY_PRESETS))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_incremental_logits_equal_the_full_forward(family, variant):
    """Prompts of 5, 11 and 17 tokens in one batch (padded columns in the caches), 24 decoded tokens each: the
    contexts (up to 41) are longer than every window (MSWA's largest is 2w = 8)."""
    model = family_model(family, variant)
    lengths, N = [11, 5, 17], 24
    check_decoding(model, lengths, N, seed=1)


@pytest.mark.parametrize("variant", ["vanilla", "aha"])
def test_a_cache_not_yet_full_is_read_in_blocks_and_decodes_like_the_full_forward(variant, monkeypatch):
    """``RingBuffer.read`` gives whole blocks of ``READ_BLOCK`` slots, so the attention's key count changes once a
    block, not at every token; the empty slots read after the last column are later than every query and masked.
    With blocks of 8, the 41-column contexts cross several blocks, each step's read ending inside one."""
    from neox_dar.standalone import cache as cache_module

    monkeypatch.setattr(cache_module, "READ_BLOCK", 8)
    reads, read = [], cache_module.RingBuffer.read

    def spy(self, upto):
        keys, columns = read(self, upto)
        reads.append((upto, columns.numel(), self.slots))
        return keys, columns

    monkeypatch.setattr(cache_module.RingBuffer, "read", spy)
    check_decoding(family_model("gpt_neox", variant), [11, 5, 17], 24, seed=3)
    assert reads and all(width == min(slots, -(-upto // 8) * 8) for upto, width, slots in reads)
    assert any(width > upto for upto, width, _ in reads) and any(upto % 8 for upto, _, _ in reads)


def test_hybrid_stack_decodes_like_the_full_forward():
    """The MSWA paper's Sec. 4.4 stack (``hybrid: mswa_linear``, 12 layers: [linear, mswa, mswa] x 4)."""
    model = family_model("gpt_neox", None, num_layers=12, hybrid="mswa_linear", window_size=W)
    lengths, N = [9, 14], 20
    check_decoding(model, lengths, N, seed=2)


@pytest.mark.parametrize("keys", [{"rotary_pct": 0.5, "qk_norm": "projection"}, {"rotary_pct": 0.5, "qk_norm": "head"},
                                  {"rotary_pct": 0.5, "qkv_bias": True}],
                         ids=["partial-rotary-projection-norm", "partial-rotary-head-norm", "partial-rotary-bias"])
@pytest.mark.parametrize("mode", ["keys", "latent"])
def test_dar_cache_with_key_norms_and_partial_rotary(keys, mode):
    """The DAR cache's two ways to a far key's score: under a key norm the whole key comes from ``c`` (the norm
    needs every dim); without one the rotated dims do and the others are absorbed into the query (with the key
    bias). Those dims cached once per token (``keys``) or rebuilt at every step (``latent``). Each on a
    Llama-shaped model with half the head dims rotated and GQA."""
    model = family_model("llama", "dar", dar_inference_cache=mode, **keys)
    lengths, N = [7, 13], 20
    check_decoding(model, lengths, N, seed=3)


def full_forward_argmax(model, prompt: torch.Tensor, tokens: list[int]) -> list[int]:
    """The greedy choice after the prompt and each of ``tokens`` but the last, by one full forward over them all (a
    causal model: position ``t``'s logits are those of a forward over the first ``t + 1`` tokens; padding ids
    excluded). Greedy generation gave ``tokens`` exactly when this returns them."""
    seq = torch.cat([prompt, torch.tensor(tokens[:-1], dtype=prompt.dtype)])
    with torch.inference_mode():
        logits = model(seq[None])[0, prompt.numel() - 1:]
        logits[:, model.cfg.vocab_size:] = float("-inf")
        return logits.argmax(-1).tolist()


@pytest.mark.parametrize("family", ["gpt_neox", "qwen3"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_generation_equals_rerunning_the_full_forward(family, variant):
    """64 greedy tokens through the caches are the full forward's choices at every position; the batch of unequal
    prompts gives each prompt's one-by-one result."""
    model = family_model(family, variant, seed=4)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, model.cfg.vocab_size, (n,), generator=g) for n in (6, 13, 3)]
    batched = generate(model, prompts, 64)
    assert [c.finish_reason for c in batched] == ["length"] * 3
    assert batched[0].token_ids == full_forward_argmax(model, prompts[0], batched[0].token_ids)
    for p, c in zip(prompts, batched):
        assert generate(model, [p], 64)[0].token_ids == c.token_ids


@pytest.mark.parametrize("variant", ["dar", "aha", "mswa"])
def test_sampling_is_reproducible_and_independent_of_the_batch(variant):
    """With one generator per prompt (seed + index), a sampled completion is the same alone or in a batch."""
    model = family_model("llama", variant, seed=6)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, model.cfg.vocab_size, (n,), generator=g) for n in (4, 9)]
    sampling = Sampling(temperature=1.5, top_k=50, top_p=0.9)
    together = generate(model, prompts, 16, sampling=sampling, seeds=[10, 11])
    alone = [generate(model, [p], 16, sampling=sampling, seeds=[s])[0] for p, s in zip(prompts, (10, 11))]
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    assert together[0].token_ids != generate(model, prompts[:1], 16, sampling=sampling, seeds=[12])[0].token_ids


def test_generation_stops_at_eos_and_at_a_stop_rule():
    model = family_model("qwen2", "swa", seed=8)
    prompt = torch.arange(5, 12)
    free = generate(model, [prompt], 10)[0].token_ids
    eos = free[3]
    first = free.index(eos)
    at_eos = generate(model, [prompt, prompt], 10, eos_ids=(eos,))
    assert [c.token_ids for c in at_eos] == [free[:first + 1]] * 2 and at_eos[0].finish_reason == "eos"
    stopped = generate(model, [prompt], 10, stop=lambda row, ids: len(ids) == 2)[0]
    assert stopped.token_ids == free[:2] and stopped.finish_reason == "stop"


@pytest.mark.parametrize("variant", ["vanilla", "swa", "mswa", "aha", "dar", "dar-latent", "uniform", "linear",
                                     "dimpo", "mixed"])
@pytest.mark.parametrize("family", ["olmo2", "gpt_neox"])
@pytest.mark.parametrize("context", [3, 40])
def test_cache_bytes_equal_the_describe_formula(variant, family, context):
    """A full cache of one sequence holds exactly what ``describe`` prints per layer (numbers per token times the
    context; float32): at a context shorter and longer than the windows, with GQA (a key/value head shared by MSWA
    query heads of different windows keeps the widest), with a key norm (OLMo-2: DAR caches whole far keys) and
    partial rotary (GPT-NeoX: DAR caches the rotated quarter)."""
    latent = variant == "dar-latent"
    model = family_model(family, "dar" if latent else variant, **({"dar_inference_cache": "latent"} if latent else {}))
    cache = model.new_cache([context - 1], 1)
    expected = sum(kv_cache_bytes_per_token(SimpleNamespace(model=model.cfg), context, "fp32")) * context
    assert cache.nbytes() == pytest.approx(expected, rel=1e-12)


def test_mswa_key_value_heads_keep_the_widest_window_of_their_query_heads():
    model = family_model("llama", "mswa", mswa_windows=[[1, 2, 4, 8], [2, 2, 3, 16]])
    cache = model.new_cache([3], 30)
    per_layer = [[(g.window, g.ring.slots, g.ring.data["k"].shape[1]) for g in c.groups] for c in cache.layers]
    assert per_layer == [[(2, 2, 1), (8, 8, 1)], [(2, 2, 1), (16, 16, 1)]]


def test_aha_local_heads_read_only_their_window():
    """With every gate closed, poisoning the cached keys older than the window changes nothing (they are never
    read); with every gate open the model is vanilla attention."""
    model = family_model("qwen3", "aha", seed=9)
    prompt = torch.arange(3, 23)
    with torch.inference_mode():
        for m in model.attention_modules():
            m.router.weight.fill_(0.0)
            m.threshold = 0.9  # s = 0.5 everywhere: closed
        reference = generate(model, [prompt], 8)[0].token_ids
        cache = model.new_cache([prompt.numel()], 8)
        logits = model.prefill([prompt], cache)
        for layer in cache.layers:
            for t in layer.groups[0].ring.data.values():
                t[:, :, :prompt.numel() - W] = float("nan")
        ids = []
        for _ in range(8):
            ids.append(int(logits[0, :model.cfg.vocab_size].argmax()))
            logits = model.decode(torch.tensor([[ids[-1]]]), cache)[:, -1]
        assert ids == reference and torch.isfinite(logits).all()
        for m in model.attention_modules():
            m.threshold = 0.1  # open: full attention
        vanilla = family_model("qwen3", "vanilla", seed=9)
        vanilla.load_state_dict({k: v for k, v in model.state_dict().items() if "router" not in k})
        assert generate(model, [prompt], 8)[0].token_ids == generate(vanilla, [prompt], 8)[0].token_ids


def test_aha_mu_f_counts_the_generated_tokens():
    """``stats`` holds the gates of the generated tokens processed (all but each row's last), real rows only."""
    from neox_dar.evaluation.scoring import AttentionStatsMean, overall_means

    model = family_model("llama", "aha", seed=10)
    stats, prompt_stats = AttentionStatsMean(model), AttentionStatsMean(model)
    generate(model, [torch.arange(4, 9), torch.arange(4, 7)], 6, stats=stats, prompt_stats=prompt_stats)
    assert {float(c) for c in stats.counts.values()} == {2 * 5}
    assert {float(c) for c in prompt_stats.counts.values()} == {5 + 3}
    assert 0.0 < overall_means(stats.result())["mu_f"] < 1.0


def test_prompts_longer_than_the_positions_and_empty_prompts_are_errors():
    model = family_model("gpt_neox", "dar", max_position_embeddings=24, seq_length=24)
    with pytest.raises(GenerationError, match="prompt 1 has 24 tokens; max_position_embeddings=24"):
        generate(model, [torch.arange(3), torch.arange(24)], 4)
    with pytest.raises(GenerationError, match="prompt 0 is empty"):
        generate(model, [[]], 4)
    with pytest.raises(GenerationError, match="max_new_tokens must be >= 1"):
        generate(model, [[1, 2]], 0)
    near = generate(model, [torch.arange(20), torch.arange(3)], 10)  # the first row stops at position 23
    assert [len(c.token_ids) for c in near] == [4, 10] and near[0].finish_reason == "length"


# ----------------------------------------------------------------------------------------------
# command line


def _cli(capsys, *args):
    """``python -m neox_dar.generate ARGS`` in this process: (exit code, stdout, stderr)."""
    from neox_dar.generate.__main__ import main

    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def dar_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("dar_run")
    saved_run(root, "attention_type=dar", "window_size=4", "dar_d_down=16", "max_position_embeddings=40", seed=11)
    return root


def test_cli_writes_one_line_per_prompt_equal_to_the_library(dar_run, tmp_path, capsys):
    from neox_dar.generate import load

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "The capital of France is", "id": "a"}) + "\n\n"
                       + json.dumps("Water boils at") + "\n" + json.dumps({"prompt": "One"}) + "\n")
    out = tmp_path / "new" / "out.jsonl"  # a missing folder is created
    code, _, err = _cli(capsys, dar_run, "--prompts", prompts, "--max-new-tokens", 7, "--batch-size", 2, "--out", out)
    assert code == 0, err
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["prompt"] for x in lines] == ["The capital of France is", "Water boils at", "One"]
    assert lines[0]["id"] == "a" and all(x["finish_reason"] == "length" for x in lines)
    gen = load(dar_run, "cpu")
    for x in lines:
        ids = generate(gen.model, [gen.encode(x["prompt"])], 7, gen.eos_ids)[0].token_ids
        assert x["token_ids"] == ids and x["completion"] == gen.decode(ids)
    code, streamed, _ = _cli(capsys, dar_run, "--prompt", "The capital of France is", "--max-new-tokens", 7)
    assert code == 0 and streamed.strip() == lines[0]["completion"].strip()


@pytest.mark.parametrize("args, message", [
    (["--prompt", "word " * 45, "--max-new-tokens", "3"], "prompt 0 has 46 tokens; max_position_embeddings=40 leaves no position"),
    (["--prompt", "", "--max-new-tokens", "3"], "--prompt is empty"),
    (["--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["--prompt", "hi", "--max-new-tokens", "2", "--top-k", "5"], "top_k/top_p have no effect with temperature 0"),
    (["--prompts", "missing.jsonl", "--max-new-tokens", "2"], "prompt file not found"),
], ids=["too-long", "empty", "zero-new-tokens", "top-k-greedy", "missing-file"])
def test_cli_bad_input_is_a_one_line_error(dar_run, args, message, capsys):
    code, _, err = _cli(capsys, dar_run, *args)
    assert code == 2 and message in err and err.count("\n") == 1 and err.startswith("error: "), err


def test_cli_empty_prompt_in_a_file_and_a_checkpoint_without_a_tokenizer(dar_run, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps("fine") + "\n" + json.dumps({"prompt": ""}) + "\n")
    assert _cli(capsys, dar_run, "--prompts", prompts, "--max-new-tokens", 2) == (2, "", "error: prompt 1 is empty\n")
    saved_model(tmp_path / "llama", "model_family=llama", "norm=rmsnorm", "activation=swiglu", "fused_qkv=false",
                "rotary_pct=1.0", "gpt_j_residual=false", "vocab_file=null")
    code, _, err = _cli(capsys, tmp_path / "llama", "--prompt", "hi", "--max-new-tokens", 2)
    assert code == 2 and "records no tokenizer" in err and err.count("\n") == 1, err
    saved_model(tmp_path / "missing", "vocab_file=nowhere/tokenizer.json")
    code, _, err = _cli(capsys, tmp_path / "missing", "--prompt", "hi", "--max-new-tokens", 2)
    assert code == 2 and "was not found (looked for" in err and err.count("\n") == 1, err


CUDA_MESSAGE = ("this machine has" if torch.cuda.is_available() else "CUDA is not available on this machine")


@pytest.mark.parametrize("args, message", [
    (["--temperature", "inf"], "temperature must be 0 (greedy) or a finite number >= 1e-06, got inf"),
    (["--temperature", "nan"], "temperature must be 0 (greedy) or a finite number >= 1e-06, got nan"),
    (["--temperature", "1e-300"], "temperature must be 0 (greedy) or a finite number >= 1e-06, got 1e-300"),
    (["--temperature", "1", "--top-p", "nan"], "top_p must be in (0, 1], got nan"),
    (["--seed", "-1"], "--seed must be in [0, 2**63), got -1"),
    (["--device", "potato"], "--device 'potato' is not a device (cpu, cuda, cuda:N or mps)"),
    (["--device", "meta"], "--device 'meta' is not a device (cpu, cuda, cuda:N or mps)"),
    (["--device", "cuda:99"], f"--device cuda:99: {CUDA_MESSAGE}"),
    (["--out", "{tmp}"], "--out {tmp} is a directory: name a file to write"),
    (["--out", "{tmp}/garbage.json/out.jsonl"],
     "--out {tmp}/garbage.json/out.jsonl: {tmp}/garbage.json is a file, not a folder"),
    (["--tokenizer", "{tmp}/garbage.json"], "{tmp}/garbage.json is not a Hugging Face tokenizer.json"),
], ids=["temperature-inf", "temperature-nan", "temperature-tiny", "top-p-nan", "seed", "device-potato",
        "device-meta", "device-cuda", "out-directory", "out-under-a-file", "garbage-tokenizer"])
def test_cli_settings_and_outputs_are_checked_before_the_model_loads(args, message, tmp_path, capsys):
    """Each bad setting is one line, found before anything loads: the checkpoint here does not even exist."""
    (tmp_path / "garbage.json").write_text('{"model": 3}')
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, _, err = _cli(capsys, tmp_path / "no-checkpoint", "--prompt", "hi", "--max-new-tokens", 2, *args)
    message = message.replace("{tmp}", str(tmp_path))
    assert code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize("content, message", [
    (b'{"prompt": "\\ud800"}\n', "p.jsonl:1: holds a lone surrogate ('\\ud800'), which is not Unicode text"),
    (b'"fine"\n{"prompt": "ok", "id": "\\udc80"}\n', "p.jsonl:2: holds a lone surrogate"),
    (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "p.jsonl:1: not valid JSON (nested too deeply)"),
    (b'{"prompt": "caf\xe9"}\n', "p.jsonl is not UTF-8 text (byte 0xe9 at offset 15)"),
], ids=["surrogate", "surrogate-in-another-field", "nested", "not-utf8"])
def test_cli_prompt_files_that_are_not_text_are_one_line(content, message, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(content)
    code, _, err = _cli(capsys, tmp_path / "no-checkpoint", "--prompts", prompts, "--max-new-tokens", 2)
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_a_prompt_from_the_command_line_with_undecodable_bytes_is_one_line(tmp_path, capsys):
    """Python keeps bytes of the command line that are not UTF-8 as lone surrogates (surrogateescape)."""
    code, _, err = _cli(capsys, tmp_path / "no-checkpoint", "--prompt", "caf\udce9", "--max-new-tokens", 2)
    assert (code, err) == (2, "error: --prompt is not UTF-8 text (byte 0xe9)\n")


def test_sampling_refuses_non_finite_settings():
    for bad in (float("inf"), float("nan"), 1e-300, -1.0):
        with pytest.raises(GenerationError, match="temperature must be 0"):
            Sampling(bad)
    with pytest.raises(GenerationError, match="top_p must be in"):
        Sampling(1.0, top_p=float("nan"))


def test_generation_stops_at_every_eos_of_the_folders_generation_config(tmp_path):
    """Instruct models list several eos ids in generation_config.json (Llama-3's ``<|eot_id|>`` and
    ``<|end_of_text|>``, Qwen's ``<|im_end|>`` and ``<|endoftext|>``): a row ends at any of them, as transformers'
    ``generate`` ends it; ``from-hf`` keeps the file and ``to-hf`` writes the list again. (Before: only the
    tokenizer's eos ended a row, and the export wrote it alone.)"""
    from builders import ROOT, hf_folder
    from transformers import AutoModelForCausalLM, GenerationConfig

    from neox_dar.convert import main as convert_main
    from neox_dar.generate import load
    from neox_dar.tiny_hf_model import write_tokenizer_files

    folder, eos = tmp_path / "hf", 256  # the byte tokenizer's <|endoftext|>
    hf = hf_folder(folder, "qwen2", vocab=264)
    write_tokenizer_files(folder, chat_template=None, tokenizer=ROOT / "data" / "byte_tokenizer.json")
    prompt = [84, 104, 101, 32, 99]
    free = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                       pad_token_id=0)[0, 5:].tolist()
    k = next(i for i in range(2, len(free)) if free[i] not in free[:i])  # a token the row reaches, not at once
    assert eos not in free[:k + 1]
    GenerationConfig(bos_token_id=eos, eos_token_id=[eos, free[k]]).save_pretrained(folder)
    theirs = AutoModelForCausalLM.from_pretrained(folder).generate(torch.tensor([prompt]), max_new_tokens=8,
                                                                   do_sample=False, pad_token_id=0)[0, 5:].tolist()
    gen = load(folder, "cpu")
    done = generate(gen.model, [prompt], 8, gen.eos_ids)[0]
    assert gen.eos_ids == (eos, free[k]) and done.finish_reason == "eos"
    assert done.token_ids == theirs == free[:k + 1]
    assert convert_main(["from-hf", str(folder), str(tmp_path / "imported")]) == 0
    assert load(tmp_path / "imported", "cpu").eos_ids == (eos, free[k])
    assert convert_main(["to-hf", str(tmp_path / "imported"), str(tmp_path / "export")]) == 0
    assert json.loads((tmp_path / "export" / "generation_config.json").read_text())["eos_token_id"] == [eos, free[k]]


def test_sampling_defaults_to_transformers_top_k_and_zero_turns_it_off(tmp_path):
    """transformers' generate samples from the 50 most likely tokens unless told otherwise; an unset top_k is that
    here too (it was every token: our samples and those of the same model exported to Hugging Face differed), and
    top_k 0 is every token, as there (it was refused)."""
    from neox_dar.generate import DEFAULT_TOP_K

    assert DEFAULT_TOP_K == 50
    model = family_model("llama", "vanilla", seed=6)
    prompt = [torch.arange(3, 9)]
    unset, fifty, every = (generate(model, prompt, 12, sampling=Sampling(1.5, top_k=k), seeds=[4])[0].token_ids
                           for k in (None, 50, 0))
    assert unset == fifty and unset != every
    assert [type(w).__name__ for w in Sampling(1.0).warpers()] == ["TemperatureLogitsWarper", "TopKLogitsWarper"]
    assert [type(w).__name__ for w in Sampling(1.0, top_k=0).warpers()] == ["TemperatureLogitsWarper"]
    with pytest.raises(GenerationError, match="top_k must be >= 0"):
        Sampling(1.0, top_k=-1)


def test_cli_ctrl_c_is_one_line_and_exit_130_and_leaves_the_earlier_out(dar_run, monkeypatch, tmp_path, capsys):
    """Ctrl-C during generation (a 40-line traceback before) is one line, exit 130: an earlier --out file is left as
    it was (it was emptied at the start), and FILE.partial holds the prompts finished before; a run that completes
    replaces FILE."""
    import neox_dar.generate.__main__ as cli

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(w) + "\n" for w in ("One", "Two", "Three")))
    out = tmp_path / "o.jsonl"
    out.write_text("an earlier run's lines\n")
    batches = []

    def second_batch_interrupted(*args, **kwargs):
        batches.append(1)
        if len(batches) == 2:
            raise KeyboardInterrupt
        return generate(*args, **kwargs)

    monkeypatch.setattr(cli, "generate", second_batch_interrupted)
    code, _, err = _cli(capsys, dar_run, "--prompts", prompts, "--max-new-tokens", 2, "--batch-size", 2, "--out", out)
    partial = tmp_path / "o.jsonl.partial"
    assert code == 130 and err.splitlines()[-1] == (f"interrupted (Ctrl-C): {partial} holds the prompts finished "
                                                    f"before; {out} is left as it was")
    assert out.read_text() == "an earlier run's lines\n"
    assert [json.loads(x)["prompt"] for x in partial.read_text().splitlines()] == ["One", "Two"]
    monkeypatch.setattr(cli, "generate", generate)
    assert _cli(capsys, dar_run, "--prompts", prompts, "--max-new-tokens", 2, "--out", out)[0] == 0
    assert [json.loads(x)["prompt"] for x in out.read_text().splitlines()] == ["One", "Two", "Three"]
    assert not partial.exists()


def test_cli_refuses_to_write_over_its_prompts(tmp_path, capsys):
    """--out naming the --prompts file (it was replaced by the completions): one line, before anything loads."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps("hi") + "\n")
    code, _, err = _cli(capsys, tmp_path / "no-checkpoint", "--prompts", prompts, "--max-new-tokens", 2, "--out",
                        tmp_path / "." / "p.jsonl")
    assert code == 2 and err == f"error: --out {tmp_path / 'p.jsonl'} is the --prompts file: it would be replaced by " \
                                "the completions\n", err
    assert prompts.read_text() == json.dumps("hi") + "\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the triton path runs on this machine")
def test_the_triton_path_where_it_cannot_run_is_one_line(dar_run, capsys, monkeypatch):
    """--attention-impl triton on a machine without CUDA, in generate and eval.perplexity: the AttentionImplError's
    one line, exit 2 (a traceback at the first forward before)."""
    from neox_dar.evaluation.cli import main as perplexity

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the tests' own interpreter, which would run it

    code, _, err = _cli(capsys, dar_run, "--prompt", "hi", "--max-new-tokens", 2, "--attention-impl", "triton")
    assert code == 2 and err.startswith("error: attention_impl 'triton' needs a CUDA device") and err.count("\n") == 1
    assert perplexity([str(dar_run), "--corpora", "c4", "--max-docs", "1", "--no-progress", "--no-wandb",
                       "--attention-impl", "triton"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: attention_impl 'triton' needs a CUDA device") and err.count("\n") == 1, err


def test_a_folder_without_a_model_config_says_which_files_it_lacks(tmp_path, capsys):
    """Weights alone (it said "config file not found: .../config.yml", a file the user never had to write)."""
    (tmp_path / "model.safetensors").write_bytes(b"")
    code, _, err = _cli(capsys, tmp_path, "--prompt", "hi", "--max-new-tokens", 2)
    assert code == 2 and err == (f"error: {tmp_path} holds no model config: no model.yml or config.yml (a neox-dar "
                                 "checkpoint or import), no config.json (a Hugging Face folder)\n")


@pytest.mark.parametrize("attention_type", ["swa", "mswa", "dar", "uniform", "aha", "vanilla"])
def test_several_new_tokens_into_a_ring_not_yet_full_equal_the_forward(attention_type):
    """Three tokens in one decode call after a 6-token prompt, window 8 (the ring not yet full): the logits equal the
    full forward's. (The ring's read padded its empty slots with the new columns' numbers, and they were read as
    keys: 0.1-2.4 off in a chunked prefill or an export's forward with past_key_values.)"""
    from neox_dar.config import load_config
    from neox_dar.model import build_model

    cfg = load_config("configs/tiny.yml", overrides=[f"attention_type={attention_type}", "window_size=8",
                                                     "attention_impl=sdpa"]).model
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    prompt, more = torch.randint(0, 50000, (6,)), torch.randint(0, 50000, (1, 3))
    with torch.no_grad():
        cache = model.new_cache([6], 10)
        model.prefill([prompt], cache)
        torch.testing.assert_close(model.decode(more, cache), model(torch.cat([prompt[None], more], 1))[:, 6:],
                                   atol=1e-4, rtol=1e-4)
