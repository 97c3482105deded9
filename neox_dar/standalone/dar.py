"""Distance-adaptive representation (DAR) at inference: layer type ``dar`` (uniform: window 0). The cache
(:class:`DARCache`) keeps ``k_loc, v_loc`` of the last ``w`` columns, ``c = dar_down(h)`` of every column and
(``cache: keys``, the default) each far key's rotated dims (``H_kv r``; ``H_kv d_h`` under a key norm):
``2 H_kv d_h min(w, C) + (d_down + H_kv r) C`` numbers per row at a context of ``C`` columns. A far key's other dims
and its value are absorbed into the query and output sides. Plain PyTorch (the package's rule,
:mod:`neox_dar.standalone`)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .attention import AttentionLayer
from .cache import Layout, RingBuffer, group_rows, step_keys, window_allowed
from .rotary import apply_rotary


class DARCache:
    """DAR's cache (paper Sec. 5): ``k_loc, v_loc`` (rotated, ``H_kv`` heads) of the last ``window`` columns and
    ``c = dar_down(h)`` (``d_down`` numbers) of every column, plus (``far_keys``) the dims of each far key that
    cannot be absorbed, computed once when the column is written.

    A far key (distance ``>= window``) is ``k_glob = norm(W_k W_up c + b_k)`` rotated at its position, its value
    ``v_glob = W_v W_up c + b_v``. The products ``A_k = W_k W_up`` and ``A_v = W_v W_up`` (each ``H_kv d_h x d_down``)
    are formed once per cache from the layer's weights (``w_k``, ``w_v``: (H_kv d_h, d); ``w_up``: (d, d_down)).
    Values are absorbed into the output side: ``sum_j p_j v_glob_j = A_v (sum_j p_j c_j) + b_v sum_j p_j``.
    Keys: rotary turns each key by its own position, so no fixed matrix carries the first ``r`` (rotated) dims into
    the query; the other ``d_h - r`` dims are absorbed into it:
    ``q_pass . (A_pass c + b_pass) = (A_pass^T q_pass) . c + q_pass . b_pass``. The rotated dims (all ``d_h`` dims
    when the family normalises keys, ``key_norm``: the norm divides by the root mean square of the whole key) are
    ``H_kv r`` numbers per column: with ``far_keys`` (``dar_inference_cache: keys``) they are cached beside ``c``,
    rotated, so a step reads ``d_down + H_kv r`` numbers per far column and does vanilla's arithmetic; without
    (``latent``) only ``c`` is kept (the paper's ``d_down`` per token) and a step rebuilds them for every far column
    (``H_kv r d_down`` multiply-adds per column)."""

    def __init__(self, layout: Layout, window: int, d_down: int, num_kv_heads: int, head_dim: int,
                 rotary_ndims: int, w_k: torch.Tensor, b_k: torch.Tensor | None, w_v: torch.Tensor,
                 b_v: torch.Tensor | None, w_up: torch.Tensor, key_norm: Callable[[torch.Tensor], torch.Tensor] | None,
                 device: torch.device | str, dtype: torch.dtype, far_keys: bool = True):
        Hk, D, r = num_kv_heads, head_dim, rotary_ndims
        self.layout, self.window, self.rotary_ndims, self.key_norm = layout, window, r, key_norm
        self.width = width = D if key_norm is not None else r  # the dims of a far key not absorbed into the query
        self.near = RingBuffer(layout, {"k": (Hk, D), "v": (Hk, D)}, window, device, dtype) if window else None
        self.far = RingBuffer(layout, {"c": (1, d_down), **({"k": (Hk, width)} if far_keys and width else {})},
                              None, device, dtype)
        with torch.no_grad():
            up = w_up.float()
            a_k, a_v = (w_k.float() @ up).to(device, dtype), (w_v.float() @ up).to(device, dtype)  # (Hk D, d_down)
            b_k = None if b_k is None else b_k.to(device, dtype).view(Hk, D)
        self.a_v = a_v.view(Hk, D, d_down).transpose(1, 2).contiguous()  # (Hk, d_down, D)
        self.b_v = None if b_v is None else b_v.to(device, dtype).view(Hk, 1, D)
        a_k = a_k.view(Hk, D, d_down)
        self.k_w = a_k[:, :width].reshape(Hk * width, d_down).T.contiguous()       # (d_down, Hk width)
        self.k_b = None if b_k is None else b_k[:, :width].contiguous()            # (Hk, width)
        self.q_w = a_k[:, width:].contiguous()                                     # (Hk, D - width, d_down)
        self.q_b = None if b_k is None else b_k[:, width:, None].contiguous()      # (Hk, D - width, 1)

    def nbytes(self) -> int:
        """Bytes of the rings (per-sequence state); the absorbed matrices ``a_v``, ``k_w``, ``q_w`` (formed from the
        layer's weights once per cache, shared by every row) are left out, as the weights are."""
        return self.far.nbytes() + (self.near.nbytes() if self.near is not None else 0)

    def far_keys(self, c: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The not-absorbed dims of the far keys of ``c`` (b, T, d_down) at the positions of ``cos``, ``sin``
        (b or 1, T, r): normalised (``key_norm``) and rotated -> (b, H_kv, T, width)."""
        b, T = c.shape[:2]
        k = (c @ self.k_w).view(b, T, -1, self.width)  # (b, T, H_kv, width)
        if self.k_b is not None:
            k = k + self.k_b
        if self.key_norm is not None:
            k = self.key_norm(k)
        return apply_rotary(k.transpose(1, 2), cos[:, None], sin[:, None])

    def _far(self, c: torch.Tensor, first: int, rows: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """What the far ring keeps of the columns ``first ..`` of ``rows`` whose ``c`` (b, T, d_down) is given."""
        out = {"c": c[:, None]}
        if "k" in self.far.data:
            cos, sin = self.layout.rotary(first, c.shape[1])
            if cos.shape[0] > 1 and rows is not None:
                cos, sin = cos[rows], sin[rows]
            out["k"] = self.far_keys(c, cos, sin)
        return out

    def write(self, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor, first: int,
              rows: torch.Tensor | None = None) -> None:
        """Store a prompt's rotated ``k_loc``, ``v_loc`` (n, H_kv, T, d_h) and ``c`` (n, T, d_down) as columns
        ``first ..`` of ``rows``."""
        if self.near is not None:
            self.near.write({"k": k, "v": v}, first, rows)
        self.far.write(self._far(c, first, rows), first, rows)

    def far_scores(self, qg: torch.Tensor, far: dict[str, torch.Tensor]) -> torch.Tensor:
        """``q . k_glob`` (unscaled) of the grouped queries ``qg`` (B, H_kv, R, d_h) against the columns
        ``0 .. F-1`` whose cached ``far`` tensors are given (``c``: (B, 1, F, d_down); ``k``: (B, H_kv, F, width)
        when cached) -> (B, H_kv, R, F)."""
        c = far["c"][:, 0]
        B, Hk, R, D = qg.shape
        width = self.width
        k = far.get("k")
        if k is None and width:  # latent: rebuild the rotated dims of every far column
            k = self.far_keys(c, *self.layout.rotary(0, c.shape[1]))
        scores = qg[..., :width] @ k.transpose(-1, -2) if width else 0
        if width < D:
            q_pass = qg[..., width:]
            qc = (q_pass @ self.q_w).reshape(B, Hk * R, -1)  # (B, H_kv R, d_down): one batched product with c
            scores = scores + torch.bmm(qc, c.transpose(1, 2)).view(B, Hk, R, -1)
            if self.q_b is not None:
                scores = scores + q_pass @ self.q_b
        return scores

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor, scale: float,
               kernel: Callable | None = None) -> torch.Tensor:
        """The ``T`` new columns: rotated ``q`` (B, H, T, d_h), their rotated ``k_loc``, ``v_loc`` (B, H_kv, T, d_h)
        and ``c`` (B, T, d_down) -> (B, H, T, d_h) (stores them). Near and far scores share one softmax (float32).
        ``kernel``: a function with the signature of neox-dar's ``kernels.dar_decode_attention``, which computes the
        step once there are far columns (:meth:`attend_kernel`); None: every score materialised here."""
        layout = self.layout
        n, T = layout.length, q.shape[2]
        B, H, _, D = q.shape
        Hk = self.a_v.shape[0]
        qg = q.reshape(B, Hk, (H // Hk) * T, D)
        qcols = layout.columns(n, T)
        scores, near_v = [], None
        if self.near is not None:
            keys, kcols = step_keys(self.near, {"k": k, "v": v}, self.window)
            allowed = window_allowed(layout, qcols, kcols, qcols.new_tensor([self.window]))
            near_v = keys["v"]
            scores.append((qg @ keys["k"].transpose(-1, -2)).float().masked_fill(~group_rows(allowed, H, Hk),
                                                                                float("-inf")))
        self.far.write(self._far(c, n, None), n)
        far = n + T - self.window  # columns beyond the window of the last new query
        cached = {name: t[:, :, :far] for name, t in self.far.data.items()} if far > 0 else None
        if kernel is not None and cached is not None:
            return self.attend_kernel(kernel, qg, qcols, scores[0] if scores else None, near_v, cached, scale)
        cf = cached["c"][:, 0] if cached is not None else None
        if cached is not None:
            kcols = layout.columns(0, far)
            dist = qcols[:, None] - kcols[None, :]
            allowed = (dist >= self.window)[None, None]
            ok = layout.key_ok(qcols, kcols)
            allowed = allowed if ok is None else allowed & ok[:, None]
            scores.append(self.far_scores(qg, cached).float().masked_fill(~group_rows(allowed, H, Hk),
                                                                          float("-inf")))
        probs = torch.softmax(torch.cat(scores, -1) * scale, -1).to(q.dtype)
        out = 0
        if near_v is not None:
            out = probs[..., :near_v.shape[2]] @ near_v
        if cf is not None:
            p = probs[..., probs.shape[-1] - far:]
            o = torch.bmm(p.reshape(B, -1, far), cf).view(B, Hk, -1, cf.shape[-1]) @ self.a_v  # -> (B, Hk, R, D)
            out = out + (o if self.b_v is None else o + p.sum(-1, keepdim=True) * self.b_v)
        return out.reshape(B, H, T, D)

    def attend_kernel(self, kernel: Callable, qg: torch.Tensor, qcols: torch.Tensor, near: torch.Tensor | None,
                      near_v: torch.Tensor | None, cached: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
        """:meth:`attend` through ``kernel`` (neox-dar's ``kernels.dar_decode_attention``: the far columns' ``c`` and
        rotated key dims read once for all heads, merged with the window under one softmax, the value side applied)
        -> (B, H, T, d_h). ``qg`` (B, H_kv, R T, d_h): the grouped queries of the columns ``qcols``; ``near`` (B,
        H_kv, R T, w) the window's scores (unscaled, masked), ``near_v`` its values (None without a window);
        ``cached``: the far ring's tensors of the columns ``0 ..``. A query (a new column: never left of its row's
        start) reads the far columns from its row's start up to its distance ``w``."""
        layout, width, w = self.layout, self.width, self.window
        B, Hk, RT, D = qg.shape
        T = qcols.shape[0]
        R = RT // T

        def per_token(x: torch.Tensor) -> torch.Tensor:  # (B, H_kv, R T, ...) -> (B, T, H, ...)
            return x.reshape(B, Hk, R, T, *x.shape[3:]).movedim(3, 1).reshape(B, T, Hk * R, *x.shape[3:])

        c = cached["c"][:, 0]
        kr = cached.get("k")
        if kr is None and width:  # latent: rebuild the rotated dims of every far column
            kr = self.far_keys(c, *layout.rotary(0, c.shape[1]))
        q_pass = qg[..., width:]
        qc = per_token(q_pass @ self.q_w) if width < D else None
        qb = (per_token((q_pass @ self.q_b)[..., 0]) if self.q_b is not None and width < D
              else qg.new_zeros(B, T, Hk * R)).float()
        lo = layout.start[:, None].expand(B, T)
        hi = torch.maximum(qcols[None, :] - w + 1, lo)  # (B, T), exclusive
        return kernel(qc, per_token(qg[..., :width]) if width else None, qb, c, kr, lo.to(torch.int32),
                      hi.to(torch.int32), near, near_v, self.a_v, self.b_v, scale)


class DARLayer(AttentionLayer):
    """DAR's parameters beyond the projections: ``dar_down`` (d -> d_down) and ``dar_up`` (d_down -> d), no biases.
    A step scores the window's keys and the far keys (from ``c``) under one softmax (:meth:`DARCache.attend`)."""

    layer_type = "dar"

    def build_variant(self, window: int, d_down: int, cache: str) -> None:
        """``window``: the nearest keys at full width (0: uniform); ``cache``: what a far column keeps, ``keys``
        (``c`` and the far key's rotated dims) or ``latent`` (``c`` only)."""
        self.window, self.d_down, self.cache_mode = window, d_down, cache
        self.dar_down = nn.Linear(self.hidden_size, d_down, bias=False)
        self.dar_up = nn.Linear(d_down, self.hidden_size, bias=False)

    def export_spec(self) -> dict:
        return {"type": self.layer_type, "window": self.window, "d_down": self.d_down, "cache": self.cache_mode}

    def new_cache(self, layout: Layout, device: torch.device, dtype: torch.dtype) -> DARCache:
        w_k, b_k, w_v, b_v = self.key_value_weights()
        return DARCache(layout, self.window, self.d_down, self.num_kv_heads, self.head_dim, self.rotary_ndims,
                        w_k, b_k, w_v, b_v, self.dar_up.weight, self.normalize_keys if self.qk_norm != "none" else None,
                        device, dtype, far_keys=self.cache_mode == "keys")

    def decode_kernel(self, cache: DARCache, device: torch.device) -> Callable | None:
        """What computes a step with far columns (:meth:`DARCache.attend`'s ``kernel``): None here, every score
        materialised in PyTorch; neox-dar's DAR module gives the Triton kernels on its ``triton`` path."""
        return None

    def decode(self, a: torch.Tensor, cache: DARCache, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split_heads(a, cos, sin)
        return self.merge_heads(cache.attend(q, k, v, self.dar_down(a), self.head_dim ** -0.5,
                                             self.decode_kernel(cache, a.device)))
