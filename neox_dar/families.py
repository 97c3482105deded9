"""The model families, one record each: the only place a family's components, Hugging Face class and parameter
names are written. Torch-free, importing nothing from neox_dar.

A config's ``model_family`` names a registered record (:func:`register_family`; :data:`FAMILIES` holds them by
name). :mod:`neox_dar.model` takes the module names from it (so checkpoints convert by renaming nothing),
:mod:`neox_dar.norms` the RMSNorm flavour, :mod:`neox_dar.hf` the class, the model keys the class fixes (set
on import, checked on export) and the ``config.json`` keys it reads and writes; the exported remote code
(:mod:`neox_dar.standalone`) gets the names and norm flavour through config.json's ``neox_dar_block``
(:class:`neox_dar.standalone.block.BlockShape`); :mod:`neox_dar.tiny_hf_model`
builds each family's test model from ``tiny``, and the tests build each family's models from its ``preset``.
Adding a family is a record registered here plus its preset in ``configs/`` (docs/models.md).

    python -m neox_dar.families     # the records as the markdown table of docs/models.md
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Names:
    """Module names in the family's Hugging Face class: ``{decoder}.{embed}``, ``{decoder}.layers.{l}.{attention}``,
    ``{decoder}.{final_norm}``, ``{head}``. The sub-layers' names follow the components (``fused_qkv``:
    ``query_key_value``/``dense`` or ``q_proj`` ... ``o_proj``; ``activation``; ``norm_position``)."""

    decoder: str = "model"
    embed: str = "embed_tokens"
    final_norm: str = "norm"
    head: str = "lm_head"
    attention: str = "self_attn"


@dataclass(frozen=True)
class HFKey:
    """A ``config.json`` key of the family's class and the model keys it stands for (one value for all of them:
    ``attention_bias`` is ``qkv_bias`` and ``attention_out_bias``); ``default`` where ``config.json`` lacks it.
    ``read``: imports read it (false: exports write it, imports leave the value to other keys or the default)."""

    hf: str
    ours: tuple[str, ...]
    default: Any
    read: bool = True


@dataclass(frozen=True)
class Family:
    """One model family. ``name`` is the config's ``model_family`` and the class's ``model_type``."""

    name: str
    hf_class: str  # the *ForCausalLM in transformers
    hidden_act: str  # config.json's hidden_act: the only one the MLP implements
    fixed: dict[str, Any]  # model keys the class fixes: imports set them, exports refuse other values
    hf_keys: tuple[HFKey, ...]  # the config.json keys of the components the class leaves open
    names: Names = Names()
    rms_weight_in_float32: bool = False  # RMSNorm multiplies by its weight before casting back (OLMo-2)
    rotary_in_float32: bool = False  # q, k turned by float32 cos/sin, then cast back (OLMo-2; the others: in q's dtype)
    import_keys: dict[str, Any] = field(default_factory=dict)  # set on import, not fixed by the class (init)
    hf_extra: dict[str, Any] = field(default_factory=dict)  # constant config.json keys of exports
    tiny: dict[str, Any] = field(default_factory=dict)  # config.json keys of tiny_hf_model's model: the features
    preset: str = ""  # a shipped config of the family (configs/...), the tests' models shrink it


FAMILIES: dict[str, Family] = {}
"""The registered families by name (:func:`register_family`); read, never written, elsewhere."""


def register_family(family: Family) -> Family:
    """Add a family (its ``name`` is the config's ``model_family``); a name registered by another record is a
    ValueError."""
    if FAMILIES.get(family.name, family) != family:
        raise ValueError(f"model_family '{family.name}' is already registered ({FAMILIES[family.name].hf_class})")
    FAMILIES[family.name] = family
    return family


# the SwiGLU families' shared parts
_SWIGLU = dict(norm="rmsnorm", norm_position="pre", qk_norm="none", activation="swiglu", fused_qkv=False,
               gpt_j_residual=False, rotary_pct=1.0)
_ATTENTION_BIAS = HFKey("attention_bias", ("qkv_bias", "attention_out_bias"), False)
_RMS_EPS = HFKey("rms_norm_eps", ("rms_norm_epsilon",), 1e-6)  # the default of Llama's and Qwen's config classes
_NORMAL_INIT = dict(init_method="normal", output_layer_init_method="normal")
_NO_SLIDING = dict(use_sliding_window=False, sliding_window=None)
_TINY_GQA = dict(intermediate_size=96, num_key_value_heads=2, rms_norm_eps=1e-6)

register_family(Family(
    "gpt_neox", "GPTNeoXForCausalLM", "gelu",
    fixed=dict(norm="layernorm", norm_position="pre", qk_norm="none", activation="gelu", fused_qkv=True,
               mlp_bias=True),
    hf_keys=(HFKey("use_parallel_residual", ("gpt_j_residual",), True),
             HFKey("attention_bias", ("qkv_bias", "attention_out_bias"), True),
             HFKey("layer_norm_eps", ("layernorm_epsilon",), 1e-5),
             HFKey("rotary_pct", ("rotary_pct",), 0.25),
             HFKey("rotary_emb_base", ("rotary_emb_base",), 10000, read=False),
             HFKey("hidden_dropout", ("hidden_dropout",), 0.0, read=False)),
    names=Names("gpt_neox", "embed_in", "final_layer_norm", "embed_out", "attention"),
    tiny=dict(intermediate_size=256, rotary_pct=0.25, use_parallel_residual=True), preset="configs/pythia-14m.yml"))
register_family(Family(
    "llama", "LlamaForCausalLM", "silu", fixed=_SWIGLU,
    hf_keys=(_ATTENTION_BIAS, HFKey("mlp_bias", ("mlp_bias",), False), _RMS_EPS), import_keys=_NORMAL_INIT,
    tiny=dict(_TINY_GQA, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    preset="configs/llama-3.2-1b.yml"))
register_family(Family(
    "olmo2", "Olmo2ForCausalLM", "silu",
    fixed=dict(_SWIGLU, norm_position="post", qk_norm="projection", mlp_bias=False),
    hf_keys=(_ATTENTION_BIAS, HFKey("rms_norm_eps", ("rms_norm_epsilon",), 1e-5)), rms_weight_in_float32=True,
    rotary_in_float32=True, import_keys=_NORMAL_INIT, tiny=_TINY_GQA,
    preset="configs/olmo-2-0425-1b.yml"))
register_family(Family(
    "qwen2", "Qwen2ForCausalLM", "silu", fixed=dict(_SWIGLU, qkv_bias=True, attention_out_bias=False, mlp_bias=False),
    hf_keys=(_RMS_EPS,), import_keys=_NORMAL_INIT, hf_extra=_NO_SLIDING, tiny=_TINY_GQA,
    preset="configs/qwen2.5-0.5b.yml"))
register_family(Family(
    "qwen3", "Qwen3ForCausalLM", "silu", fixed=dict(_SWIGLU, qk_norm="head", mlp_bias=False),
    hf_keys=(_ATTENTION_BIAS, _RMS_EPS), import_keys=_NORMAL_INIT, hf_extra=_NO_SLIDING,
    tiny=dict(_TINY_GQA, head_dim=32), preset="configs/qwen3-0.6b.yml"))


def table() -> str:
    """The records as a markdown table, one column per family (docs/models.md holds it)."""
    families = list(FAMILIES.values())
    keys = list(dict.fromkeys(k for f in families for k in [*f.fixed, *(o for h in f.hf_keys for o in h.ours)]))

    def cell(f: Family, key: str) -> str:
        if key in f.fixed:
            return f"`{f.fixed[key]}`".replace("`True`", "`true`").replace("`False`", "`false`")
        hf = next((h for h in f.hf_keys if key in h.ours), None)
        return "" if hf is None else f"from `{hf.hf}`" if hf.read else f"written as `{hf.hf}`"

    rows = [["`model_family`", *(f"`{f.name}`" for f in families)],
            ["class", *(f"`{f.hf_class}`" for f in families)],
            ["names", *(f"`{f.names.decoder}.{f.names.embed}`, `{f.names.attention}`, `{f.names.final_norm}`, "
                        f"`{f.names.head}`" for f in families)],
            ["`hidden_act`", *(f"`{f.hidden_act}`" for f in families)],
            ["RMSNorm weight in float32", *("yes" if f.rms_weight_in_float32 else "" for f in families)],
            ["rotary in float32", *("yes" if f.rotary_in_float32 else "" for f in families)],
            *([f"`{k}`", *(cell(f, k) for f in families)] for k in keys)]
    return "\n".join("| " + " | ".join(r) + " |" for r in [rows[0], ["---"] * len(rows[0]), *rows[1:]])


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(prog="python -m neox_dar.families",
                            description="The model families as the Markdown table of docs/models.md.").parse_args()
    print(table())
