"""What every attention variant shares: the fused QKV projection, rotary, heads, output projection, and the
declarations (keys, rules, costs, descriptions, statistics) through which the rest of the project uses a variant.

Shapes: ``B`` batch, ``T`` tokens, ``d`` hidden size, ``H`` heads, ``d_h = d / H``.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from ..config.fields import Key, check
from .windowed import mean_attended_keys

if TYPE_CHECKING:
    from ..config import ModelConfig


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX "rotate half": ``[x1, x2] -> [-x2, x1]`` over the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of ``x`` (B, H, T, d_h); ``cos``/``sin`` are (T, r)."""
    r = cos.shape[-1]
    if r == 0:
        return x
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for ``rotary_ndims`` dims, computed in float32 as Hugging Face GPT-NeoX does.

    Holds no tensors (the tables are recomputed per forward, a negligible cost), so a model built on the
    ``meta`` device and loaded with ``assign=True`` is complete."""

    def __init__(self, rotary_ndims: int, base: int):
        super().__init__()
        self.rotary_ndims = rotary_ndims
        self.base = base

    def forward(self, seq_len: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(cos, sin)``, each (T, rotary_ndims), for positions 0..T-1."""
        r = self.rotary_ndims
        inv_freq = 1.0 / (self.base ** (torch.arange(0, r, 2, dtype=torch.float, device=device) / r))
        freqs = torch.arange(seq_len, device=device, dtype=torch.float)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module, abc.ABC):
    """Base of every variant: ``forward(a[B,T,d], cos, sin) -> out[B,T,d]``.

    A variant subclasses this in its own module, implements :meth:`attend` over per-head ``q, k, v`` of shape
    (B, H, T, d_h), may add parameters under its own names (``dar_down``, ``router``, ...), and declares how the
    rest of the project sees it (class attributes and class methods below). Then one call registers it:
    ``neox_dar.attention.register(MyAttention)``. Per forward, a variant may set:

    * ``self.aux_loss``: a loss term (scalar tensor, already scaled by its coefficient), summed into the loss;
    * ``self.stats``: per-head statistics for the training logs, name -> (H,) tensor (names in :attr:`stats`);
    * ``self.token_stats``: the same statistics per token, name -> (B, T, H), which evaluation averages over real
      (non-padding) positions only.
    """

    name: ClassVar[str] = ""                    # the attention_type value
    keys: ClassVar[dict[str, Key]] = {}         # config keys this variant adds (type, default, help, sweep label)
    reads: ClassVar[tuple[str, ...]] = ()       # common attention keys it reads, e.g. ("window_size",)
    stats: ClassVar[dict[str, str]] = {}        # per-head statistics it logs: name -> one-line meaning

    # ---- configuration ------------------------------------------------------------------------------------
    @classmethod
    def reads_keys(cls) -> frozenset[str]:
        """Every attention key the variant reads: its own keys and the common ones in :attr:`reads`."""
        return frozenset(cls.keys) | frozenset(cls.reads)

    @classmethod
    def resolve(cls, cfg: ModelConfig) -> dict[str, Any]:
        """Values of its keys whose defaults depend on the model (e.g. ``dar_d_down: null`` -> d / 4)."""
        return {}

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        """Rules that hold when this variant is chosen; raise through :func:`neox_dar.config.fields.check`."""

    @classmethod
    def require_window(cls, cfg: ModelConfig) -> None:
        """``window_size >= 1``: for variants whose local path must see at least the token itself."""
        w = cfg.attention.window_size
        check(w >= 1, "window_size", f"must be >= 1 for attention_type '{cls.name}'", w)

    # ---- descriptions -------------------------------------------------------------------------------------
    @classmethod
    def summary(cls, cfg: ModelConfig) -> str:
        """The attention in a few words for listings (sweep plans, the report): ``dar d_down=128 w=64``."""
        return cls.name

    @classmethod
    def label(cls, cfg: ModelConfig) -> str:
        """The kind of attention, for grouping runs in figures (``mswa-heads``); default: the name."""
        return cls.name

    @classmethod
    def describe(cls, cfg: ModelConfig) -> list[str]:
        """Lines ``python -m neox_dar.describe`` prints about the variant's own settings (windows, widths)."""
        return []

    # ---- the module -----------------------------------------------------------------------------------------
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.hidden_size = cfg.hidden_size
        self.impl = cfg.attention.attention_impl
        self.query_key_value = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.aux_loss: torch.Tensor | None = None
        self.stats: dict[str, torch.Tensor] = {}
        self.token_stats: dict[str, torch.Tensor] = {}

    def split_heads(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """``h`` (B, T, d) -> rotary-applied ``q, k`` and ``v``, each (B, H, T, d_h), in HF's fused layout."""
        B, T, _ = h.shape
        qkv = self.query_key_value(h).view(B, T, self.num_heads, 3 * self.head_dim).transpose(1, 2)
        q, k, v = qkv.chunk(3, dim=-1)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def merge_heads(self, o: torch.Tensor) -> torch.Tensor:
        """(B, H, T, d_h) -> dense((B, T, d))."""
        B, H, T, D = o.shape
        return self.dense(o.transpose(1, 2).reshape(B, T, H * D))

    def forward(self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split_heads(a, cos, sin)
        return self.merge_heads(self.attend(q, k, v, a, cos, sin))

    @abc.abstractmethod
    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        """Per-head attention output (B, H, T, d_h). ``a`` is the attention input (B, T, d)."""

    def resolved_impl(self, device: torch.device) -> str:
        """``attention_impl`` with ``auto`` resolved: ``triton`` on CUDA, ``sdpa`` elsewhere."""
        if self.impl == "auto":
            return "triton" if device.type == "cuda" else "sdpa"
        return self.impl

    # ---- costs (per layer; describe, the FLOP counter and the report read them) -----------------------------
    def head_windows(self) -> list[int | None]:
        """Each head's window (None: every earlier key; 0: none at full width), for ``describe``."""
        return [None] * self.num_heads

    def attended_keys(self, seq_len: int) -> float:
        """Mean number of keys one query scores, over positions 0..T-1 (for the FLOP counter)."""
        return sum(mean_attended_keys(seq_len, w) for w in self.head_windows()) / self.num_heads

    def extra_flops_per_token(self) -> float:
        """Training FLOPs per token of matrix products that ``6 * params`` misses (a weight used twice)."""
        return 0.0

    def kv_cache_per_token(self, context: int) -> float:
        """Numbers this layer caches per token at inference, averaged over a context of ``context`` tokens:
        ``2 d_h`` per head for the keys each head can still see (its window, or every earlier key)."""
        return sum(2.0 * self.head_dim * (min(w, context) if w is not None else context) / context
                   for w in self.head_windows())

    def flop_notes(self, context: int) -> list[str]:
        """Extra lines ``describe`` prints under the FLOPs (e.g. bounds that depend on the data)."""
        return []

    def cache_notes(self, context: int) -> list[str]:
        """Extra lines ``describe`` prints under the KV cache (what a token keeps)."""
        return []
