"""The export of a model with non-vanilla layers: ``NeoxDarForCausalLM``, whose code is every module of
:mod:`neox_dar.standalone` (copied into the folder, named by ``auto_map``) with the folder's own ``layer_types.py``
(:func:`layer_types_source`), and its ``config.json``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..config import ConfigError, ModelConfig
from ..families import FAMILIES
from ..standalone.block import BlockShape, ModuleNames
from ..standalone.layer_types import LAYER_TYPES
from .config_map import shape_keys


REMOTE_CODE = Path(__file__).resolve().parents[1] / "standalone"


REMOTE_FILES = tuple(sorted(p.name for p in REMOTE_CODE.glob("*.py") if p.name != "__init__.py"))  # all of it

LAYER_TYPES_FILE = "layer_types.py"  # written for each export (layer_types_source), not copied
_EXPORTED_DOC = ("The attention layer types an exported model may name in config.json's neox_dar_layers (written by\n"
                 "neox-dar's convert to-hf).")


def layer_types_source(layers: list[dict]) -> str:
    """The exported folder's ``layer_types.py``: every layer type of :mod:`neox_dar.standalone`
    (:data:`LAYER_TYPES`), each imported from its module by name, as its ``LAYER_TYPES``. transformers copies only
    the modules that ``modeling_neox_dar.py`` imports by name, directly or through these imports; every export of
    one neox-dar holds the same code, so transformers, which reuses the model class of a config class it has loaded
    (the same ``configuration_neox_dar.py``), builds every such export right in one process. ConfigError when
    ``layers`` (``neox_dar_layers``) name a layer type that no module of the package defines (the export ships no
    other code)."""
    for spec in layers:
        if spec["type"] not in LAYER_TYPES:
            raise ConfigError(f"layer type {spec['type']!r} is defined by no module of neox_dar/standalone, whose "
                              "code the export ships")
    classes = sorted(LAYER_TYPES.values(), key=lambda c: (c.__module__, c.__name__))
    imports = "".join(f"from .{c.__module__.rpartition('.')[2]} import {c.__name__}\n" for c in classes)
    names = ", ".join(c.__name__ for c in classes) + ("," if len(classes) == 1 else "")
    return (f'"""{_EXPORTED_DOC}"""\n\n{imports}\n'
            f"LAYER_TYPES = {{cls.layer_type: cls for cls in ({names})}}\n")


def remote_config_dict(cfg: ModelConfig, layers: list[dict], special_ids: dict[str, int | None]) -> dict:
    """The ``config.json`` of ``NeoxDarForCausalLM`` (:mod:`neox_dar.standalone`) for ``cfg`` and its layers'
    :meth:`~neox_dar.attention.Attention.export_spec` descriptions; ``neox_dar_block`` is the family's
    :class:`~neox_dar.standalone.block.BlockShape`."""
    scaling = None if cfg.rope_scaling is None else dataclasses.asdict(cfg.rope_scaling)
    rms = cfg.norm == "rmsnorm"
    family = FAMILIES[cfg.model_family]
    return {
        "architectures": ["NeoxDarForCausalLM"],
        "model_type": "neox_dar",
        "auto_map": {"AutoConfig": "configuration_neox_dar.NeoxDarConfig",
                     "AutoModelForCausalLM": "modeling_neox_dar.NeoxDarForCausalLM"},
        **shape_keys(cfg, special_ids),
        "neox_dar_block": BlockShape(
            family=family.name, names=ModuleNames(**dataclasses.asdict(family.names)), norm=cfg.norm,
            norm_eps=cfg.rms_norm_epsilon if rms else cfg.layernorm_epsilon,
            rms_weight_in_float32=family.rms_weight_in_float32, norm_position=cfg.norm_position,
            parallel_residual=cfg.gpt_j_residual, qk_norm=cfg.qk_norm, activation=cfg.activation,
            fused_qkv=cfg.fused_qkv, qkv_bias=cfg.qkv_bias, attention_out_bias=cfg.attention_out_bias,
            mlp_bias=cfg.mlp_bias, rotary_ndims=cfg.rotary_ndims, rope_theta=cfg.rotary_emb_base,
            rope_scaling=scaling, rotary_in_float32=family.rotary_in_float32).to_json(),
        "neox_dar_layers": layers,
    }
