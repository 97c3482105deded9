"""The DeepSpeed engine built from our :class:`~neox_dar.config.Config`.

DeepSpeed gets a torch ``AdamW`` and a ``LambdaLR`` (no DeepSpeed optimizer JSON: its CPU Adam would
JIT-compile C++ for about a minute), and a config dict with the batch, clipping, ZeRO and precision settings.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..config import Config
from ..model import CausalLM, build_model, flops_per_token
from .distributed import DistInfo
from .optim import build_optimizer, build_scheduler


def deepspeed_config(cfg: Config, world_size: int) -> dict:
    """The DeepSpeed config dict: global batch = micro * grad_accum * world_size (a mismatch is a ConfigError)."""
    grad_accum = cfg.training.gradient_accumulation_for(world_size)
    micro = cfg.training.train_micro_batch_size_per_gpu
    z, f = cfg.training.zero_optimization, cfg.training.fp16
    dtype = cfg.training.dtype
    out = {
        "train_batch_size": micro * grad_accum * world_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": cfg.training.gradient_clipping,
        "zero_optimization": {
            "stage": z.stage,
            "allgather_partitions": z.allgather_partitions,
            "allgather_bucket_size": z.allgather_bucket_size,
            "overlap_comm": z.overlap_comm,
            "reduce_scatter": z.reduce_scatter,
            "reduce_bucket_size": z.reduce_bucket_size,
            "contiguous_gradients": z.contiguous_gradients,
            "stage3_param_persistence_threshold": z.stage3_param_persistence_threshold,
        },
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": dtype == "fp16", "loss_scale": f.loss_scale, "initial_scale_power": f.initial_scale_power,
                 "loss_scale_window": f.loss_scale_window, "hysteresis": f.hysteresis,
                 "min_loss_scale": f.min_loss_scale},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if dtype == "bf16":
        # fp32 gradient accumulation and fp32 master weights (DeepSpeed's BF16_Optimizer at ZeRO-1, the ZeRO
        # optimizer at 2 and 3; at ZeRO-0 DeepSpeed would train pure bf16, which train.py refuses)
        out["data_types"] = {"grad_accum_dtype": "fp32"}
    return out


def checkpoint_blocks(model: CausalLM) -> None:
    """Recompute each transformer block in the backward pass (torch's ``checkpoint_wrapper``, non-reentrant; in
    evaluation, without gradients, blocks run as usual). ``state_dict`` names are unchanged by the wrapper."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    layers = model.decoder.layers
    for i, block in enumerate(layers):
        layers[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


MUON = "deepspeed.runtime.zero.muon.muon_optimizer"


def import_muon_uncompiled() -> None:
    """Import DeepSpeed's Muon optimizer module with DeepSpeed's ``compile()`` decorator returning its functions
    unchanged. DeepSpeed's ZeRO and bf16 optimizers import that module at their start (to ask whether the optimizer
    is a Muon one), and it applies ``torch.compile`` to its kernels at import, which imports torch's inductor:
    about a second of CPU at every start (many more on a loaded machine) for an optimizer training never uses (it
    is always torch's AdamW, :mod:`.optim`). Later imports find the module loaded; nothing is patched afterwards."""
    import importlib
    import sys

    if MUON in sys.modules:
        return
    from deepspeed.runtime import compiler

    compile_ = compiler.compile
    compiler.compile = lambda: compiler.dummy_decorator
    try:
        importlib.import_module(MUON)
    except ImportError:  # a DeepSpeed without Muon
        pass
    finally:
        compiler.compile = compile_


def build_engine(cfg: Config, info: DistInfo, prepare: Callable[[CausalLM], None] | None = None):
    """Seeded model (identical on every rank), ``prepare(model)`` (pretrained weights, LoRA, freezing:
    :func:`.finetune.prepare_model`), optimizer over the parameters that train, LR schedule and the DeepSpeed
    engine.

    Returns ``(engine, model, flops)``: ``model`` is the bare :class:`CausalLM` (``engine.module``), ``flops``
    its training FLOPs per token (counted before ZeRO-3 partitions the parameters, on the model without
    adapters)."""
    import deepspeed

    import_muon_uncompiled()
    torch.manual_seed(cfg.training.seed)
    model: CausalLM = build_model(cfg.model).to(info.device)
    flops = flops_per_token(model, cfg.model.seq_length)["total"]
    if prepare is not None:
        prepare(model)
    if cfg.training.checkpoint_activations:
        checkpoint_blocks(model)
    optimizer = build_optimizer(model, cfg, info.device)
    scheduler = build_scheduler(optimizer, cfg)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=deepspeed_config(cfg, info.world_size))
    if cfg.training.torch_compile:
        mode = cfg.training.torch_compile_mode
        engine.compile(backend=cfg.training.torch_compile_backend, compile_kwargs={"mode": mode} if mode else {})
    return engine, model, flops
