"""Per-layer attention types (attention_config, hybrid; docs/attention.md): the GPT-NeoX form, the MSWA paper's
Sec. 4.4 hybrid and its window table over the MSWA layers, every variant in any layer, the config's rules and
warnings over the types in use, describe, the mixed-model class the sweeps and the report use, and a hybrid
run that resumes exactly."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from builders import ROOT, config, model_config
from trainrun import BYTES, losses, train

from neox_dar.variants import layer_types, mswa_window_table, variant, variants
from neox_dar.variants.layers import pattern
from neox_dar.config import Config, ConfigError, load_config, model_config_from_flat, model_flat
from neox_dar.describe import describe
from neox_dar.model import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

W8 = [8, 8, 16, 16, 32, 32, 64, 64]  # an MSWA row of layer group 0 at w = 128, 8 heads


def windows_by_layer(cfg) -> dict[int, list[int]]:
    with torch.device("meta"):
        model = build_model(cfg.model)
    return {m.layer_idx: m.windows for m in model.attention_modules() if m.name == "mswa"}


def test_hybrid_of_12_layers_is_the_papers_stack_with_one_window_table():
    """Sec. 4.4: four groups of 1 linear + 2 MSWA layers; the 8 MSWA layers taken together follow Table 1 (groups
    0,0,1,1,2,2,3,3), so each group of the stack holds one MSWA layer group."""
    cfg = config("configs/pythia-70m.yml", num_layers=12, hybrid="mswa_linear")
    a = cfg.model.attention
    assert layer_types(cfg.model) == ["linear", "mswa", "mswa"] * 4
    assert a.attention_type == "linear+mswa" and a.attention_config == [[["linear", "mswa", "mswa"], 4]]
    expected = {1: W8, 2: W8, 4: [2 * w for w in W8], 5: [2 * w for w in W8], 7: [4 * w for w in W8],
                8: [4 * w for w in W8], 10: [8 * w for w in W8], 11: [8 * w for w in W8]}
    assert windows_by_layer(cfg) == expected
    assert mswa_window_table(cfg.model) == list(expected.values())


def test_hybrid_of_24_layers_and_the_swa_variant():
    cfg = config("configs/pythia-70m.yml", num_layers=24, hybrid="mswa_linear")
    assert layer_types(cfg.model) == (["linear"] * 2 + ["mswa"] * 4) * 4
    table = mswa_window_table(cfg.model)  # 16 MSWA layers: four per layer group
    assert [row[0] for row in table] == [8] * 4 + [16] * 4 + [32] * 4 + [64] * 4
    swa = config("configs/pythia-70m.yml", num_layers=12, hybrid="swa_linear")
    assert layer_types(swa.model) == ["linear", "swa", "swa"] * 4 and swa.model.attention.attention_type == "linear+swa"


def test_six_layer_mix_puts_its_four_mswa_layers_in_four_groups():
    """Pythia-70M with [linear, mswa, mswa] x 2: the MSWA layers 1, 2, 4, 5 are the 1st..4th MSWA layers, groups
    0..3 (and the pure 6-layer MSWA model uses groups 0,1,1,2,3,3, test_attention_edges)."""
    cfg = config("configs/pythia-70m.yml", attention_config=[[["linear", "mswa", "mswa"], 2]])
    assert windows_by_layer(cfg) == {1: W8, 2: [2 * w for w in W8], 4: [4 * w for w in W8], 5: [8 * w for w in W8]}


def test_gpt_neox_attention_config_loads(tmp_path):
    neox = load_config(ROOT / "tests/fixtures/gpt-neox-pythia-70m.yml")  # "attention-config": [[["flash"], 6]]
    assert neox.model.attention.attention_type == "vanilla" and neox.model.attention.attention_config is None
    path = tmp_path / "neox.yml"
    path.write_text(json.dumps({"num-layers": 6, "attention-config": [[["global", "local"], 3]], "window_size": 4}))
    cfg = load_config(ROOT / "configs/pythia-70m.yml", path)
    assert layer_types(cfg.model) == ["vanilla", "swa"] * 3 and cfg.model.attention.attention_type == "vanilla+swa"
    assert [m.name for m in build_model(cfg.model).attention_modules()] == ["vanilla", "swa"] * 3


@pytest.mark.parametrize("keys,message", [
    ({"attention_config": [[["global", "lcoal"], 3]]}, r"invalid value for 'attention_config' in the command line: "
                                                       r"'lcoal' \(not an attention type: .*did you mean 'local'\?\)"),
    ({"attention_config": [[["mswx"], 6]]}, r"'mswx' .*did you mean 'mswa'\?"),
    ({"attention_config": [[["global", "local"], 2]]}, r"'attention_config'.*gives 4 layers but num_layers is 6"),
    ({"attention_config": [[["linear"], 0]]}, r"'attention_config'.*repeat >= 1"),
    ({"attention_config": [["global", 6]]}, r"wrong type for 'attention_config\[0\]\[0\]'"),
    ({"hybrid": "mswa_linear"}, r"'hybrid'.*needs num_layers divisible by 12.*not 6"),
    ({"hybrid": "mswa_lin"}, r"'hybrid'.*choose one of mswa_linear, swa_linear"),
    ({"num_layers": 12, "hybrid": "mswa_linear", "attention_type": "swa"},
     r"'attention_type'.*'swa' \(conflicts with attention_config, whose layers use linear, mswa"),
    ({"num_layers": 12, "hybrid": "mswa_linear", "attention_config": [[["linear", "mswa"], 6]]},
     r"'attention_config'.*differs from hybrid 'mswa_linear'"),
    ({"attention_config": [[["linear", "swa"], 3]], "window_size": 0}, r"'window_size'.*must be >= 1 for "
                                                                       r"attention_type 'swa'"),
])
def test_per_layer_mistakes_are_one_line_errors(keys, message):
    with pytest.raises(ConfigError, match=message) as e:
        config("configs/pythia-70m.yml", **keys)
    assert "\n" not in str(e.value)


def test_attention_type_may_name_a_type_in_use():
    """attention_type from a fragment (configs/attention/mswa.yml) with the hybrid: it names a type in use, so the
    two combine; the resolved config reloads unchanged (saved configs and checkpoints' model.yml)."""
    cfg = config("configs/pythia-70m.yml", "configs/attention/mswa.yml", num_layers=12, hybrid="mswa_linear")
    assert cfg.model.attention.attention_type == "linear+mswa"
    assert Config.from_flat(cfg.flat()).flat() == cfg.flat()
    assert model_flat(model_config_from_flat(model_flat(cfg.model))) == model_flat(cfg.model)
    vanilla = cfg.with_attention_type("vanilla")
    assert layer_types(vanilla.model) == ["vanilla"] * 12 and vanilla.model.attention.hybrid is None


def test_every_variant_works_in_any_layer():
    """One model with every registered variant, a layer each: each layer builds its own module, each variant's
    defaults resolve (dar_d_down), forward and backward are finite, AHA's loss term and statistics come from its
    layer alone."""
    names = list(variants())
    cfg = model_config(num_layers=len(names), hidden_size=64, num_attention_heads=4, vocab_size=256, window_size=4,
                       seq_length=32, attention_config=[[names, 1]], attention_impl="sdpa")
    assert cfg.attention.dar_d_down == 16
    torch.manual_seed(0)
    model = build_model(cfg)
    assert [m.name for m in model.attention_modules()] == names
    ids = torch.randint(0, 256, (2, 17))
    logits = model(ids)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)) + model.aux_loss()
    loss.backward()
    assert torch.isfinite(loss) and model.aux_loss() > 0
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert set(model.attention_stats()) == {f"layer{names.index('aha')}/mu_f"}


def test_key_warnings_consider_every_type_in_use():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # mswa_variant and linear_feature_dim are read by types in use
        config("configs/pythia-70m.yml", quiet=False, num_layers=12, hybrid="mswa_linear", mswa_variant="heads",
               linear_feature_dim=8)
    with pytest.warns(UserWarning, match="'dar_d_down' is set but attention_type is 'linear\\+mswa'"):
        config("configs/pythia-70m.yml", quiet=False, num_layers=12, hybrid="mswa_linear", dar_d_down=8)


def test_mixed_variant_describes_the_model_for_sweeps_and_reports():
    cfg = config("configs/pythia-70m.yml", num_layers=12, hybrid="mswa_linear", mswa_variant="heads").model
    mixed = variant(cfg.attention.attention_type)
    assert mixed.name == "linear+mswa" and mixed.label(cfg) == "linear+mswa-heads"
    assert mixed.summary(cfg) == "[linear, mswa, mswa] x 4: linear d_f=16; mswa w=128 (heads)"
    assert variant("aha+linear").stats == variant("aha").stats
    assert pattern(["vanilla", "swa", "vanilla"]) == "[vanilla, swa, vanilla]"
    with pytest.raises(KeyError):
        variant("linear+bogus")


def test_describe_prints_each_layers_type_windows_flops_and_cache():
    cfg = config("configs/pythia-70m.yml", num_layers=12, hybrid="mswa_linear")
    text = describe(cfg, 2048, "bf16")
    assert "attention_type: linear+mswa" in text and "layers: [linear, mswa, mswa] x 4" in text
    assert "  layer  1:     8     8    16    16    32    32    64    64" in text
    assert "  layer 11:    64    64   128   128   256   256   512   512" in text
    assert "window budget: 0.879 x SWA's" in text
    assert "layer  0 (linear): no softmax over keys" in text and "layer  1 (mswa): 29.7 keys per query" in text
    state = 8 * (1 + 16 + 256) * 65  # numbers per linear layer, whatever the context
    assert f"layer  0 (linear): {state * 4 / 2048:,.1f} bytes per token" in text  # float32 in a bf16 model
    assert f"layer  1 (mswa): {sum(2 * 64 * w / 2048 for w in W8) * 2:,.1f} bytes per token" in text
    assert f"a fixed state of {state:,} numbers per layer" in text


def test_a_hybrid_run_resumes_exactly(tmp_path, byte_tokenized_sample):
    """train.py on a 12-layer hybrid: stopped after step 3 and rerun, the losses equal an uninterrupted run's bit for
    bit (the linear layers' feature projections are saved and restored with the rest). On the byte-tokenized sample
    (trainrun.BYTES): the layers are what is checked, and a 257-token output layer keeps the steps cheap."""
    data = byte_tokenized_sample
    hybrid = ["num_layers=12", "attention_type=mswa", "hybrid=mswa_linear", "window_size=8", "zero_optimization.stage=0",
              *BYTES]
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    train(reference, data, *hybrid)
    train(resumed, data, *hybrid, "exit_interval=3", expect=3)
    out = train(resumed, data, *hybrid, "exit_interval=3")
    assert "resumed from" in out.stdout
    assert losses(resumed) == losses(reference) and len(losses(reference)) == 6
    saved = (reference / "config.yml").read_text()
    assert "attention_type: linear+mswa" in saved and "hybrid: mswa_linear" in saved
