"""What every attention layer type shares: the query/key/value and output projections of the model families
(:class:`HeadProjections`) and the base of the layer types (:class:`AttentionLayer`). Plain PyTorch (the package's
rule, :mod:`neox_dar.standalone`).

Shapes: ``B`` batch, ``T`` tokens, ``d`` hidden size, ``H`` query heads, ``H_kv`` key/value heads, ``d_h`` head dims.
"""

from __future__ import annotations

from typing import Callable, ClassVar

import torch
import torch.nn.functional as F

from .cache import WindowedKV
from .rotary import apply_rotary


class HeadProjections:
    """Query/key/value and output projections of the model families, mixed into a ``torch.nn.Module``: GPT-NeoX's
    fused ``query_key_value`` (each head's rows ``[q, k, v]``) and ``dense``, or ``q_proj``, ``k_proj``, ``v_proj``,
    ``o_proj``; the optional query/key RMSNorms before rotary (over the whole projection: OLMo-2; per head: Qwen3);
    grouped-query attention (``H_kv`` key/value heads)."""

    def build_projections(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, fused: bool,
                          qkv_bias: bool, out_bias: bool, qk_norm: str, rms_norm: Callable[[int], torch.nn.Module]):
        """Create the projection modules; ``rms_norm(width)`` makes the family's query/key norm."""
        self.hidden_size = hidden_size
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.fused, self.qk_norm = fused, qk_norm
        width, kv_width = num_heads * head_dim, num_kv_heads * head_dim
        if fused:  # GPT-NeoX: one projection, output rows per head as [q (d_h), k (d_h), v (d_h)]
            self.query_key_value = torch.nn.Linear(hidden_size, 3 * width, bias=qkv_bias)
            self.dense = torch.nn.Linear(width, hidden_size, bias=out_bias)
        else:
            self.q_proj = torch.nn.Linear(hidden_size, width, bias=qkv_bias)
            self.k_proj = torch.nn.Linear(hidden_size, kv_width, bias=qkv_bias)
            self.v_proj = torch.nn.Linear(hidden_size, kv_width, bias=qkv_bias)
            self.o_proj = torch.nn.Linear(width, hidden_size, bias=out_bias)
        if qk_norm != "none":  # over the whole projection (OLMo-2) or each head (Qwen3)
            per_head = qk_norm == "head"
            self.q_norm = rms_norm(head_dim if per_head else width)
            self.k_norm = rms_norm(head_dim if per_head else kv_width)

    def project(self, h: torch.Tensor, query: bool = True, through: torch.Tensor | None = None):
        """``h`` (B, T, d) -> ``q`` (B, T, H, d_h) (None without ``query``), ``k``, ``v`` (B, T, H_kv, d_h), with the
        family's query/key norms applied (before rotary). Without ``query`` only the key and value weights are
        applied (DAR's bottlenecked keys and values).

        ``through`` (d, d_in), with ``h`` (B, T, d_in): the projections of ``h @ through.T``, computed as
        ``h @ (W through).T``: each weight ``W`` (rows, d) times ``through`` once per call, then one (rows x d_in)
        product per token instead of a (d x d_in) and a (rows x d) one (DAR: ``through`` is ``dar_up``'s weight). A
        projection that is not a plain ``Linear`` (peft's LoRA layer, whose adapter has its own product) is called
        on ``h @ through.T``."""
        B, T, _ = h.shape
        H, G, D = self.num_heads, self.num_kv_heads, self.head_dim

        def weights(w: torch.Tensor) -> torch.Tensor:
            return w if through is None else w @ through

        if self.fused:
            weight, bias = self.query_key_value.weight, self.query_key_value.bias
            if not query:
                weight = weight.view(H, 3, D, -1)[:, 1:].reshape(2 * H * D, -1)
                bias = None if bias is None else bias.view(H, 3, D)[:, 1:].reshape(2 * H * D)
            parts = F.linear(h, weights(weight), bias).view(B, T, H, -1).split(D, dim=-1)
            q, (k, v) = (parts[0], parts[1:]) if query else (None, parts)
        else:
            def linear(m: torch.nn.Module, heads: int) -> torch.Tensor:
                if through is None or type(m) is not torch.nn.Linear:  # a wrapper (peft's LoRA) adds its own path
                    return m(h if through is None else F.linear(h, through)).view(B, T, heads, D)
                return F.linear(h, weights(m.weight), m.bias).view(B, T, heads, D)

            q = linear(self.q_proj, H) if query else None
            k, v = linear(self.k_proj, G), linear(self.v_proj, G)
        if self.qk_norm == "head":
            q = self.q_norm(q) if query else None
        elif self.qk_norm == "projection":
            q = self.q_norm(q.reshape(B, T, H * D)).view(B, T, H, D) if query else None
        return q, self.normalize_keys(k), v

    def normalize_keys(self, k: torch.Tensor) -> torch.Tensor:
        """The family's key norm (before rotary) of ``k`` (B, T, H_kv, d_h): per head (Qwen3), over the whole
        projection (OLMo-2), or none."""
        if self.qk_norm == "head":
            return self.k_norm(k)
        if self.qk_norm == "projection":
            return self.k_norm(k.flatten(-2)).view(k.shape)
        return k

    def key_value_weights(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """``(W_k, b_k, W_v, b_v)``: the key and value projections as (H_kv d_h, d) matrices and (H_kv d_h,) biases
        (None without), GPT-NeoX's rows of ``query_key_value`` or ``k_proj``/``v_proj``."""
        if not self.fused:
            return self.k_proj.weight, self.k_proj.bias, self.v_proj.weight, self.v_proj.bias
        H, D = self.num_heads, self.head_dim
        w = self.query_key_value.weight.view(H, 3, D, -1)
        b = None if self.query_key_value.bias is None else self.query_key_value.bias.view(H, 3, D)
        rows = [(w[:, i].reshape(H * D, -1), None if b is None else b[:, i].reshape(H * D)) for i in (1, 2)]
        return (*rows[0], *rows[1])

    def split_heads(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """``h`` (B, T, d) -> rotary-applied ``q`` (B, H, T, d_h) and ``k``, ``v`` (B, H_kv, T, d_h)."""
        q, k, v = self.project(h)
        return apply_rotary(q.transpose(1, 2), cos, sin), apply_rotary(k.transpose(1, 2), cos, sin), v.transpose(1, 2)

    def merge_heads(self, o: torch.Tensor) -> torch.Tensor:
        """(B, H, T, d_h) -> the output projection of (B, T, H d_h)."""
        B, H, T, D = o.shape
        out = o.transpose(1, 2).reshape(B, T, H * D)
        return self.dense(out) if self.fused else self.o_proj(out)


class AttentionLayer(HeadProjections, torch.nn.Module):
    """One attention layer at inference: the family's projections (:meth:`build_projections`, which sets the shapes)
    and the layer type's parameters, cache and decode step. Each layer type subclasses it in its own module
    (:mod:`.windowed`, :mod:`.dar`, :mod:`.aha`, :mod:`.linear`, :mod:`.dimpo`) with:

    * ``layer_type``: its name in an export's ``config.json`` (``neox_dar_layers``);
    * ``build_variant(**args)``: its parameters, made after the projections; ``args`` are what :meth:`export_spec`
      returns besides ``type``;
    * ``export_spec()``: the layer as ``neox_dar_layers`` lists it, ``{"type": layer_type, **args}``;
    * ``new_cache(layout, device, dtype)``: an empty cache of the layer for the batch of ``layout``
      (:class:`~.cache.Layout`); default a :class:`~.cache.WindowedKV` of each key/value head's keys and values
      for the widest window of its query heads (:meth:`head_windows`);
    * ``decode(a, cache, cos, sin)``: the next ``T`` tokens of every row (``a`` (B, T, d); usually T = 1) against
      the cache, which stores them -> (B, T, d); ``cos``, ``sin`` (B or 1, 1, T, r): the rotary rows of each row's
      positions.

    The exported model builds the type its ``config.json`` names; ``neox_dar.attention``'s modules subclass the
    type they compute, so ``neox_dar.generate`` and the export decode through the same code. Whoever builds the
    layer sets ``rotary_ndims``."""

    layer_type: ClassVar[str] = ""
    rotary_ndims: int

    def head_windows(self) -> list[int | None]:
        """Each query head's window (None: every earlier key; 0: none at full width)."""
        return [None] * self.num_heads

    def new_cache(self, layout, device: torch.device, dtype: torch.dtype):
        return WindowedKV(layout, self.head_windows(), self.num_kv_heads, self.head_dim, self.head_dim, device, dtype)
