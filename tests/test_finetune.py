"""Continued training from pretrained models: finetune from load='s weights, new variant parameters (DAR's PCA
bottleneck, AHA's router), trainable_params and LoRA, through train.py and DeepSpeed."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
import torch
from builders import ROOT, config, hf_folder
from safetensors.torch import load_file
from trainrun import BYTES, error_line, losses, rows, train

from neox_dar.saved_model import load_model
from neox_dar.config import ConfigError
from neox_dar.model import build_model
from neox_dar.rundir import step_dir_name
from neox_dar.training.checkpointing import safe_torch_load
from neox_dar.training.checks import check_what_trains
from neox_dar.training.finetune import add_lora, attention_inputs, initialise_new, merge_lora

BOTTLENECK = 'trainable_params=["*.dar_down.*","*.dar_up.*"]'


@pytest.fixture(scope="module")
def data(byte_tokenized_sample) -> str:
    """The byte-tokenized sample (trainrun.BYTES): fine-tuning is what is checked, and with a 257-token vocabulary
    the imported model's steps and checkpoints are cheap."""
    return byte_tokenized_sample


@pytest.fixture(scope="module")
def olmo(tmp_path_factory) -> Path:
    """A tiny random OLMo-2 made by transformers (the byte tokenizer's vocabulary, so it trains on ``data``),
    imported with ``from-hf`` (the command's ``main``, in this process): our checkpoint folder, with its
    ``model.yml``."""
    from neox_dar.convert import main as convert

    root = tmp_path_factory.mktemp("olmo")
    hf_folder(root / "hf", "olmo2", vocab=257, shard="200KB")
    assert convert(["from-hf", str(root / "hf"), str(root / "ours")]) == 0
    return root / "ours"


def _stage(olmo: Path, *extra: str) -> list[str]:
    return [str(olmo / "model.yml"), *BYTES, "configs/attention/dar.yml", f"load={olmo}", "finetune=true",
            "window_size=8", *extra]


def _optimizer_numel(step_dir: Path) -> int:
    """Elements the ZeRO optimizer holds fp32 state for, over every rank's file (padding excluded)."""
    total = 0
    for path in glob.glob(str(step_dir / "*optim_states.pt")):
        state = safe_torch_load(path)["optimizer_state_dict"]
        groups = state["single_partition_of_fp32_groups"]
        for flat, pad in zip(groups, state["group_paddings"]):
            total += flat.numel() - pad
        adam = state["base_optimizer_state"]["state"]
        assert sorted(adam) == list(range(len(groups)))  # Adam moments for exactly these flat groups
        for i, flat in enumerate(groups):
            assert adam[i]["exp_avg"].numel() == adam[i]["exp_avg_sq"].numel() == flat.numel()
    return total


def _start(olmo: Path, *files: str, **keys) -> dict[str, torch.Tensor]:
    """The weights a finetune run of ``olmo`` starts from, built as the trainer builds them (seeded model, the
    import's weights loaded, new parameters initialised; no calibration)."""
    from neox_dar.training.finetune import load_pretrained

    cfg = config("configs/tiny.yml", olmo / "model.yml", *files, **keys)
    torch.manual_seed(cfg.training.seed)
    model = build_model(cfg.model)
    initialise_new(model, load_pretrained(model, cfg, olmo), [])
    return {k: v.detach().clone() for k, v in model.weights().items()}


STAGE_ONE_STEPS = 4


@pytest.fixture(scope="module")
def stage_one(olmo, data, tmp_path_factory):
    """``stage_one(zero)``: (run directory, stdout) of DAR stage 1 on the import under ZeRO-``zero``, 4 steps at a
    high learning rate; each stage trained once, when first asked for (stage two continues from ZeRO-1's)."""
    runs = {}

    def run(zero: int) -> tuple[Path, str]:
        if zero not in runs:
            save = tmp_path_factory.mktemp(f"stage1-zero{zero}")
            out = train(save, data, *_stage(
                olmo, BOTTLENECK, f"train_iters={STAGE_ONE_STEPS}", "eval_interval=0",
                f"checkpoint_factor={STAGE_ONE_STEPS}", f"zero_optimization.stage={zero}", "optimizer.params.lr=3e-2"))
            runs[zero] = save, out.stdout
        return runs[zero]
    return run


@pytest.mark.parametrize("stage", [1, 2])
def test_stage_one_trains_only_the_bottleneck(olmo, stage_one, stage):
    """DAR stage 1 on an imported model, 4 steps under ZeRO-``stage``: every parameter outside the patterns is
    bit-identical to the import, every bottleneck parameter changed, and the optimizer holds state for the
    bottleneck only."""
    save, stdout = stage_one(stage)
    assert "training 4,096 of 98,944 parameters" in stdout
    imported = load_file(str(olmo / "model.safetensors"))
    start = _start(olmo, "configs/attention/dar.yml", window_size=8)
    step_dir = save / "checkpoints" / step_dir_name(STAGE_ONE_STEPS)
    end = load_file(str(step_dir / "model.safetensors"))
    bottleneck = sorted(k for k in end if ".dar_" in k)
    assert len(bottleneck) == 4 and set(end) == set(imported) | set(bottleneck)
    for name, tensor in imported.items():
        assert torch.equal(end[name], tensor), name
    for name in bottleneck:
        assert (end[name] != start[name]).all(), name
    assert _optimizer_numel(step_dir) == sum(end[k].numel() for k in bottleneck) == 4096


def test_stage_two_resets_step_schedule_optimizer_and_resumes_exactly(olmo, stage_one, data, tmp_path):
    """Stage 2 (everything trains) from stage 1's final checkpoint (step 4): a new run at step 1 with a fresh
    schedule and Adam state (step count = its own steps); stopped after step 3 and run again, it repeats the
    uninterrupted run's losses bit for bit."""
    stage1, _ = stage_one(1)
    keys = [*_stage(olmo), f"load={stage1}", "train_iters=6", "optimizer.params.lr=1e-3", "eval_interval=0",
            "zero_optimization.stage=1"]
    full, resumed = tmp_path / "stage2", tmp_path / "stage2-resumed"
    train(full, data, *keys)
    log = rows(full)
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3, 4, 5, 6]
    from neox_dar.config import load_config
    from neox_dar.training.optim import lr_at

    assert log[0]["lr"] == pytest.approx(lr_at(load_config(full / "config.yml"), 0))  # the schedule's first step
    adam = safe_torch_load(glob.glob(str(full / "checkpoints" / step_dir_name(6) / "*optim_states.pt"))[0])
    steps = {int(s["step"]) for s in adam["optimizer_state_dict"]["base_optimizer_state"]["state"].values()}
    assert steps == {6}
    out = train(resumed, data, *keys, "exit_interval=3", expect=3)
    assert "finetuning from" in out.stdout
    out = train(resumed, data, *keys, "exit_interval=3")
    assert "resumed from" in out.stdout and "finetuning from" not in out.stdout
    assert losses(resumed) == losses(full)


def test_a_weights_only_load_needs_finetune(olmo, data, tmp_path):
    """Refused by train.py's checks, before the run directory is made (it was made, with a failed status)."""
    out = train(tmp_path / "x", data, str(olmo / "model.yml"), *BYTES, f"load={olmo}", expect=2)
    assert "set finetune=true" in out.stderr and not (tmp_path / "x").exists()
    # with a variant added too (a stage 1 recipe without finetune): the same line, not "another model" (it named
    # the attention keys the variant adds, which finetune=true takes)
    out = train(tmp_path / "y", data, str(olmo / "model.yml"), *BYTES, f"load={olmo}", "attention_type=dar",
                "dar_d_down=16", expect=2)
    assert "set finetune=true" in error_line(out) and "another model" not in out.stderr
    assert not (tmp_path / "y").exists()


def test_finetune_refuses_another_base_model(olmo, data, tmp_path):
    out = train(tmp_path / "x", data, *_stage(olmo, "intermediate_size=64"), expect=2)
    assert "another base model" in out.stderr and "intermediate_size" in out.stderr


def test_trainable_pattern_matching_nothing_is_a_config_error():
    with pytest.raises(ConfigError, match=r"'trainable_params' in the command line: '\*\.dar_dwon\.\*'"):
        check_what_trains(config("configs/tiny.yml", "configs/attention/dar.yml", trainable_params=["*.dar_dwon.*"]))
    with pytest.raises(ConfigError, match="query_key_value"):
        check_what_trains(config("configs/tiny.yml", **{"lora.target_modules": ["query_key_value"]}))
    # DAR reads dar_up's weight (folded into the key/value weights): its adapter never got a gradient; dar_down is
    # called, so an adapter there trains
    with pytest.raises(ConfigError, match=r"lora.target_modules.*'dar_up'.*the dar attention reads this layer's "
                                          r"weight directly"):
        check_what_trains(config("configs/tiny.yml", "configs/attention/dar.yml",
                                 **{"lora.target_modules": ["dar_up", "dar_down"]}))
    check_what_trains(config("configs/tiny.yml", "configs/attention/dar.yml", **{"lora.target_modules": ["dar_down"]}))
    # a tied head (Llama-3.2-1B): the merged head could not stay tied, so no checkpoint of the run loaded
    with pytest.raises(ConfigError, match=r"'lm_head'.*shares its weight with the input embedding"):
        check_what_trains(config("configs/llama-3.2-1b.yml", **{"lora.target_modules": ["q_proj", "lm_head"]}))
    check_what_trains(config("configs/olmo-2-0425-1b.yml", **{"lora.target_modules": ["lm_head"]}))  # untied


# ----------------------------------------------------------------------------------------------
# new parameters


def _imported(olmo: Path, **keys):
    """The import with ``keys`` (a variant) on top: (model with the import's weights, new parameter names)."""
    from neox_dar.training.finetune import load_pretrained

    cfg = config("configs/tiny.yml", olmo / "model.yml", **keys)
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    return model, load_pretrained(model, cfg, olmo), cfg


def test_pca_bottleneck_is_the_best_rank_d_down_reconstruction(olmo):
    """dar_init: pca: at step 0 each layer's ``dar_up(dar_down(a))`` on the calibration sequences has the squared
    error of the rank-d_down SVD bound (the sum of the discarded eigenvalues), within 1e-4."""
    model, new, _ = _imported(olmo, attention_type="dar", window_size=8, dar_d_down=12, dar_init="pca")
    calibration = [torch.randint(0, 257, (32,), generator=torch.Generator().manual_seed(i)) for i in range(6)]
    lines = initialise_new(model, new, calibration)
    assert len(lines) == 2 and "calibrated on 192 tokens" in lines[1]
    for module in model.attention_modules():
        a = attention_inputs(model, module, calibration).double()
        with torch.no_grad():
            recon = module.dar_up(module.dar_down(a.float())).double()
        error = (a - recon).square().sum()
        bound = torch.linalg.eigvalsh(a.T @ a)[:-12].clamp(min=0).sum()
        assert error.item() == pytest.approx(bound.item(), rel=1e-4)


def test_aha_router_start_is_pinned(olmo):
    """aha_router_init: zeros gives s = 1/2: at aha_threshold 0.5 step 0 is the SWA model with the same window, at
    aha_threshold 0.49 the imported (vanilla) model itself."""
    x = torch.randint(0, 257, (2, 40), generator=torch.Generator().manual_seed(1))
    swa, _, _ = _imported(olmo, attention_type="swa", window_size=6)
    vanilla, _, _ = _imported(olmo)
    for threshold, reference in ((0.5, swa), (0.49, vanilla)):
        aha, new, _ = _imported(olmo, attention_type="aha", window_size=6, aha_threshold=threshold)
        assert {n.rsplit(".", 2)[-2] for n in new} == {"router"}
        initialise_new(aha, new, [])
        with torch.no_grad():
            torch.testing.assert_close(aha(x), reference(x), atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------
# LoRA


def test_lora_merge_equals_the_adapted_model():
    """peft's adapters on q/k/v/o of a Llama-family model: merging them into plain weights (what checkpoints save)
    gives the adapted model's logits."""
    cfg = config("configs/llama-3.2-1b.yml", **{"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                                "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 96,
                                                "vocab_size": 512, "seq_length": 32, "lora.r": 4})
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    # the run's log says where the adapters went: 2 layers x q/k/v/o; q, o 4 x (64 + 64), k, v 4 x (64 + 32)
    assert add_lora(model, cfg) == ("LoRA adapters attached: r=4, alpha=16, dropout=0 on 8 modules (k_proj, "
                                    "o_proj, q_proj, v_proj), 3,584 adapter parameters")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    x = torch.randint(0, 512, (2, 16))
    with torch.no_grad():
        adapted = model(x)
    merged = merge_lora({k: v for k, v in model.state_dict().items()}, cfg.training.lora.alpha / cfg.training.lora.r)
    plain = build_model(cfg.model).eval()
    plain.load_weights(merged)
    with torch.no_grad():
        torch.testing.assert_close(plain(x), adapted, atol=1e-5, rtol=1e-5)


def test_lora_run_trains_adapters_and_saves_merged_weights(data, tmp_path):
    """A Llama-family run with LoRA on q/k/v/o plus the norms (MSWA Sec. 5.2's recipe shape): the optimizer holds
    the adapters and norms only, the checkpoint's model.safetensors has the plain names (loadable anywhere), and
    only the adapted and trainable weights moved."""
    keys = ["configs/llama-3.2-1b.yml", "num_layers=2", "hidden_size=64", "num_attention_heads=4", "num_kv_heads=2",
            "head_dim=16", "intermediate_size=96", *BYTES, "max_position_embeddings=2048",
            "lora.r=4", 'trainable_params=["*norm*"]', "optimizer.params.lr=1e-2", "zero_optimization.stage=2",
            "eval_interval=0", "checkpoint_factor=3"]
    save = tmp_path / "lora"
    train(save, data, *keys)
    first = load_file(str(save / "checkpoints" / step_dir_name(3) / "model.safetensors"))
    last = load_file(str(save / "checkpoints" / step_dir_name(6) / "model.safetensors"))
    assert not any("lora" in k or "base_layer" in k for k in last)
    model, _ = load_model(save)  # plain names: evaluation, conversion and generation read it as any checkpoint
    assert set(model.weights()) == set(last)
    moved = {k.rsplit(".", 2)[-2] for k in last if not torch.equal(first[k], last[k])}
    assert moved == {"q_proj", "k_proj", "v_proj", "o_proj", "input_layernorm", "post_attention_layernorm", "norm"}
    # per layer: q and o adapters (64 -> 64) 2 * 4 * (64 + 64), k and v (64 -> 32) 2 * 4 * (64 + 32); norms 2 * 64
    lora, norms = 2 * (2 * 4 * 128 + 2 * 4 * 96), 2 * 2 * 64 + 64
    assert _optimizer_numel(save / "checkpoints" / step_dir_name(6)) == lora + norms


# ----------------------------------------------------------------------------------------------
# the papers' recipes and their sweeps


def test_recipes_hold_the_papers_hyperparameters():
    stage1 = config("configs/olmo-2-0425-1b.yml", "configs/finetune/dar-sft-stage1.yml")
    t = stage1.training
    assert (t.optimizer.params.lr, t.train_batch_size, t.warmup, t.lr_decay_style, stage1.model.seq_length) == \
        (3e-4, 512, 0.03, "linear", 2048)
    assert t.trainable_params == ["*.dar_down.*", "*.dar_up.*"] and stage1.run.finetune
    assert (stage1.model.attention.window_size, stage1.model.attention.dar_d_down) == (128, 512)
    stage2 = config("configs/olmo-2-0425-1b.yml", "configs/finetune/dar-sft-stage1.yml",
                    "configs/finetune/dar-sft-stage2.yml")
    assert stage2.training.optimizer.params.lr == 3e-5 and stage2.training.trainable_params is None
    control = config("configs/olmo-2-0425-1b.yml", "configs/finetune/dar-sft-stage1.yml",
                     "configs/finetune/dar-sft-control.yml")
    assert control.model.attention.dar_d_down == control.model.hidden_size == 2048
    aha = config("configs/olmo-2-0425-1b.yml", "configs/finetune/aha-sft.yml")
    a, t = aha.model.attention, aha.training
    assert (a.aha_threshold, a.aha_l1_coef, t.optimizer.params.lr, tuple(t.optimizer.params.betas),
            t.train_batch_size, t.warmup) == (0.5, 3e-4, 3e-5, (0.9, 0.95), 128, 0.03)
    mswa = config("configs/llama-2-7b.yml", "configs/finetune/mswa-lora.yml")
    t = mswa.training
    assert (t.lora.r, t.lora.alpha, t.train_iters, t.train_batch_size, mswa.model.seq_length, t.warmup_iters,
            t.lr_decay_style, t.optimizer.params.lr) == (8, 16.0, 2000, 32, 4096, 20, "constant", 2e-5)
    # SWA's window is a quarter of the sequence; MSWA's base window is the one whose summed windows match SWA's
    assert mswa.model.attention.window_size == 1165 and mswa.model.seq_length // 4 == 1024


@pytest.mark.parametrize("recipe", ["aha-sft", "mswa-lora", "dar-sft-stage1"])
def test_demo_config_sets_no_key_a_recipe_ignores(recipe):
    """configs/finetune/demo-cpu.yml layered on any recipe loads without a warning (it set dar_d_down, which AHA
    and MSWA runs ignore, so they warned on every load)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config("configs/olmo-2-0425-1b.yml", f"configs/finetune/{recipe}.yml", "configs/finetune/demo-cpu.yml")


def test_recipe_sweeps_plan(tmp_path):
    """Every sweep of configs/finetune/sweeps plans (every run checked for its world size and data) with the user's
    paths given on the command line."""
    import numpy as np

    from data_prep.chat import run as chat
    from neox_dar.data.indexed import IndexedDatasetWriter
    from neox_dar.sweep.__main__ import main as sweep
    from neox_dar.tiny_hf_model import write_tokenizer_files

    write_tokenizer_files(tmp_path)
    chat([str(ROOT / "data" / "sample" / "chat_sample.jsonl"), "--tokenizer", str(tmp_path), "--out",
          str(tmp_path / "chat"), "--workers", "1", "--no-progress"])
    tokens = IndexedDatasetWriter(tmp_path / "redpajama", np.uint16)
    tokens.add_document(np.arange(20000) % 31999)
    tokens.finalize()
    chat_keys = [f"train_data_paths=[{tmp_path / 'chat'}]", f"train_label_data_paths=[{tmp_path / 'chat_label'}]",
                 "load=ckpt/olmo2-sft"]
    for name, keys, runs in (("dar-sft-stage1", chat_keys, 6), ("dar-sft-stage2", chat_keys[:2], 6),
                             ("aha-sft", chat_keys, 5), ("aha-sft-l1", chat_keys, 4),
                             ("mswa-lora", [f"data_path={tmp_path / 'redpajama'}", "load=ckpt/llama2-7b"], 2)):
        out = tmp_path / "sweeps" / name
        assert sweep([str(ROOT / "configs" / "finetune" / "sweeps" / f"{name}.yml"), "plan", "--out", str(out),
                      *keys]) == 0, name
        assert len([p for p in out.iterdir() if (p / "config.yml").is_file()]) == runs, name
