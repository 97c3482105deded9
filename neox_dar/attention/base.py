"""What every attention variant shares: the query/key/value projections of the model family (GPT-NeoX's fused
``query_key_value``, or ``q_proj``/``k_proj``/``v_proj``; query/key norms; grouped-query attention), rotary, heads,
the output projection, and the declarations (keys, rules, costs, descriptions, statistics) through which the rest of
the project uses a variant.

Shapes: ``B`` batch, ``T`` tokens, ``d`` hidden size, ``H`` query heads, ``H_kv`` key/value heads, ``d_h`` head dims.
"""

from __future__ import annotations

import abc
import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..config.fields import Key, check
from ..norms import build_norm
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


def llama3_inv_freq(inv_freq: torch.Tensor, scaling) -> torch.Tensor:
    """Llama-3's rotary scaling (Hugging Face ``rope_type: llama3``): wavelengths longer than
    ``original_max_position_embeddings / low_freq_factor`` are divided by ``factor``, those shorter than
    ``... / high_freq_factor`` kept, and the ones between interpolated smoothly."""
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = ((scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for ``rotary_ndims`` dims, computed in float32 as Hugging Face does (``scaling``: Llama-3's
    frequency scaling, or None).

    Holds no tensors (the tables are recomputed per forward, a negligible cost), so a model built on the
    ``meta`` device and loaded with ``assign=True`` is complete."""

    def __init__(self, rotary_ndims: int, base: int, scaling=None):
        super().__init__()
        self.rotary_ndims = rotary_ndims
        self.base = base
        self.scaling = scaling

    def forward(self, seq_len: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(cos, sin)``, each (T, rotary_ndims), for positions 0..T-1."""
        r = self.rotary_ndims
        inv_freq = 1.0 / (self.base ** (torch.arange(0, r, 2, dtype=torch.float, device=device) / r))
        if self.scaling is not None:
            inv_freq = llama3_inv_freq(inv_freq, self.scaling)
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
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_kv_heads, cfg.head_dim
        self.kv_groups = cfg.kv_groups
        self.hidden_size = cfg.hidden_size
        self.impl = cfg.attention.attention_impl
        self.fused = cfg.fused_qkv
        self.qk_norm = cfg.qk_norm
        width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if self.fused:  # GPT-NeoX: one projection, output rows per head as [q (d_h), k (d_h), v (d_h)]
            self.query_key_value = nn.Linear(cfg.hidden_size, 3 * width, bias=cfg.qkv_bias)
            self.dense = nn.Linear(width, cfg.hidden_size, bias=cfg.attention_out_bias)
        else:
            self.q_proj = nn.Linear(cfg.hidden_size, width, bias=cfg.qkv_bias)
            self.k_proj = nn.Linear(cfg.hidden_size, kv_width, bias=cfg.qkv_bias)
            self.v_proj = nn.Linear(cfg.hidden_size, kv_width, bias=cfg.qkv_bias)
            self.o_proj = nn.Linear(width, cfg.hidden_size, bias=cfg.attention_out_bias)
        if self.qk_norm != "none":  # over the whole projection (OLMo-2) or each head (Qwen3)
            per_head = self.qk_norm == "head"
            self.q_norm = build_norm(cfg, self.head_dim if per_head else width, rms=True)
            self.k_norm = build_norm(cfg, self.head_dim if per_head else kv_width, rms=True)
        self.aux_loss: torch.Tensor | None = None
        self.stats: dict[str, torch.Tensor] = {}
        self.token_stats: dict[str, torch.Tensor] = {}

    def project(self, h: torch.Tensor, query: bool = True):
        """``h`` (B, T, d) -> ``q`` (B, T, H, d_h) (None without ``query``), ``k``, ``v`` (B, T, H_kv, d_h), with the
        family's query/key norms applied (before rotary). Without ``query`` only the key and value weights are
        applied (DAR's bottlenecked keys and values)."""
        B, T, _ = h.shape
        H, G, D = self.num_heads, self.num_kv_heads, self.head_dim
        if self.fused:
            weight, bias = self.query_key_value.weight, self.query_key_value.bias
            if not query:
                weight = weight.view(H, 3, D, -1)[:, 1:].reshape(2 * H * D, -1)
                bias = None if bias is None else bias.view(H, 3, D)[:, 1:].reshape(2 * H * D)
            parts = F.linear(h, weight, bias).view(B, T, H, -1).split(D, dim=-1)
            q, (k, v) = (parts[0], parts[1:]) if query else (None, parts)
        else:
            q = self.q_proj(h).view(B, T, H, D) if query else None
            k, v = self.k_proj(h).view(B, T, G, D), self.v_proj(h).view(B, T, G, D)
        if self.qk_norm == "head":
            q, k = (self.q_norm(q) if query else None), self.k_norm(k)
        elif self.qk_norm == "projection":
            q = self.q_norm(q.reshape(B, T, H * D)).view(B, T, H, D) if query else None
            k = self.k_norm(k.reshape(B, T, G * D)).view(B, T, G, D)
        return q, k, v

    def split_heads(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """``h`` (B, T, d) -> rotary-applied ``q`` (B, H, T, d_h) and ``k``, ``v`` (B, H_kv, T, d_h)."""
        q, k, v = self.project(h)
        return apply_rotary(q.transpose(1, 2), cos, sin), apply_rotary(k.transpose(1, 2), cos, sin), v.transpose(1, 2)

    def key_value(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotary-applied ``k`` and ``v``, each (B, H_kv, T, d_h), of ``h`` (B, T, d) through the key and value
        weights (and bias, and key norm) only."""
        _, k, v = self.project(h, query=False)
        return apply_rotary(k.transpose(1, 2), cos, sin), v.transpose(1, 2)

    def expand_kv(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Key/value tensors (B, H_kv, T, d_h) repeated to one per query head (B, H, T, d_h) for the paths that
        need it (reference, sdpa); query head h reads key/value head h // (H / H_kv). The Triton kernels read the
        H_kv heads directly."""
        if self.kv_groups == 1:
            return xs
        return tuple(x.repeat_interleave(self.kv_groups, dim=1) for x in xs)

    def wants_calibration(self) -> bool:
        """Whether :meth:`init_new_parameters` needs this layer's attention inputs on calibration data."""
        return False

    def init_new_parameters(self, inputs: torch.Tensor | None) -> None:
        """Called when this variant is added to a pretrained model (``finetune`` from a checkpoint that lacks this
        module's variant parameters), after they got ``init_method``: a variant may choose another start (DAR's
        PCA bottleneck, AHA's zero router). ``inputs``: this layer's attention inputs ``a`` (N, d) on calibration
        sequences when :meth:`wants_calibration`, else None. Default: keep ``init_method``."""

    def merge_heads(self, o: torch.Tensor) -> torch.Tensor:
        """(B, H, T, d_h) -> the output projection of (B, T, H d_h)."""
        B, H, T, D = o.shape
        out = o.transpose(1, 2).reshape(B, T, H * D)
        return self.dense(out) if self.fused else self.o_proj(out)

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
        ``2 d_h`` per key/value head for the keys its query heads can still see (the largest of their windows, or
        every earlier key)."""
        windows = self.head_windows()
        total = 0.0
        for g in range(self.num_kv_heads):
            group = windows[g * self.kv_groups:(g + 1) * self.kv_groups]
            w = None if any(x is None for x in group) else max(group)
            total += 2.0 * self.head_dim * (min(w, context) if w is not None else context) / context
        return total

    def flop_notes(self, context: int) -> list[str]:
        """Extra lines ``describe`` prints under the FLOPs (e.g. bounds that depend on the data)."""
        return []

    def cache_notes(self, context: int) -> list[str]:
        """Extra lines ``describe`` prints under the KV cache (what a token keeps)."""
        return []
