"""Starting from pretrained weights and choosing what trains: ``finetune`` (``load=``'s weights only), the new
parameters of a variant added to a pretrained model, ``trainable_params`` and LoRA adapters (peft).

All of it happens to the bare model before DeepSpeed wraps it (:func:`prepare_model`), so the optimizer, its
ZeRO partitions and the checkpoints only ever see the parameters that train.

New parameters: a finetune checkpoint may lack some of the model's weights, but only a variant's own (DAR's
``dar_down``/``dar_up``, AHA's ``router``): those start from ``init_method`` and then from the variant's choice
(:meth:`~neox_dar.attention.Attention.init_new_parameters`: ``dar_init``, ``aha_router_init``), layer by layer in
order, each calibrated variant on its own layer's inputs as the model computes them at that point (so DAR's PCA
start is exact for every layer at step 0: the layers before it are already initialised).
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..attention import Attention
from ..saved_model import check_weight_shapes, read_model_config
from ..config import Config, model_config_diff
from ..config.schema import key_sections
from ..config_fields import check
from ..model import CausalLM, build_meta_model, vanilla_weight_names
from ..rundir import WEIGHTS, CheckpointError

log = logging.getLogger(__name__)
LORA_MARK = ".lora_A."


# ----------------------------------------------------------------------------------------------
# the pretrained weights


def finetune_mismatch(step_dir: Path, cfg: Config) -> str | None:
    """Why ``step_dir``'s model cannot start ``cfg``'s by finetuning (a different base architecture), or None.
    Attention keys may differ: a variant is added to, or changed on, the pretrained model."""
    try:
        diff = model_config_diff(read_model_config(step_dir), cfg.model)
    except CheckpointError as e:
        return str(e)
    sections = key_sections()
    base = {k: v for k, v in diff.items() if sections.get(k) != "attention"}
    if not base:
        return None
    shown = ", ".join(f"{k} ({a!r} in the checkpoint, {b!r} now)" for k, (a, b) in list(base.items())[:3])
    return f"{step_dir} holds another base model: {shown}"


def load_pretrained(model: CausalLM, cfg: Config, step_dir: Path) -> set[str]:
    """Load the weights of ``step_dir`` (verified by the caller) into ``model``; returns the names of the model's
    weights it does not hold (the new ones). Every tensor it holds must be one of the model's, of the same shape;
    a missing weight must be a variant's own (CheckpointError otherwise, before any tensor is read)."""
    weights = step_dir / WEIGHTS
    probe = build_meta_model(read_model_config(step_dir))
    check_weight_shapes(weights, probe)  # the file matches its own config
    ours = {k: tuple(v.shape) for k, v in model.weights().items()}
    theirs = {k: tuple(v.shape) for k, v in probe.weights().items()}
    for name, shape in theirs.items():
        if name not in ours:
            raise CheckpointError(f"{weights} holds {name}, which this run's model does not have")
        if ours[name] != shape:
            raise CheckpointError(f"{weights}: {name} has shape {shape}, this run's model {ours[name]}")
    new = set(ours) - set(theirs)
    base = sorted(new & vanilla_weight_names(cfg.model))
    if base:
        raise CheckpointError(f"{weights} lacks {len(base)} weight(s) of the base model, e.g. {base[0]}")
    device = next(model.parameters()).device
    model.load_weights(load_file(str(weights), device=str(device)), strict=False)
    return new


def initialise_new(model: CausalLM, new: set[str], calibration: Sequence[torch.Tensor]) -> list[str]:
    """Give the attention modules that own ``new`` parameters their variant's start, in layer order; a module
    that wants calibration gets its attention inputs on ``calibration`` (1-D token tensors) as the model computes
    them with the earlier layers already initialised. Returns a line per module for the log."""
    lines = []
    for prefix, module in model.named_modules():
        mine = sorted(n[len(prefix) + 1:] for n in new if n.startswith(prefix + "."))
        if not isinstance(module, Attention) or not mine:
            continue
        inputs = attention_inputs(model, module, calibration) if module.wants_calibration() else None
        module.init_new_parameters(inputs)
        lines.append(f"{prefix}: new {', '.join(mine)}"
                     + (f", calibrated on {inputs.shape[0]} tokens" if inputs is not None else ""))
    return lines


class _Captured(Exception):
    """Raised by the capture hook: the layer's input is all the calibration forward needs."""


def attention_inputs(model: CausalLM, module: torch.nn.Module, sequences: Sequence[torch.Tensor]) -> torch.Tensor:
    """The inputs ``a`` of ``module`` (an attention module of ``model``) over ``sequences``: (N, d), N the total
    token count; each forward stops at that layer."""
    captured: list[torch.Tensor] = []

    def hook(_module, args):
        captured.append(args[0].detach().reshape(-1, args[0].shape[-1]))
        raise _Captured

    handle = module.register_forward_pre_hook(hook)
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for tokens in sequences:
                try:
                    model(tokens.to(device)[None])
                except _Captured:
                    pass
    finally:
        handle.remove()
    return torch.cat(captured).float()


# ----------------------------------------------------------------------------------------------
# what trains


def check_trainable(cfg: Config, model: CausalLM) -> None:
    """InvalidValue (a config rule) when a ``trainable_params`` pattern matches no parameter of ``model`` (names as
    in the model, before LoRA), or a LoRA target names no linear layer, or a layer whose weight is read directly
    (GPT-NeoX's fused ``query_key_value``, a variant's :attr:`~neox_dar.attention.Attention.read_by_weight`: an
    adapter on it would be ignored), or the output layer tied to the input embedding (its merged weight could not
    stay tied, so no checkpoint of the run would load)."""
    names = [n for n, _ in model.named_parameters()]
    example = next((n for n in names if "layers.0." in n), names[0])
    for pattern in cfg.training.trainable_params or ():
        check(bool(fnmatch.filter(names, pattern)), "trainable_params",
              f"pattern {pattern!r} matches no parameter of the model (names look like {example!r})", pattern)
    lora = cfg.training.lora
    if lora is not None:
        linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
        by_weight = {f"{prefix}.{leaf}": m.name for prefix, m in model.named_modules() if isinstance(m, Attention)
                     for leaf in m.read_by_weight}
        tied = {key.rsplit(".", 1)[0] for key in model.tied_keys}
        for target in lora.target_modules:
            named = [n for n in linears if n == target or n.endswith("." + target)]
            check(target.split(".")[-1] != "query_key_value", "lora.target_modules",
                  "GPT-NeoX's fused query_key_value is read by weight, not called: an adapter on it would be ignored",
                  target)
            check(bool(named), "lora.target_modules", "names no linear layer of the model", target)
            read = [by_weight[n] for n in named if n in by_weight]
            check(not read, "lora.target_modules", f"the {read[0] if read else ''} attention reads this layer's "
                  "weight directly, not by calling it: an adapter on it would be ignored; train it by "
                  "trainable_params instead", target)
            check(not tied.intersection(named), "lora.target_modules",
                  "the output layer shares its weight with the input embedding (tie_word_embeddings): an adapter "
                  "would untie them and no checkpoint of the run would load; adapt other layers, or train the "
                  "embedding by trainable_params", target)


def add_lora(model: CausalLM, cfg: Config) -> str:
    """peft's LoRA adapters on ``lora.target_modules`` (only the adapters train afterwards); returns the log line
    that says where they went: rank, alpha, dropout, the adapted modules and the adapters' parameter count."""
    from peft import LoraConfig, inject_adapter_in_model

    lora = cfg.training.lora
    inject_adapter_in_model(LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                       target_modules=list(lora.target_modules)), model)
    adapted = sorted({n.rsplit(".lora_A.", 1)[0] for n, _ in model.named_parameters() if LORA_MARK in n})
    count = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    kinds = sorted({n.rsplit(".", 1)[-1] for n in adapted})
    return (f"LoRA adapters attached: r={lora.r}, alpha={lora.alpha:g}, dropout={lora.dropout:g} on {len(adapted)} "
            f"modules ({', '.join(kinds)}), {count:,} adapter parameters")


def freeze(model: CausalLM, cfg: Config) -> None:
    """Keep ``requires_grad`` only on the parameters that train: every one by default; with ``trainable_params``
    those matching a pattern (with LoRA: the adapters too)."""
    patterns = cfg.training.trainable_params
    if patterns is None and cfg.training.lora is None:
        return
    for name, p in model.named_parameters():
        base_name = name.replace(".base_layer.", ".")
        adapter = ".lora_" in name
        p.requires_grad_(adapter or any(fnmatch.fnmatchcase(base_name, pat) for pat in patterns or ()))


def trainable_summary(model: CausalLM) -> str:
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    return f"training {n_train:,} of {n_all:,} parameters ({100 * n_train / n_all:.2f}%)"


def prepare_model(model: CausalLM, cfg: Config, pretrained: Path | None,
                  calibration: Sequence[torch.Tensor]) -> list[str]:
    """Before DeepSpeed: load ``pretrained``'s weights (finetune) and initialise what it lacks, add LoRA, freeze.
    Returns log lines."""
    lines = []
    if pretrained is not None:
        new = load_pretrained(model, cfg, pretrained)
        lines.append(f"finetuning from {pretrained}" + (f"; {len(new)} new parameter tensor(s)" if new else ""))
        lines += initialise_new(model, new, calibration)
    check_trainable(cfg, model)
    if cfg.training.lora is not None:
        lines.append(add_lora(model, cfg))
    freeze(model, cfg)
    lines.append(trainable_summary(model))
    return lines


# ----------------------------------------------------------------------------------------------
# LoRA weights merged for checkpoints


def merge_lora(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A state dict with peft LoRA layers (``P.base_layer.weight``, ``P.lora_A.default.weight``,
    ``P.lora_B.default.weight``) as plain weights: ``P.weight = W + scale * B @ A`` (float32), ``P.bias`` from the
    base layer; other tensors unchanged."""
    out = {}
    for name, t in state.items():
        if ".lora_" in name:
            continue
        if ".base_layer." in name:
            prefix, _, leaf = name.partition(".base_layer.")
            if leaf == "weight":
                a = state[f"{prefix}.lora_A.default.weight"].float()
                b = state[f"{prefix}.lora_B.default.weight"].float()
                t = t.float() + scale * (b @ a)
            name = f"{prefix}.{leaf}"
        out[name] = t
    return out
