"""GPT-NeoX config files as they are: its spellings of our keys (``gas``, ``save_interval``, the ``fp16``/``bf16``
blocks), the keys that change nothing here (reported once) and the values this project does not implement."""

from __future__ import annotations

import warnings

from ..config_fields import ConfigError

# GPT-NeoX keys that only steer its fused kernels, model/pipeline parallelism or launcher. They are accepted so
# GPT-NeoX (e.g. Pythia) config files load as they are, and reported once, since they change nothing here.
NEOX_IGNORED_KEYS = frozenset({
    "output_layer_parallelism", "scaled_upper_triang_masked_softmax_fusion", "bias_gelu_fusion",
    "checkpoint_num_layers", "partition_activations", "synchronize_each_layer", "data_impl", "distributed_backend",
    "steps_per_print", "wall_clock_breakdown", "launcher", "deepspeed_slurm", "deepspeed_mpi", "extra_save_iters",
    "test_data_paths", "test_data_weights", "pos_emb",
    "pipe_parallel_size", "model_parallel_size",
})


def translate_neox(merged: dict, origins: dict) -> None:
    """Map GPT-NeoX spellings onto our keys in place (``gas``, ``save_interval``, ``fp16``/``bf16`` blocks,
    ignored keys); reject the ones whose value would change the model in a way this project does not implement."""
    def where(key: str) -> str:
        return origins.get(key, "<config>")

    for old, new in (("gas", "gradient_accumulation_steps"), ("save_interval", "checkpoint_factor")):
        if old in merged:
            value = merged.pop(old)
            if new not in merged:
                merged[new], origins[new] = value, where(old)
    for block, precision in (("fp16", "fp16"), ("bf16", "bf16")):
        if block in merged:
            value = merged.pop(block)
            if not isinstance(value, dict):
                raise ConfigError(f"wrong type for '{block}' in {where(block)}: expected a mapping with 'enabled'")
            if value.get("enabled", False):
                merged.setdefault("precision", precision)
    for key, allowed in (("pos_emb", ("rotary",)), ("pipe_parallel_size", (0, 1)), ("model_parallel_size", (1,))):
        if key in merged and merged[key] not in allowed:
            raise ConfigError(f"invalid value for '{key}' in {where(key)}: {merged[key]!r} (neox-dar supports "
                              f"{' or '.join(map(repr, allowed))})")
    ignored = sorted(k for k in merged if k in NEOX_IGNORED_KEYS)
    for k in ignored:
        del merged[k]
    if ignored:
        warnings.warn(f"GPT-NeoX keys with no effect in neox-dar ignored: {', '.join(ignored)}", stacklevel=4)
