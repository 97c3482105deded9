"""GPT-NeoX config files as they are: its spellings of our keys (``gas``, ``save_interval``, the ``fp16``/``bf16``
blocks), the keys that change nothing here (reported once) and the values this project does not implement."""

from __future__ import annotations

import warnings

from ..config_fields import ConfigError
from ..notices import Notice

# GPT-NeoX keys that only steer its fused kernels, model/pipeline parallelism or launcher. They are accepted so
# GPT-NeoX (e.g. Pythia) config files load as they are, and reported once, since they change nothing here.
NEOX_IGNORED_KEYS = frozenset({
    "output_layer_parallelism", "scaled_upper_triang_masked_softmax_fusion", "bias_gelu_fusion",
    "checkpoint_num_layers", "partition_activations", "synchronize_each_layer", "data_impl", "distributed_backend",
    "steps_per_print", "wall_clock_breakdown", "launcher", "deepspeed_slurm", "deepspeed_mpi", "extra_save_iters",
    "test_data_paths", "test_data_weights", "pos_emb", "rope_fusion", "layernorm_fusion", "hostfile",
    "pipe_parallel_size", "model_parallel_size",
})

# GPT-NeoX's defaults (megatron/neox_arguments/neox_args.py) that differ from this project's: a GPT-NeoX file that
# leaves one out means GPT-NeoX's value, which neox-dar does not take, so it says so.
NEOX_DEFAULTS = {"rotary_pct": 1.0, "gpt_j_residual": False, "no_weight_tying": False, "init_method": "normal",
                 "output_layer_init_method": "scaled_normal", "rms_norm_epsilon": 1e-8, "pos_emb": "learned",
                 "lr_decay_style": "linear", "min_lr": 0.0}
# keys only GPT-NeoX files hold (its spellings and blocks): a config with one is read as a GPT-NeoX file
NEOX_ONLY_KEYS = NEOX_IGNORED_KEYS | {"gas", "save_interval", "bf16", "keep_last_n_checkpoints"}


def translate_neox(merged: dict, origins: dict, files: set[str]) -> None:
    """Map GPT-NeoX spellings onto our keys in place (``gas``, ``save_interval``, ``fp16``/``bf16`` blocks,
    ignored keys); reject the ones whose value would change the model in a way this project does not implement.
    A config whose ``files`` (its sources that are files, not overrides) hold a GPT-NeoX key is a GPT-NeoX file:
    its omitted keys are warned (:data:`NEOX_DEFAULTS`), and without ``keep_last_n_checkpoints`` it keeps every
    checkpoint, as GPT-NeoX does."""
    def where(key: str) -> str:
        return origins.get(key, "<config>")

    neox_file = sorted(k for k in merged if k in NEOX_ONLY_KEYS and where(k) in files)
    if neox_file and "keep_last_n_checkpoints" not in merged and "keep_last_n" not in merged:
        merged["keep_last_n"] = None
        origins["keep_last_n"] = ("GPT-NeoX's default (a GPT-NeoX config without keep_last_n_checkpoints keeps every "
                                  "checkpoint)")
    omitted = [k for k in NEOX_DEFAULTS if k not in merged
               and (k != "rms_norm_epsilon" or merged.get("norm") == "rmsnorm")]
    for old, new in (("gas", "gradient_accumulation_steps"), ("save_interval", "checkpoint_factor"),
                     ("keep_last_n_checkpoints", "keep_last_n")):
        if old in merged:
            value = merged.pop(old)
            if new not in merged:
                merged[new], origins[new] = value, where(old)
    if isinstance(merged.get("fp16"), dict) and "fp16" in merged["fp16"]:  # Pythia's block repeats its switch
        merged["fp16"].setdefault("enabled", merged["fp16"].pop("fp16"))
    bf16 = merged.pop("bf16", {})  # GPT-NeoX's bf16 block: only its switch counts
    if not isinstance(bf16, dict):
        raise ConfigError(f"wrong type for 'bf16' in {where('bf16')}: expected a mapping with 'enabled'")
    blocks = {"fp16": merged.get("fp16"), "bf16": bf16}
    enabled = [b for b, block in blocks.items() if isinstance(block, dict) and block.get("enabled")]
    if len(enabled) == 2:
        raise ConfigError(f"fp16.enabled ({where('fp16.enabled')}) and bf16.enabled ({where('bf16.enabled')}) are both "
                          "true: enable one")
    for block in enabled:  # the block's switch sets the precision, and contradicts any other
        if merged.get("precision", "auto") not in ("auto", block, "bfloat16" if block == "bf16" else block):
            raise ConfigError(f"precision {merged['precision']} ({where('precision')}) contradicts {block}.enabled: "
                              f"true ({where(block + '.enabled')}): set one of them")
        merged["precision"], origins["precision"] = block, where(block + ".enabled")
    for key, allowed in (("pos_emb", ("rotary",)), ("pipe_parallel_size", (0, 1)), ("model_parallel_size", (1,))):
        if key in merged and merged[key] not in allowed:
            raise ConfigError(f"invalid value for '{key}' in {where(key)}: {merged[key]!r} (neox-dar supports "
                              f"{' or '.join(map(repr, allowed))})")
    ignored = sorted(k for k in merged if k in NEOX_IGNORED_KEYS)
    for k in ignored:
        del merged[k]
    if ignored:
        warnings.warn(f"GPT-NeoX keys with no effect in neox-dar ignored: {', '.join(ignored)}", Notice, stacklevel=4)
    if neox_file and omitted:
        differ = ", ".join(f"{k} {_ours(k)} (GPT-NeoX: {NEOX_DEFAULTS[k]!r})" for k in omitted)
        warnings.warn(f"a GPT-NeoX config (it has {', '.join(neox_file[:3])}) leaves out keys whose GPT-NeoX default "
                      f"differs from neox-dar's, which applies: {differ}; set them in the file to mean GPT-NeoX's",
                      Notice, stacklevel=4)


def _ours(key: str) -> str:
    """This project's default of a :data:`NEOX_DEFAULTS` key, as the warning shows it."""
    from .schema import key_field

    special = {"pos_emb": "'rotary' (the only one here)", "min_lr": "lr / 10"}
    return special.get(key) or repr(key_field(key).default)
