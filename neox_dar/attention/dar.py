"""Distance-adaptive representation (DAR) and its ``uniform`` baseline (DAR with ``w = 0``).

Per layer two bias-free linears, ``dar_down`` (d -> d_down) and ``dar_up`` (d_down -> d), give the
bottlenecked input ``h' = dar_up(dar_down(a))``. The local keys/values come from ``a`` and the global ones
from ``h'``, both through the layer's own key and value weights (GPT-NeoX's ``query_key_value`` rows, or
``k_proj``/``v_proj``; bias included) and, in the families that have one, its key norm (OLMo-2, Qwen3: ``k_glob``
is normalised exactly like ``k``, so the global keys live on the scale the queries were trained against); rotary
applies to ``q``, ``k_loc`` and ``k_glob`` at their own positions. With grouped-query attention the bottleneck
feeds the ``H_kv`` key/value heads, and query head ``h`` reads key/value head ``h // (H / H_kv)`` of both sets. Pair ``(i, j)`` uses ``k_loc[j], v_loc[j]`` when
``i - j < w`` and ``k_glob[j], v_glob[j]`` otherwise, under one softmax over all ``j <= i``.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..notices import Notice
from ..standalone.dar import DARCache, DARLayer
from ..variants.dar import DARSpec, UniformSpec
from .base import Attention
from .masks import window_mask
from .triton_bridge import triton_kernels

if TYPE_CHECKING:
    from ..config import ModelConfig


def dar_masks(seq_len: int, window: int, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean (T, T) masks ``(near, far)``: ``near`` = causal and ``i - j < w``, ``far`` = causal, ``i - j >= w``."""
    causal = window_mask(seq_len, None, device)
    near = window_mask(seq_len, window, device)
    return near, causal & ~near


def dar_reference(q, k_loc, v_loc, k_glob, v_glob, window: int) -> torch.Tensor:
    """DAR attention by explicit per-pair source selection in float32; inputs (B, H, T, d_h) -> (B, H, T, d_h)."""
    T = q.shape[-2]
    near, far = dar_masks(T, window, q.device)
    qf = q.float()
    scale = 1.0 / math.sqrt(q.shape[-1])
    s_loc = (qf @ k_loc.float().transpose(-1, -2)) * scale
    s_glob = (qf @ k_glob.float().transpose(-1, -2)) * scale
    scores = torch.where(near, s_loc, s_glob).masked_fill(~(near | far), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = (probs * near) @ v_loc.float() + (probs * far) @ v_glob.float()
    return out.to(q.dtype)


def dar_sdpa(q, k_loc, v_loc, k_glob, v_glob, window: int) -> torch.Tensor:
    """DAR attention as one SDPA call over the concatenated keys ``[k_loc; k_glob]`` (B, H, 2T, d_h).

    The (T, 2T) boolean mask lets pair ``(i, j)`` through the near half when ``i - j < w`` and through the
    far half otherwise, so each pair is scored exactly once. ``w = 0`` (uniform) is plain causal SDPA on the
    global keys. Memory O(T) per head on CUDA (memory-efficient kernel); the mask is shared by all heads.
    """
    if window == 0:
        return F.scaled_dot_product_attention(q, k_glob, v_glob, is_causal=True)
    near, far = dar_masks(q.shape[-2], window, q.device)
    k = torch.cat((k_loc, k_glob), dim=-2)
    v = torch.cat((v_loc, v_glob), dim=-2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.cat((near, far), dim=-1))


@functools.lru_cache(maxsize=None)
def warn_too_wide(d_down: int, rotated: int, heads: int, max_dims: int, max_heads: int) -> None:
    warnings.warn(f"DAR decode: d_down = {d_down}, {rotated} rotated key dims per far column or {heads} heads are "
                  f"more than the far-column kernel's {max_dims} dims or {max_heads} heads; the decode step runs the "
                  "PyTorch path (every score materialised)", Notice, stacklevel=3)


class DARAttention(DARLayer, Attention):
    """DAR (``attention_type: dar``): full-width keys and values for the ``window_size`` nearest keys, the
    bottleneck beyond.

    Parameters beyond vanilla: ``dar_down.weight`` (d_down, d) and ``dar_up.weight`` (d, d_down), no biases
    (:class:`~neox_dar.standalone.dar.DARLayer`, whose cache and decode step it inherits). They are input-side
    matrices, so ``init_weights`` gives them ``init_method`` (small_init) like ``query_key_value``.
    """

    spec = DARSpec
    read_by_weight = ("dar_up",)  # folded into the key/value weights (global_kv) and the inference cache

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.init = cfg.attention.dar_init
        self.build_variant(self.spec.window_of(cfg), cfg.attention.dar_d_down, cfg.attention.dar_inference_cache)

    def wants_calibration(self) -> bool:
        return self.init == "pca"

    def init_new_parameters(self, inputs: torch.Tensor | None) -> None:
        """``dar_init: pca``: with ``inputs`` (N, d) = this layer's attention inputs on the calibration sequences and
        ``V`` (d, d_down) the top eigenvectors of their uncentered second moment ``inputs^T inputs`` (float64),
        ``dar_down = V^T`` and ``dar_up = V``: ``dar_up(dar_down(a))`` is the orthogonal projection of ``a`` on
        the top ``d_down`` principal directions, the best rank-``d_down`` linear reconstruction of the inputs
        (its squared error is the sum of the other eigenvalues). ``random`` keeps ``init_method``."""
        if self.init != "pca":
            return
        x = inputs.double()
        _, vectors = torch.linalg.eigh(x.T @ x)  # ascending eigenvalues
        top = vectors[:, -self.d_down:].flip(-1)  # (d, d_down), largest first
        with torch.no_grad():
            self.dar_down.weight.copy_(top.T.to(self.dar_down.weight.dtype))
            self.dar_up.weight.copy_(top.to(self.dar_up.weight.dtype))

    def global_kv(self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``k_glob`` (rotary applied) and ``v_glob``, each (B, H_kv, T, d_h), from ``h' = dar_up(dar_down(a))``
        through the layer's own key and value weights, bias and key norm (the global query is never used).

        Computed as ``(W_kv W_up) c`` with ``c = dar_down(a)``: the product of the key/value rows with ``dar_up``'s
        weight, (2 H_kv d_h x d_down), is formed once per call, so a token costs a (2 H_kv d_h x d_down) product
        instead of ``dar_up``'s (d x d_down) and the key/value rows' (2 H_kv d_h x d): at Pythia-160M's shape
        (d 768, d_down 192) 0.29M multiply-adds a token and layer instead of 1.33M, and ``h'`` is never stored.
        The same association as the inference cache (:class:`~neox_dar.standalone.dar.DARCache`); only the
        rounding differs from ``key_value(dar_up(dar_down(a)))``."""
        return self.key_value(self.dar_down(a), cos, sin, through=self.dar_up.weight)

    def attend(self, q, k, v, a, cos, sin) -> torch.Tensor:
        k_glob, v_glob = self.global_kv(a, cos, sin)
        impl = self.resolved_impl(q.device)
        if impl == "triton":  # reads the H_kv key/value heads directly
            return triton_kernels(q.device).dar_attention(q, k, v, k_glob, v_glob, self.window)
        k, v, k_glob, v_glob = self.expand_kv(k, v, k_glob, v_glob)
        if impl == "reference":
            return dar_reference(q, k, v, k_glob, v_glob, self.window)
        return dar_sdpa(q, k, v, k_glob, v_glob, self.window)

    # ---- inference cache (paper Sec. 5): k_loc, v_loc of the last w tokens, dar_down(h) of every token --------
    def remember(self, cache: DARCache, rows, k, v, a) -> None:
        cache.write(k, v, self.dar_down(a), cache.layout.starts[int(rows[0])], rows)

    def decode_kernel(self, cache: DARCache, device: torch.device):
        """A decode step with far columns: on the ``triton`` path the kernels' ``dar_decode_attention`` (each far
        column's ``c`` and rotated key dims read once for all heads, no far score materialised) where the layer fits
        a launch (``d_down`` and ``H_kv`` x the far key's not-absorbed dims, ``cache.width``, at most 256 each, 16
        heads: Pythia's shapes); elsewhere None, the standalone layer's softmax over every score (on the ``triton``
        path with a warning, once)."""
        if self.resolved_impl(device) != "triton":
            return None
        kernels = triton_kernels(device)
        rotated = self.num_kv_heads * cache.width
        if kernels.dar_decode.fits(self.d_down, rotated, self.num_heads):
            return kernels.dar_decode_attention
        warn_too_wide(self.d_down, rotated, self.num_heads, kernels.dar_decode.MAX_DIMS, kernels.dar_decode.MAX_HEADS)
        return None

    def head_windows(self) -> list[int | None]:
        return [self.window] * self.num_heads

    def attended_keys(self, seq_len: int) -> float:
        """Each (i, j) pair is scored once, through one of the two key sets: vanilla's ``(T + 1) / 2``."""
        return (seq_len + 1) / 2

    def extra_flops_per_token(self) -> float:
        """The second pass through the key and value weights for ``k_glob, v_glob``: a (2 H_kv d_h x d) product,
        2 FLOPs per multiply-add, ``x3`` for forward + backward (``12 d^2`` without grouped-query attention).
        (``dar_down``/``dar_up`` are used once per token and are already in ``6 N``; each (i, j) pair is scored
        once, so the attention term is vanilla's.) These are the FLOPs of DAR's definition, which the report's Cost
        column and MFU count; :meth:`global_kv` evaluates the same products with ``dar_up`` folded into the key/value
        weights, a (2 H_kv d_h x d_down) product a token in place of this term and ``dar_up``'s share of ``6 N``,
        so DAR's MFU counts more FLOPs than its step does (tokens/s compares the variants)."""
        return 3.0 * 2.0 * (2 * self.num_kv_heads * self.head_dim) * self.hidden_size

    def far_key_width(self) -> int:
        """Numbers per token of the far keys' cached dims (``dar_inference_cache: keys``): ``H_kv`` x the rotary
        dims, or x ``d_h`` when the family normalises keys; 0 for ``latent``."""
        if self.cache_mode != "keys":
            return 0
        return self.num_kv_heads * (self.head_dim if self.qk_norm != "none" else self.rotary_ndims)

    def kv_cache_per_token(self, context: int) -> float:
        """DAR paper Sec. 5: every token keeps ``dar_down(h)`` (``d_down`` numbers) and (``keys``) its far key's
        rotated dims, the last ``w`` also ``k_loc, v_loc`` (``2 H_kv d_h``); the rest of ``k_glob`` and all of
        ``v_glob`` are absorbed into the query and output sides."""
        return (self.d_down + self.far_key_width()
                + 2.0 * self.num_kv_heads * self.head_dim * min(self.window, context) / context)

    def cache_notes(self, context: int) -> list[str]:
        kv = 2 * self.num_kv_heads * self.head_dim
        local = f" + {kv} (k_loc, v_loc) for the last {min(self.window, context)}" if self.window else ""
        keys = f" + {self.far_key_width()} (far keys' rotated dims)" if self.far_key_width() else ""
        return [f"per layer: d_down={self.d_down}{keys} numbers for every token{local}"]


class UniformAttention(DARAttention):
    """The uniform baseline (``attention_type: uniform``): DAR with ``w = 0``, every key through the bottleneck."""

    spec = UniformSpec
