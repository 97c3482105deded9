"""What every attention variant shares: the query/key/value projections of the model family (GPT-NeoX's fused
``query_key_value``, or ``q_proj``/``k_proj``/``v_proj``; query/key norms; grouped-query attention), rotary, heads,
the output projection (:class:`neox_dar.standalone.attention.AttentionLayer`, the code exports ship), the inference
cache hooks and the costs. What a variant declares to the rest of the project (keys, rules, descriptions,
statistics) is its torch-free :class:`~neox_dar.variants.spec.VariantSpec`, the module's ``spec`` attribute.

Shapes: ``B`` batch, ``T`` tokens, ``d`` hidden size, ``H`` query heads, ``H_kv`` key/value heads, ``d_h`` head dims.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from ..config_fields import ConfigError
from ..norms import build_norm
from ..standalone.attention import AttentionLayer
from ..standalone.cache import Layout
from ..standalone.rotary import apply_rotary, rotary_table
from ..variants.spec import KERNEL_MAX_HEAD_DIM, VariantSpec
from .windowed import mean_attended_keys

if TYPE_CHECKING:
    from ..config import ModelConfig


class RotaryEmbedding(nn.Module):
    """cos/sin tables for ``rotary_ndims`` dims, computed in float32 as Hugging Face does (``scaling``: Llama-3's
    frequency scaling, or None), and given in the model's dtype, or with ``float32`` kept in float32 (OLMo-2's
    class turns queries and keys in float32 and casts them back).

    Holds no tensors (the tables are recomputed per forward, a negligible cost), so a model built on the
    ``meta`` device and loaded with ``assign=True`` is complete."""

    def __init__(self, rotary_ndims: int, base: int, scaling=None, float32: bool = False):
        super().__init__()
        self.rotary_ndims = rotary_ndims
        self.base = base
        self.scaling = scaling
        self.float32 = float32

    def forward(self, seq_len: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(cos, sin)``, each (T, rotary_ndims), for positions 0..T-1, in ``dtype`` (float32 with
        ``float32``)."""
        return rotary_table(self.rotary_ndims, self.base, self.scaling, seq_len,
                            torch.float32 if self.float32 else dtype, device)


class Attention(AttentionLayer, abc.ABC):
    """Base of every variant: ``forward(a[B,T,d], cos, sin) -> out[B,T,d]``.

    A variant subclasses this in its own module, implements :meth:`attend` over per-head ``q, k, v`` of shape
    (B, H, T, d_h), may add parameters under its own names (``dar_down``, ``router``, ...), and sets :attr:`spec`
    to the :class:`~neox_dar.variants.spec.VariantSpec` subclass that declares how the rest of the project sees it
    (name, keys, rules, statistics, descriptions). A built-in variant's spec names the module (``module_path``) and
    is registered; a plug-in registers its module class: ``neox_dar.variants.register(MyAttention)``. Per forward,
    a variant may set:

    * ``self.aux_tokens``: a loss term at each position, (B, T), already scaled by its coefficient; the model's
      :meth:`~neox_dar.model.CausalLM.aux_loss` adds its mean over the real (non-padding) positions to the loss
      (:attr:`aux_loss`: its mean over every position);
    * ``self.stats``: per-head statistics for the training logs, name -> (H,) tensor (names in ``spec.stats``);
    * ``self.token_stats``: the same statistics per token, name -> (B, T, H), which evaluation averages over real
      (non-padding) positions only.
    """

    spec: ClassVar[type[VariantSpec]]
    # the variant's linear layers whose weight it reads directly instead of calling them (DAR's ``dar_up``, folded
    # into the key/value weights): a LoRA adapter there would be ignored, so finetuning refuses one
    read_by_weight: ClassVar[tuple[str, ...]] = ()

    @property
    def name(self) -> str:
        """The ``attention_type`` this layer computes."""
        return self.spec.name

    # ---- the module -----------------------------------------------------------------------------------------
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.build_projections(cfg.hidden_size, cfg.num_attention_heads, cfg.num_kv_heads, cfg.head_dim,
                               cfg.fused_qkv, cfg.qkv_bias, cfg.attention_out_bias, cfg.qk_norm,
                               lambda width: build_norm(cfg, width, rms=True))
        self.kv_groups = cfg.kv_groups
        self.rotary_ndims = cfg.rotary_ndims
        self.impl = cfg.attention.attention_impl
        self.aux_tokens: torch.Tensor | None = None
        self.stats: dict[str, torch.Tensor] = {}
        self.token_stats: dict[str, torch.Tensor] = {}

    @property
    def aux_loss(self) -> torch.Tensor | None:
        """The layer's loss term over every position of the last forward (the mean of :attr:`aux_tokens`), or
        None."""
        return None if self.aux_tokens is None else self.aux_tokens.mean()

    def key_value(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, through: torch.Tensor | None = None):
        """Rotary-applied ``k`` and ``v``, each (B, H_kv, T, d_h), of ``h`` (B, T, d) through the key and value
        weights (and bias, and key norm) only; with ``through`` (d, d_in), of ``h @ through.T`` for ``h`` (B, T,
        d_in) (:meth:`project`)."""
        _, k, v = self.project(h, query=False, through=through)
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

    def forward(self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split_heads(a, cos, sin)
        return self.merge_heads(self.attend(q, k, v, a, cos, sin))

    @abc.abstractmethod
    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        """Per-head attention output (B, H, T, d_h). ``a`` is the attention input (B, T, d)."""

    # ---- inference: the variant's cache (docs/adding_a_variant.md, "The inference cache") ---------------------
    # A built-in variant subclasses the layer type it computes (neox_dar.standalone: parameters, cache, decode step,
    # export), which comes before this class. A plug-in gets the layer's default cache (each key/value head's keys
    # and values for the widest window of its query heads, head_windows()) and implements decode (and new_cache,
    # remember or prefill when its cache keeps something else).
    def new_cache(self, layout: Layout, device: torch.device, dtype: torch.dtype):
        """An empty cache of this layer for the batch of ``layout`` (:class:`neox_dar.standalone.cache.Layout`),
        tensors on ``device`` in ``dtype``."""
        if type(self).decode is Attention.decode:
            raise ConfigError(f"attention_type '{self.name}' has no incremental decoding: its module must "
                              "implement decode (or subclass a layer type of neox_dar.standalone); see "
                              "docs/adding_a_variant.md")
        return super().new_cache(layout, device, dtype)

    def prefill(self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, rows: torch.Tensor) -> torch.Tensor:
        """The training forward on prompts of equal length (``a`` (n, T, d), positions 0..T-1, ``attention_impl``'s
        path), storing what the cache keeps of them in ``rows`` (n,) of ``cache``, at columns
        ``layout.starts[row] ..``. -> (n, T, d)."""
        q, k, v = self.split_heads(a, cos, sin)
        out = self.merge_heads(self.attend(q, k, v, a, cos, sin))
        self.remember(cache, rows, k, v, a)
        return out

    def remember(self, cache, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor) -> None:
        """Store a prompt's rotated keys and values (n, H_kv, T, d_h) (and anything else from its attention input
        ``a`` (n, T, d)) in ``rows`` of ``cache``."""
        cache.write(k, v, cache.layout.starts[int(rows[0])], rows)

    def decode(self, a: torch.Tensor, cache, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The next ``T`` tokens of every row (``a`` (B, T, d); usually T = 1) against the cache, which stores them:
        -> (B, T, d). ``cos``, ``sin`` (B or 1, 1, T, r): the rotary rows of each row's positions. A plug-in
        implements it (:meth:`new_cache` refuses a variant that does not)."""
        raise ConfigError(f"attention_type '{self.name}' has no incremental decoding")

    def export_spec(self) -> dict:
        """This layer as the exported modeling code reads it (an entry of ``neox_dar_layers`` in ``config.json``):
        the layer type of :mod:`neox_dar.standalone` a built-in variant subclasses says it; a plug-in has no export."""
        raise ConfigError(f"attention_type '{self.name}' has no Hugging Face export: its module must subclass a "
                          "layer type of neox_dar.standalone (whose module the export ships)")

    def resolved_impl(self, device: torch.device) -> str:
        """``attention_impl`` with ``auto`` resolved: ``triton`` on CUDA (for a variant with kernels, when they take
        its ``head_dim``), ``sdpa`` elsewhere."""
        if self.impl == "auto":
            fits = not self.spec.kernels or self.head_dim <= KERNEL_MAX_HEAD_DIM
            return "triton" if device.type == "cuda" and fits else "sdpa"
        return self.impl

    # ---- costs (per layer; describe, the FLOP counter and the report read them) -----------------------------
    def attended_keys(self, seq_len: int) -> float:
        """Mean number of keys one query scores, over positions 0..T-1 (for the FLOP counter)."""
        return sum(mean_attended_keys(seq_len, w) for w in self.head_windows()) / self.num_heads

    def extra_flops_per_token(self) -> float:
        """Training FLOPs per token of matrix products that ``6 * params`` misses (a weight used twice)."""
        return 0.0

    def kv_cache_bytes_per_token(self, context: int, dtype_bytes: int) -> float:
        """Bytes this layer caches per token at a context of ``context`` tokens, its cached numbers
        (:meth:`kv_cache_per_token`) held in the model's dtype of ``dtype_bytes`` bytes."""
        return self.kv_cache_per_token(context) * dtype_bytes

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
