"""All-or-here attention (AHA): the spec of :mod:`neox_dar.attention.aha`."""

from __future__ import annotations

from typing import Literal

from ..config_fields import Key
from .spec import ModelConfig, VariantSpec


class AHASpec(VariantSpec):
    """``attention_type: aha``: per token and head, a router picks full causal attention or a window of
    ``window_size`` keys; an L1 term on the router scores."""

    kernels = True
    name = "aha"
    what = ("per-token, per-head router between full and sliding-window attention (straight-through, "
            "L1 penalty)")
    keys = {
        "aha_threshold": Key(float, 0.5, "AHA router threshold tau on sigmoid scores.", label="tau",
                             rule=lambda v, m: None if 0.0 < v < 1.0 else "must be in (0, 1)"),
        "aha_l1_coef": Key(float, 3e-4, "AHA L1 coefficient lambda on mean router score.", label="l1-", arch=False,
                           rule=lambda v, m: None if v >= 0 else "must be >= 0"),
        "aha_ste": Key(Literal["selected", "difference"], "selected",
                       "AHA straight-through dL/ds: selected (the paper's Eq. 3-4 read literally: signed <dL/do, "
                       "selected path>) or difference (<dL/do, Full - Local>; one extra attention forward per layer "
                       "in training).", arch=False),
        "aha_router_init": Key(Literal["zeros", "random"], "zeros",
                               "How the router starts when AHA is added to a pretrained model (finetune): zeros "
                               "(s = 1/2 for every token and head, so at aha_threshold 0.5 every head starts on its "
                               "local window: step 0 is the SWA model, and with aha_threshold < 0.5 every head "
                               "starts on full attention: step 0 is the pretrained model exactly) or random "
                               "(init_method).", arch=False),
    }
    reads = ("window_size",)
    stats = {"mu_f": "full-attention usage: the share of (token, head) pairs routed to full attention (AHA Eq. 8)"}
    module_path = "neox_dar.attention.aha:AHAAttention"

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        cls.require_window(cfg)
        cls.warn_if_window_holds_every_key(cfg, "AHA's local path sees every key, so both paths are full attention "
                                                "(vanilla attention plus a router and its L1 term)")

    @classmethod
    def summary(cls, cfg: ModelConfig) -> str:
        return f"{cls.name} w={cfg.attention.window_size} l1={cfg.attention.aha_l1_coef:g}"

    @classmethod
    def describe(cls, cfg: ModelConfig) -> list[str]:
        a = cfg.attention
        return [f"window w={a.window_size} (keys j with i - j < w, itself included); router threshold "
                f"{a.aha_threshold}, L1 coefficient {a.aha_l1_coef}"]
