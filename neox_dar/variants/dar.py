"""Distance-adaptive representation (DAR) and its ``uniform`` baseline: the specs of
:mod:`neox_dar.attention.dar`."""

from __future__ import annotations

import warnings
from typing import Any, Literal, Optional

from ..config_fields import Key
from ..notices import Notice
from .spec import ModelConfig, VariantSpec


class DARSpec(VariantSpec):
    """``attention_type: dar``: full-width keys and values for the ``window_size`` nearest keys, a ``dar_d_down``
    bottleneck beyond."""

    kernels = True
    name = "dar"
    what = ("distance-adaptive representation: full-width K/V for the `w` nearest keys, a `d -> d_down -> d` "
            "bottleneck beyond")
    keys = {"dar_d_down": Key(Optional[int], None, "DAR/uniform bottleneck width, 1..hidden_size (default "
                                                   "hidden_size // 4).", label="d",
                              rule=lambda v, m: None if 1 <= v <= m.hidden_size else
                              f"must be in 1..hidden_size={m.hidden_size}"),
            "dar_init": Key(Literal["random", "pca"], "random",
                            "How the bottleneck starts when DAR is added to a pretrained model (finetune): random "
                            "(init_method) or pca (dar_down = the top dar_d_down principal directions of the layer's "
                            "attention input on dar_init_samples training sequences, dar_up its transpose: the best "
                            "rank-d_down reconstruction at step 0).", arch=False),
            "dar_inference_cache": Key(Literal["keys", "latent"], "keys",
                                       "What DAR's inference cache keeps per far token (docs/inference.md): keys = "
                                       "c = dar_down(h) plus the far key's rotated dims (H_kv x rotary dims; all "
                                       "head dims with a key norm), computed once, so a decode step does vanilla's "
                                       "arithmetic; latent = c only (the paper's d_down per token), those dims "
                                       "rebuilt from c at every step.", arch=False),
            "dar_init_samples": Key(int, 16, "Training sequences the pca bottleneck start is computed on.",
                                    arch=False, rule=lambda v, m: None if v >= 1 else "must be >= 1")}
    reads = ("window_size",)
    module_path = "neox_dar.attention.dar:DARAttention"

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        cls.warn_if_window_holds_every_key(cfg, "every key is inside DAR's window, so this is vanilla attention (the "
                                                "bottleneck is never used)")

    @classmethod
    def resolve(cls, cfg: ModelConfig) -> dict[str, Any]:
        if cfg.attention.dar_d_down is None:
            return {"dar_d_down": max(1, cfg.hidden_size // 4)}
        return {}

    @classmethod
    def window_of(cls, cfg: ModelConfig) -> int:
        """The window w: keys with ``i - j < w`` use the full-width keys and values."""
        return cfg.attention.window_size

    @classmethod
    def summary(cls, cfg: ModelConfig) -> str:
        return f"{cls.name} d_down={cfg.attention.dar_d_down} w={cls.window_of(cfg)}"

    @classmethod
    def describe(cls, cfg: ModelConfig) -> list[str]:
        return [f"window w={cls.window_of(cfg)} (keys with i - j < w use full width), "
                f"d_down={cfg.attention.dar_d_down}"]


class UniformSpec(DARSpec):
    """``attention_type: uniform``: DAR with ``w = 0``, every key through the bottleneck."""

    name = "uniform"
    what = "the bottleneck for every key (DAR with `w = 0`)"
    reads = ()
    module_path = "neox_dar.attention.dar:UniformAttention"

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        if cfg.attention.window_size not in (0, 128):
            warnings.warn(f"attention_type '{cls.name}' ignores window_size (every key uses the bottleneck)",
                          Notice, stacklevel=6)

    @classmethod
    def window_of(cls, cfg: ModelConfig) -> int:
        return 0

    @classmethod
    def summary(cls, cfg: ModelConfig) -> str:
        return f"{cls.name} d_down={cfg.attention.dar_d_down}"
