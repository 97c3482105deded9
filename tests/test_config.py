"""Config system: layering, overrides, derived values and every error path."""

import re
import warnings
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neox_dar.config import Config, ConfigError, load_config, reference_markdown

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_a_commands_warnings_are_one_line_each():
    """A config that does not do what it seems to is said in one line, `warning: ...`, by the commands (here
    `python -m neox_dar.config`): Python's format printed this package's file and line and the code line there,
    which say nothing to the user. Other libraries' warnings keep Python's format."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "neox_dar.config", "configs/tiny.yml", "configs/attention/dar.yml"],
                         cwd=root, capture_output=True, text=True, check=True)
    assert out.stderr.startswith("warning: window_size=128 >= seq_length=128: every key is inside DAR's window, so "
                                 "this is vanilla attention") and out.stderr.count("\n") == 1, out.stderr
    code = ("import warnings; from neox_dar.notices import one_line_notices; one_line_notices(); "
            "warnings.warn('theirs')")
    theirs = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert "<string>:1: UserWarning: theirs" in theirs


def test_later_files_override_earlier_and_nested_keys_merge(tmp_path):
    a = write(tmp_path, "a.yml", """
        hidden_size: 64
        num_attention_heads: 4
        optimizer: {type: Adam, params: {lr: 1.0e-3, eps: 1.0e-6}}
        """)
    b = write(tmp_path, "b.yml", """
        hidden-size: 128
        optimizer: {params: {lr: 5.0e-4}}
        """)
    cfg = load_config(a, b)
    assert cfg.model.hidden_size == 128
    assert cfg.training.optimizer.params.lr == 5e-4
    assert cfg.training.optimizer.params.eps == 1e-6  # kept from a.yml: nested mappings merge key by key
    assert cfg.training.optimizer.type == "Adam"


def test_command_line_overrides_with_dotted_paths_and_hyphens(tmp_path):
    a = write(tmp_path, "a.yml", "num_layers: 2\n")
    cfg = load_config(a, overrides=["optimizer.params.lr=3e-4", "zero-optimization.stage=2", "attention_type=dar",
                                    "dar_d_down=64", "train_data_paths=[a, b]", "wandb_group=my group"])
    assert cfg.training.optimizer.params.lr == 3e-4
    assert cfg.training.zero_optimization.stage == 2
    assert cfg.model.attention.dar_d_down == 64
    assert cfg.data.train_data_paths == ["a", "b"]
    assert cfg.run.wandb_group == "my group"


def test_derived_values_for_pythia_70m():
    cfg = load_config(ROOT / "configs/pythia-70m.yml")
    assert cfg.model.padded_vocab_size == 50304
    assert cfg.model.head_dim == 64
    assert cfg.model.rotary_ndims == 16
    assert cfg.training.warmup_iters == pytest.approx(190.73)  # 1% of 19,073 decay steps, not rounded (GPT-NeoX)
    assert cfg.training.min_lr == pytest.approx(1e-4)
    assert cfg.training.gradient_accumulation_for(8) == 1
    assert cfg.training.gradient_accumulation_for(2) == 4
    assert load_config(ROOT / "configs/pythia-70m.yml", overrides=["attention_type=dar"]).model.attention.dar_d_down == 128


def test_unknown_key_names_key_file_and_suggestion(tmp_path):
    p = write(tmp_path, "x.yml", "dar_d_dwon: 64\n")
    with pytest.raises(ConfigError, match=r"unknown key 'dar_d_dwon' in .*x\.yml; did you mean 'dar_d_down'\?"):
        load_config(p)


def test_unknown_nested_key_and_command_line_origin():
    with pytest.raises(ConfigError, match=r"unknown key 'optimizer.params.lrr' in the command line; did you mean 'optimizer.params.lr'"):
        load_config(overrides=["optimizer.params.lrr=1"])


@pytest.mark.parametrize("override, pattern", [
    ("dar_d_down=600", r"'dar_d_down' in the command line: 600 \(must be in 1..hidden_size=512\)"),
    ("dar_d_down=0", r"'dar_d_down'"),
    ("hidden_size=500", r"'hidden_size' in the command line: 500 \(must be divisible by num_attention_heads=8\)"),
    ("window_size=-1", r"'window_size' in the command line: -1 \(must be >= 0\)"),
    ("seq_length=4096", r"'seq_length'.*max_position_embeddings"),
    ("zero_optimization.stage=4", r"'zero_optimization.stage'"),
    ("min_lr=1", r"'min_lr'"),
    ("aha_threshold=1.5", r"'aha_threshold'"),
    ("train_batch_size=100", r"'train_batch_size' in the command line: 100"),
    ("attention_type=mswa", None),
    ("attention_type=mswax", r"invalid value for 'attention_type'.*choose one of vanilla, dar"),
    ("mswa_windows=[[1,2]]", r"'mswa_windows'"),
    ("attention_dropout=0.1", r"'attention_dropout' in the command line: 0.1 \(only 0 is supported"),
    ("zero_optimization.cpu_offload=true", r"'zero_optimization.cpu_offload'.*not supported"),
    # both names of the training data: data_path was ignored silently (GPT-NeoX refuses both)
    ("data_path=x train_data_paths=[y]", r"'data_path' in the command line: 'x' \(and train_data_paths both name"),
    ("data_path=x split=0,50,50", r"'split' in the command line: '0,50,50' \(gives training no share"),
    # accepted, then a DeepSpeed or torch traceback after start-up
    ("zero_optimization.reduce_bucket_size=0", r"'zero_optimization.reduce_bucket_size' in the command line: 0"),
    ("zero_optimization.allgather_bucket_size=-5", r"'zero_optimization.allgather_bucket_size'.*must be >= 1"),
    ("init_method_std=-0.02", r"'init_method_std' in the command line: -0.02 \(must be > 0\)"),
])
def test_impossible_values_name_key_and_rule(override, pattern):
    args = [ROOT / "configs/pythia-70m.yml"]
    if pattern is None:
        assert load_config(*args, overrides=[override]).model.attention.attention_type == "mswa"
        return
    with pytest.raises(ConfigError, match=pattern):
        load_config(*args, overrides=override.split(" "))


@pytest.mark.parametrize("text, pattern", [
    ("hidden_size: big\n", r"wrong type for 'hidden_size' in .*: expected int, got 'big'"),
    ("gpt_j_residual: 1\n", r"wrong type for 'gpt_j_residual'.*expected bool"),
    ("num_layers: true\n", r"wrong type for 'num_layers'"),
    ("optimizer: 3\n", r"wrong type for 'optimizer'"),
    ("optimizer: {params: {betas: [0.9]}}\n", r"wrong type for 'optimizer.params.betas'"),
    ("train_data_paths: a\n", r"wrong type for 'train_data_paths'"),
])
def test_type_mismatch(tmp_path, text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(write(tmp_path, "t.yml", text))


@pytest.mark.parametrize("text, shown", [
    ("aha_l1_coef: .inf\n", "inf"), ("attention_dropout: .nan\n", "nan"), ("weight_decay: -.inf\n", "-inf"),
    ("checkpoint_minutes: 1e400\n", "inf"), (f"gradient_clipping: {2 ** 1100}\n", "inf"),
    ("train_data_weights: [1, .nan]\n", "nan"),
])
def test_floats_must_be_finite(tmp_path, text, shown):
    """No key takes an infinite or NaN number: each is a one-line error naming the key and the file. (Before: a key
    whose rule only compared, such as ``aha_l1_coef >= 0``, took ``.inf``, and the loss was inf from step 1.)"""
    key = text.split(":")[0] + ("[1]" if text.startswith("train_data") else "")
    with pytest.raises(ConfigError, match=rf"invalid value for '{re.escape(key)}' in .*t\.yml: {shown} "
                                          r"\(must be a finite number\)$"):
        load_config(write(tmp_path, "t.yml", text))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"config file not found: .*nope\.yml"):
        load_config(tmp_path / "nope.yml")
    # an option a command does not take (train.py ... --steps 5 said "config file not found: --steps")
    with pytest.raises(ConfigError, match=r"^unknown option --steps: give config files and key=value overrides"):
        load_config("configs/tiny.yml", "--steps")
    # a key without its value read as a file; a key written as an option (it said "unknown key '__train_iters'")
    with pytest.raises(ConfigError, match=r"^config file not found: train_iters \(a word without '=' names a config "
                                          r"file; a key is set as key=value, e.g. train_iters=\.\.\.\)$"):
        load_config("configs/tiny.yml", "train_iters")
    with pytest.raises(ConfigError, match=r"^override '--train_iters=3': keys are set without dashes, as key=value "
                                          r"\(train_iters=3\)$"):
        load_config("configs/tiny.yml", overrides=["--train_iters=3"])


def test_a_file_that_is_not_utf8_text_or_a_folder_is_one_line(tmp_path, capsys):
    """A binary file or a folder named as a config (a UnicodeDecodeError traceback; "config file not found"), and
    the same for a sweep file and report.publish's --docs."""
    from neox_dar.report.publish import main as publish
    from neox_dar.sweep import SweepError, load_sweep

    binary = tmp_path / "bad.yml"
    binary.write_bytes(b"num_layers: 2\nhidden_size: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"bad\.yml is not UTF-8 text \(byte 0xff at offset 27\)"):
        load_config(binary)
    with pytest.raises(ConfigError, match=r"is a folder: name a config file"):
        load_config(tmp_path)
    with pytest.raises(SweepError, match=r"bad\.yml is not UTF-8 text"):
        load_sweep(binary)
    runs = tmp_path / "runs"
    (runs / "a").mkdir(parents=True)
    (runs / "a" / "config.yml").write_text("num_layers: 2\n")
    (runs / "sweep.yml").write_text("name: s\n")
    assert publish([str(runs), str(tmp_path / "pub"), "--docs", str(binary)]) == 2
    assert capsys.readouterr().err == f"publish error: --docs {binary} is not UTF-8 text (byte 0xff at offset 27): " \
                                      "is it the file you mean?\n"


def test_malformed_yaml_reports_line(tmp_path):
    p = write(tmp_path, "bad.yml", "num_layers: 2\nhidden_size: [64\nseq_length: 3\n")
    with pytest.raises(ConfigError, match=r"malformed YAML in .*bad\.yml:3:\d+"):
        load_config(p)


def test_non_mapping_yaml_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(write(tmp_path, "l.yml", "- a\n- b\n"))
    with pytest.raises(ConfigError, match="must look like key=value"):
        load_config(overrides=["nokey"])


def test_batch_mismatch_is_a_config_error():
    cfg = load_config(ROOT / "configs/pythia-70m.yml", overrides=["gradient_accumulation_steps=2"])
    assert cfg.training.gradient_accumulation_for(4) == 2
    with pytest.raises(ConfigError, match="train_batch_size=256 !="):
        cfg.training.gradient_accumulation_for(2)
    with pytest.raises(ConfigError, match="not divisible.*3 ranks do not divide it: a global batch of"):
        load_config(ROOT / "configs/pythia-70m.yml").training.gradient_accumulation_for(3)
    # the error names the micro-batches that would fit (pythia-160m: 896 sequences, micro-batch 16, on 16 GPUs)
    with pytest.raises(ConfigError, match=r"micro-batches that fit 16 ranks: 1, 2, 4, 7, 8, 14, 28$"):
        load_config(ROOT / "configs/pythia-160m.yml").training.gradient_accumulation_for(16)


def test_variant_key_on_vanilla_warns():
    with pytest.warns(UserWarning, match="'dar_d_down' is set but attention_type is 'vanilla'"):
        load_config(ROOT / "configs/pythia-70m.yml", overrides=["dar_d_down=64"])


def test_roundtrip_through_yaml_and_dict():
    cfg = load_config(ROOT / "configs/pythia-160m.yml", overrides=["attention_type=dar", "dar_d_down=192"])
    again = Config.from_flat(__import__("yaml").safe_load(cfg.to_yaml()))
    assert again == cfg


def test_cli_prints_resolved_yaml_and_one_line_errors(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "neox_dar.config", str(ROOT / "configs/pythia-70m.yml"), "dar_d_down=64",
                         "attention_type=dar"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert "dar_d_down: 64" in ok.stdout and "padded_vocab_size=50304" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "neox_dar.config", str(ROOT / "configs/pythia-70m.yml"), "dar_d_dwon=64"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0
    assert "did you mean 'dar_d_down'" in bad.stderr


def test_key_reference_doc_is_current():
    doc = (ROOT / "docs/config_reference.md").read_text()
    assert reference_markdown() in doc, "regenerate with: python -m neox_dar.config --reference"


def test_gpt_neox_pythia_config_loads_as_is():
    with pytest.warns(UserWarning, match="GPT-NeoX keys with no effect in neox-dar ignored: bias_gelu_fusion"):
        cfg = load_config(ROOT / "tests/fixtures/gpt-neox-pythia-70m.yml")
    assert cfg.model.attention.attention_type == "vanilla"  # its attention_config [[["flash"], 6]] is read
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_attention_heads, cfg.model.rotary_pct) == (6, 512, 8, 0.25)
    assert cfg.training.precision == "fp16" and cfg.training.gradient_accumulation_steps == 1 and cfg.training.checkpoint_activations
    assert cfg.training.optimizer.params.betas == (0.9, 0.95) and cfg.training.min_lr == pytest.approx(1e-4)
    assert cfg.data.train_data_paths == ["pile_0.87_deduped_text_document"]
    assert cfg.run.checkpoint_factor == 500 and cfg.training.zero_optimization.stage == 1
    # no keep_last_n_checkpoints: GPT-NeoX keeps every checkpoint (it kept 2 here: Pythia's 143 were pruned)
    assert cfg.run.keep_last_n is None and cfg.origins["keep_last_n"].startswith("GPT-NeoX's default")
    from neox_dar.training.engine import deepspeed_config

    fp16 = deepspeed_config(cfg.replace(train_batch_size=32), world_size=1)["fp16"]  # the block's loss scaling
    assert fp16["enabled"] and fp16["initial_scale_power"] == 12 and fp16["loss_scale"] == 0  # (16 was used)


NEOX_125M = """{
   "pipe_parallel_size": 1, "num_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "seq_length": 2048,
   "max_position_embeddings": 2048, "norm": "layernorm", "pos_emb": "rotary", "no_weight_tying": true,
   "gpt_j_residual": false, "rope_fusion": false, "layernorm_fusion": false, "init_method": "small_init",
   "output_layer_init_method": "wang_init", "min_lr": 0.00006, "lr_decay_style": "cosine",
   "optimizer": {"type": "Adam", "params": {"lr": 0.0006, "betas": [0.9, 0.95], "eps": 1.0e-8}},
   "fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
   "keep_last_n_checkpoints": 4, "hostfile": "/mock_path",
}"""


def test_gpt_neox_125m_config_loads_and_says_which_of_its_defaults_do_not_apply(tmp_path):
    """GPT-NeoX's configs/125M.yml (its keys): the fused-kernel and launcher keys ignored (they were unknown keys),
    keep_last_n_checkpoints is keep_last_n, and the one key it leaves out whose GPT-NeoX default differs
    (rotary_pct: 1.0 there) is named in a warning (it silently took Pythia's 0.25)."""
    f = tmp_path / "125M.yml"
    f.write_text(NEOX_125M)
    with pytest.warns(UserWarning) as seen:
        cfg = load_config(f)
    said = [str(w.message) for w in seen]
    assert any("ignored: hostfile, layernorm_fusion, pipe_parallel_size, pos_emb, rope_fusion" in m for m in said)
    omitted = next(m for m in said if "leaves out keys whose GPT-NeoX default differs" in m)
    assert "rotary_pct 0.25 (GPT-NeoX: 1.0)" in omitted and "gpt_j_residual" not in omitted
    assert cfg.run.keep_last_n == 4 and cfg.training.precision == "fp16" and not cfg.model.gpt_j_residual
    for words, message in (
            (["precision=fp32"], "precision fp32 (the command line) contradicts fp16.enabled: true"),
            (['bf16={"enabled": true}'], "fp16.enabled (" + str(f) + ") and bf16.enabled (the command line) are both"),
            (['fp16={"initial_scale_power": 99}'], "'fp16.initial_scale_power' in the command line: 99")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(f, overrides=words)


def test_a_gpt_neox_key_on_the_command_line_does_not_make_a_gpt_neox_file():
    """gas=2 on the command line over our own config: no GPT-NeoX defaults warning and our keep_last_n (the config was
    read as a GPT-NeoX file: six 'differences' warned that do not apply)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = load_config(ROOT / "configs/tiny.yml", overrides=["gas=2"])
    assert cfg.training.gradient_accumulation_steps == 2 and cfg.run.keep_last_n == 2


def test_a_key_given_twice_in_a_file_is_an_error(tmp_path):
    """Two spellings of one key, or a YAML mapping that repeats one, name the key and the file (PyYAML and the
    spelling fold kept the last value silently)."""
    spelled = tmp_path / "spelled.yml"
    spelled.write_text("hidden-size: 512\nhidden_size: 256\n")
    with pytest.raises(ConfigError, match=f"'hidden_size' is given twice in {re.escape(str(spelled))} \\(as "
                                          "'hidden-size' and 'hidden_size'\\)"):
        load_config(spelled)
    repeated = tmp_path / "repeated.yml"
    repeated.write_text("num_layers: 2\nhidden_size: 64\nnum_layers: 4\n")
    with pytest.raises(ConfigError, match=f"'num_layers' is given twice in {re.escape(str(repeated))}:3"):
        load_config(repeated)


@pytest.mark.parametrize("override, pattern", [("pos_emb=learned", "'pos_emb'"), ("model_parallel_size=2", "'model_parallel_size'")])
def test_gpt_neox_keys_that_would_change_the_model_are_rejected(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(overrides=[override])


def test_text_keys_take_the_command_line_word_as_written():
    """A string key given a word YAML reads as a number (split=100, save=2024, a run named 1e3; split=1:2 read as the
    base-60 number 62): the word itself, as a file's quoted value would be (they were type errors, or the 62)."""
    cfg = load_config(ROOT / "configs/tiny.yml", overrides=["split=100", "save=2024", "wandb_run_name=1e3", "seed=7"])
    assert (cfg.data.split, cfg.run.save, cfg.run.wandb_run_name, cfg.training.seed) == ("100", "2024", "1e3", 7)
    with pytest.raises(ConfigError, match=r"invalid value for 'split' in the command line: '1:2' \(must be 1 to 3"):
        load_config(ROOT / "configs/tiny.yml", overrides=["split=1:2"])
    assert load_config(ROOT / "configs/tiny.yml", overrides=["data_path=null"]).data.data_path is None
