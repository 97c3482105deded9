"""Incremental decoding in plain PyTorch: rotary tables, the inference cache of every attention variant and the
attention that reads it. The attention modules of ``neox_dar.attention`` decode through this file, and
``convert to-hf`` ships it verbatim with variant models, so it imports nothing from ``neox_dar``.

**Layout.** The rows of a batch share one :class:`Layout`: row ``b`` holds its tokens in cache *columns*
``start[b] .. length - 1`` (prompts aligned to the right, i.e. left padding), column ``c`` being position
``c - start[b]``; every step appends the same number ``T`` of columns (tokens) to every row. A column left of
``start[b]`` is never read by a real query, so a row's results do not depend on the other rows. Windows are
distances between columns, which are distances between positions. The project's window convention: key ``j`` is
inside the window ``w`` of query ``i`` when ``0 <= i - j < w``.

**Caches** (numbers kept per row at a context of ``C`` columns; ``H_kv`` key/value heads of ``d_h`` dims):

* :class:`WindowedKV` (vanilla, SWA, MSWA): keys and values of each key/value head for the largest window among
  its query heads, in a ring of that many slots (column ``c`` in slot ``c % slots``); a head that sees every earlier
  key keeps all ``C`` columns: ``sum over key/value heads of 2 d_h min(w, C)``.
* AHA: a :class:`WindowedKV` of every column (a later token may route any head to full attention), read by
  :func:`aha_attention`: the last ``w`` columns for every head, the whole cache only for the (row, key/value head)
  pairs with an open gate.
* :class:`DARCache` (DAR; uniform is DAR with ``w = 0``): ``k_loc, v_loc`` of the last ``w`` columns,
  ``c = dar_down(h)`` of every column and (``dar_inference_cache: keys``, the default) each far key's rotated dims
  (``H_kv r``; ``H_kv d_h`` under a key norm): ``2 H_kv d_h min(w, C) + (d_down + H_kv r) C``. A far key's other
  dims and its value are absorbed into the query and output sides (see :class:`DARCache`).
* :class:`LinearState` (linear attention): the running sums ``S``, ``z`` in float32, ``H_kv (1 + d_f + d_f^2)(d_h + 1)``
  numbers whatever the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

NO_WINDOW = torch.iinfo(torch.long).max  # the window of a head that sees every earlier key


# ----------------------------------------------------------------------------------------------
# rotary (GPT-NeoX "rotate half" on the first rotary_ndims dims; Llama-3 frequency scaling)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX "rotate half": ``[x1, x2] -> [-x2, x1]`` over the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of ``x`` (B, H, T, d_h); ``cos``/``sin`` broadcast against
    ``x[..., :r]``: (T, r) for one set of positions, (B, 1, T, r) for positions per row."""
    r = cos.shape[-1]
    if r == 0:
        return x
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)


def llama3_inv_freq(inv_freq: torch.Tensor, scaling) -> torch.Tensor:
    """Llama-3's rotary scaling (Hugging Face ``rope_type: llama3``): wavelengths longer than
    ``original_max_position_embeddings / low_freq_factor`` are divided by ``factor``, those shorter than
    ``... / high_freq_factor`` kept, and the ones between interpolated smoothly. ``scaling``: anything with the
    attributes ``factor``, ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``."""
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = ((scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotary_table(rotary_ndims: int, base: float, scaling, seq_len: int, dtype: torch.dtype,
                 device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each (seq_len, rotary_ndims), for positions 0..seq_len-1, computed in float32 as Hugging Face
    does (``scaling``: Llama-3's, or None)."""
    r = rotary_ndims
    inv_freq = 1.0 / (base ** (torch.arange(0, r, 2, dtype=torch.float, device=device) / r))
    if scaling is not None:
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    freqs = torch.arange(seq_len, device=device, dtype=torch.float)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def taylor_features(x: torch.Tensor) -> torch.Tensor:
    """Based's 2nd-order Taylor map ``phi(x)`` over the last dim: (..., d_f) -> (..., 1 + d_f + d_f^2), so that
    ``phi(q) . phi(k) = 1 + s + s^2 / 2`` with ``s = q . k / sqrt(d_f)``."""
    d_f = x.shape[-1]
    outer = (x[..., :, None] * x[..., None, :]).flatten(-2)
    return torch.cat([torch.ones_like(x[..., :1]), x / d_f ** 0.25, outer / math.sqrt(2 * d_f)], dim=-1)


# ----------------------------------------------------------------------------------------------
# the attention projections of the model families


class HeadProjections:
    """Query/key/value and output projections of the model families, mixed into a ``torch.nn.Module``: GPT-NeoX's
    fused ``query_key_value`` (each head's rows ``[q, k, v]``) and ``dense``, or ``q_proj``, ``k_proj``, ``v_proj``,
    ``o_proj``; the optional query/key RMSNorms before rotary (over the whole projection: OLMo-2; per head: Qwen3);
    grouped-query attention (``H_kv`` key/value heads). neox_dar's attention modules and the exported model both
    use it, so they name and compute their projections alike."""

    def build_projections(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, fused: bool,
                          qkv_bias: bool, out_bias: bool, qk_norm: str, rms_norm: Callable[[int], torch.nn.Module]):
        """Create the projection modules; ``rms_norm(width)`` makes the family's query/key norm."""
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


def feature_rotary(cos: torch.Tensor, sin: torch.Tensor, d_f: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's rotary tables (T, r) cut to the features: the ``min(r, d_f)`` (even) dims that hold the highest
    frequencies, so rotate-half on ``d_f`` features pairs each dim with the one of the same frequency."""
    r = cos.shape[-1]
    half = min(r, d_f - d_f % 2) // 2
    if 2 * half == r:
        return cos, sin
    idx = torch.cat([torch.arange(half), r // 2 + torch.arange(half)]).to(cos.device)
    return cos[..., idx], sin[..., idx]


# ----------------------------------------------------------------------------------------------
# where the tokens are


class Layout:
    """The columns of one batch in every layer's cache (module docstring).

    ``starts``: each row's first column (its count of padding columns); ``capacity``: the columns the caches hold
    (None: caches that keep every column grow as needed); ``rotary(n)``: the model's ``(cos, sin)`` tables for
    positions ``0..n-1``, each (n, r). ``length`` is the number of columns every row has; the model calls
    :meth:`advance` after each step, once all layers have written it."""

    def __init__(self, starts: Sequence[int], capacity: int | None,
                 rotary: Callable[[int], tuple[torch.Tensor, torch.Tensor]], device: torch.device | str):
        self.starts = [int(s) for s in starts]
        self.start = torch.tensor(self.starts, dtype=torch.long, device=device)
        self.padded = any(self.starts)
        self.length = 0
        self.capacity = capacity
        self.device = device
        self._rotary = rotary
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        return len(self.starts)

    def columns(self, first: int, count: int) -> torch.Tensor:
        """Columns ``first .. first + count - 1``, (count,) long."""
        return torch.arange(first, first + count, device=self.device)

    def valid(self, first: int, count: int) -> torch.Tensor | None:
        """(B, count) bool: which of the columns ``first ..`` hold real tokens (None: all, nothing is padded)."""
        return self.columns(first, count)[None] >= self.start[:, None] if self.padded else None

    def key_ok(self, qcols: torch.Tensor, kcols: torch.Tensor) -> torch.Tensor | None:
        """(B, T, S) bool: the keys ``kcols`` that the queries ``qcols`` may read besides the window rule: real
        columns, and each query's own column (a padding query attends to itself, so every value stays finite).
        None when nothing is padded."""
        if not self.padded:
            return None
        return (kcols[None, None, :] >= self.start[:, None, None]) | (qcols[:, None] == kcols[None, :])[None]

    def rotary(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of the columns ``first .. first + count - 1`` of every row, each (B, count, r), or
        (1, count, r) when no row is padded (positions = columns). The model's tables are computed once per
        needed length (doubling when the capacity is open)."""
        end = first + count
        if self._cos is None or self._cos.shape[0] < end:
            have = 0 if self._cos is None else self._cos.shape[0]
            self._cos, self._sin = self._rotary(max(end, self.capacity or 0, 2 * have))
        if not self.padded:
            return self._cos[first:end][None], self._sin[first:end][None]
        positions = (self.columns(first, count)[None] - self.start[:, None]).clamp(min=0)  # padding: any row
        return self._cos[positions], self._sin[positions]

    def advance(self, count: int) -> None:
        self.length += count


class RingBuffer:
    """Per-column tensors of one layer, ``name -> (B, heads, slots, dim)``; column ``c`` lives in slot
    ``c % slots``. ``window`` None keeps every column (``slots`` = the layout's capacity, growing by doubling when it
    has none); otherwise the last ``min(window, capacity)`` columns."""

    def __init__(self, layout: Layout, shapes: dict[str, tuple[int, int]], window: int | None,
                 device: torch.device | str, dtype: torch.dtype):
        self.layout = layout
        cap = layout.capacity
        self.wraps = window is not None and (cap is None or window < cap)  # column c may sit in another slot
        slots = window if self.wraps else (cap if cap is not None else 64)
        self.data = {name: torch.zeros(layout.batch, h, slots, d, device=device, dtype=dtype)
                     for name, (h, d) in shapes.items()}

    @property
    def slots(self) -> int:
        return next(iter(self.data.values())).shape[2]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.data.values())

    def write(self, values: dict[str, torch.Tensor], first: int, rows: torch.Tensor | None = None) -> None:
        """Store ``values`` (name -> (n, heads, T, dim)) as the columns ``first .. first + T - 1`` of ``rows`` (a
        (n,) long tensor; default every row); a ring keeps the last of them."""
        T = next(iter(values.values())).shape[2]
        if not self.wraps and first + T > self.slots:
            self.data = {k: torch.cat([t, t.new_zeros(*t.shape[:2], max(first + T, 2 * self.slots) - self.slots,
                                                      t.shape[3])], 2) for k, t in self.data.items()}
        keep = min(T, self.slots)
        s0 = (first + T - keep) % self.slots
        slots = slice(s0, s0 + keep) if s0 + keep <= self.slots else self.layout.columns(s0, keep) % self.slots
        for name, x in values.items():
            x = x[:, :, T - keep:].to(self.data[name].dtype)
            if rows is None:
                self.data[name][:, :, slots] = x
            elif isinstance(slots, slice):
                self.data[name][rows, :, slots] = x
            else:  # two index tensors around a slice: the indexed dims come first
                self.data[name][rows[:, None], :, slots[None]] = x.transpose(1, 2)

    def read(self, upto: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The slots holding columns ``< upto`` (views, no copy), and the column each holds, (S,) long."""
        if upto <= self.slots:
            return {k: t[:, :, :upto] for k, t in self.data.items()}, self.layout.columns(0, upto)
        s = self.layout.columns(0, self.slots)
        return dict(self.data), (upto - 1) - ((upto - 1 - s) % self.slots)


def step_keys(ring: RingBuffer, new: dict[str, torch.Tensor], reach: int | None):
    """Write the ``T`` new columns (``new``: name -> (B, heads, T, dim)) into ``ring`` and return ``(tensors,
    columns)`` holding every column that one of their queries may read (``reach``: the largest window, None: all).
    When a ring is too small to keep the columns the first new query needs while holding the new ones (a prompt
    longer than the window), the new columns are appended to a copy of the old ones instead."""
    layout = ring.layout
    n, T = layout.length, next(iter(new.values())).shape[2]
    if not ring.wraps or T + reach - 1 <= ring.slots:
        ring.write(new, n)
        return ring.read(n + T)
    old, columns = ring.read(n)
    keys = {k: torch.cat([old[k], new[k].to(old[k].dtype)], 2) for k in new}
    ring.write(new, n)
    return keys, torch.cat([columns, layout.columns(n, T)])


def window_allowed(layout: Layout, qcols: torch.Tensor, kcols: torch.Tensor,
                   windows: torch.Tensor) -> torch.Tensor:
    """(B or 1, H or 1, T, S) bool: query column ``qcols[t]`` may read key column ``kcols[s]`` when
    ``0 <= qcol - kcol < window`` (``windows``: (H,) per query head, or (1,) for all) and the key is real."""
    dist = qcols[:, None] - kcols[None, :]
    inside = ((dist >= 0)[None] & (dist[None] < windows[:, None, None]))[None]
    ok = layout.key_ok(qcols, kcols)
    return inside if ok is None else inside & ok[:, None]


def _group_rows(mask: torch.Tensor, H: int, Hk: int) -> torch.Tensor:
    """A (b, H or 1, T, S) mask as (b, H_kv or 1, G T, S), the rows of the grouped queries (query head h = g G + i)."""
    b, h, T, S = mask.shape
    G = H // Hk
    if h == 1:
        return mask.expand(b, G, T, S).reshape(b, 1, G * T, S)
    return mask.reshape(b, Hk, G * T, S)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """Softmax attention of ``q`` (B, H, T, d) over ``k`` (B, H_kv, S, d), ``v`` (B, H_kv, S, d_v), query head ``h``
    reading key/value head ``h // (H / H_kv)`` without repeating the keys; ``allowed`` (B or 1, H or 1, T, S) bool
    (every row allows at least one key). -> (B, H, T, d_v)."""
    B, H, T, D = q.shape
    Hk = k.shape[1]
    out = F.scaled_dot_product_attention(q.reshape(B, Hk, (H // Hk) * T, D), k, v,
                                         attn_mask=_group_rows(allowed, H, Hk), scale=scale)
    return out.view(B, H, T, v.shape[-1])


def _pick(x: torch.Tensor, heads: torch.Tensor | None) -> torch.Tensor:
    return x if heads is None else x.index_select(1, heads)


# ----------------------------------------------------------------------------------------------
# the rest of a decoder layer


class GeluMLP(torch.nn.Module):
    """``dense_4h_to_h(gelu(dense_h_to_4h(m)))`` with exact (erf) GeLU (GPT-NeoX); (B, T, d) -> (B, T, d). ``cfg``:
    anything with ``hidden_size``, ``intermediate_size``, ``mlp_bias``."""

    def __init__(self, cfg):
        super().__init__()
        self.dense_h_to_4h = torch.nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.dense_4h_to_h = torch.nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(m)))


class SwiGLU(torch.nn.Module):
    """``down_proj(silu(gate_proj(m)) * up_proj(m))`` (Llama, OLMo-2, Qwen); (B, T, d) -> (B, T, d)."""

    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = torch.nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = torch.nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = torch.nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))


def residual_block(x: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor], mlp: torch.nn.Module,
                   norm1: torch.nn.Module, norm2: torch.nn.Module, post_norm: bool, parallel: bool,
                   dropout: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> torch.Tensor:
    """One decoder layer around ``attend`` (attention input (B, T, d) -> output):

    * pre-norm, parallel (GPT-NeoX): ``x + Attn(N1(x)) + MLP(N2(x))``
    * pre-norm, sequential (Llama, Qwen): ``y = x + Attn(N1(x)); y + MLP(N2(y))``
    * post-norm (OLMo-2): ``y = x + N1(Attn(x)); y + N2(MLP(y))``"""
    if post_norm:
        y = x + dropout(norm1(attend(x)))
        return y + dropout(norm2(mlp(y)))
    attn = dropout(attend(norm1(x)))
    if parallel:
        return x + attn + dropout(mlp(norm2(x)))
    y = x + attn
    return y + dropout(mlp(norm2(y)))


@dataclass
class ModelCache:
    """The inference caches of one batch: where each row's tokens are (``layout``) and each layer's cache (the
    class its attention variant chooses)."""

    layout: Layout
    layers: list

    def nbytes(self) -> int:
        """Bytes the caches hold for the whole batch (the per-sequence state, not the layers' weights)."""
        return sum(c.nbytes() for c in self.layers)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Columns every row holds (transformers' name for it)."""
        return self.layout.length


# ----------------------------------------------------------------------------------------------
# softmax attention over windows (vanilla, SWA, MSWA) and AHA


@dataclass
class _HeadGroup:
    kv_heads: Optional[torch.Tensor]  # the key/value heads of the group (None: all)
    q_heads: Optional[torch.Tensor]   # their query heads (None: all)
    windows: torch.Tensor             # (len(q_heads),) or (1,): each query head's window
    window: Optional[int]             # the ring's window (the largest of the query heads'), None: all columns
    ring: RingBuffer


class WindowedKV:
    """The cache of softmax attention in which query head ``h`` reads the keys of its window ``windows[h]`` (None:
    every earlier key). A key/value head keeps the largest window of its query heads (a shared head must serve its
    widest reader); key/value heads with the same window share one :class:`RingBuffer`. ``key_dim`` may differ
    from ``value_dim`` (keys cached at a reduced width)."""

    def __init__(self, layout: Layout, windows: Sequence[int | None], num_kv_heads: int, key_dim: int,
                 value_dim: int, device: torch.device | str, dtype: torch.dtype):
        H, Hk = len(windows), num_kv_heads
        G = H // Hk
        kv_window = [None if None in windows[g * G:(g + 1) * G] else max(windows[g * G:(g + 1) * G])
                     for g in range(Hk)]
        self.groups: list[_HeadGroup] = []
        for w in dict.fromkeys(kv_window):
            kv = [g for g in range(Hk) if kv_window[g] == w]
            q = [h for g in kv for h in range(g * G, (g + 1) * G)]
            qw = [NO_WINDOW if windows[h] is None else windows[h] for h in q]
            every = len(kv) == Hk
            self.groups.append(_HeadGroup(
                None if every else torch.tensor(kv, device=device), None if every else torch.tensor(q, device=device),
                torch.tensor(qw[:1] if len(set(qw)) == 1 else qw, device=device), w,
                RingBuffer(layout, {"k": (len(kv), key_dim), "v": (len(kv), value_dim)}, w, device, dtype)))
        self.layout = layout

    def nbytes(self) -> int:
        return sum(g.ring.nbytes() for g in self.groups)

    def write(self, k: torch.Tensor, v: torch.Tensor, first: int, rows: torch.Tensor | None = None) -> None:
        """Store a prompt's rotated keys and values, (n, H_kv, T, d), as columns ``first ..`` of ``rows``."""
        for g in self.groups:
            g.ring.write({"k": _pick(k, g.kv_heads), "v": _pick(v, g.kv_heads)}, first, rows)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """The ``T`` new columns: their rotated ``q`` (B, H, T, d) and ``k``, ``v`` (B, H_kv, T, d) -> (B, H, T, d_v)
        (stores ``k``, ``v``)."""
        n, T = self.layout.length, q.shape[2]
        qcols = self.layout.columns(n, T)
        out = None
        for g in self.groups:
            keys, kcols = step_keys(g.ring, {"k": _pick(k, g.kv_heads), "v": _pick(v, g.kv_heads)}, g.window)
            o = grouped_attention(_pick(q, g.q_heads), keys["k"], keys["v"],
                                  window_allowed(self.layout, qcols, kcols, g.windows), scale)
            if g.q_heads is None:
                return o
            out = q.new_empty(*q.shape[:3], o.shape[-1]) if out is None else out
            out[:, g.q_heads] = o
        return out


def aha_attention(q: torch.Tensor, kv: WindowedKV, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor,
                  window: int, scale: float) -> torch.Tensor:
    """AHA over the cache ``kv`` of every column: query head ``h`` of new token ``t`` attends to every earlier key
    when ``gate[b, h, t]`` else to its last ``window`` keys. The local path reads the last ``window`` columns for
    all heads; the full path reads the whole cache only for the (row, key/value head) pairs with an open gate.
    q (B, H, T, d), k, v (B, H_kv, T, d) rotated, gate (B, H, T) bool -> (B, H, T, d)."""
    (group,) = kv.groups
    layout = kv.layout
    n, T = layout.length, q.shape[2]
    keys, kcols = step_keys(group.ring, {"k": k, "v": v}, None)  # every column, slot = column
    qcols = layout.columns(n, T)
    lo = max(0, n - window + 1)
    local = grouped_attention(q, keys["k"][:, :, lo:], keys["v"][:, :, lo:],
                              window_allowed(layout, qcols, kcols[lo:], qcols.new_tensor([window])), scale)
    B, H, _, D = q.shape
    Hk = k.shape[1]
    b, g = gate.reshape(B, Hk, -1).any(-1).nonzero(as_tuple=True)  # pairs whose full cache is read
    if b.numel() == 0:
        return local
    allowed = window_allowed(layout, qcols, kcols, qcols.new_tensor([NO_WINDOW]))
    full = torch.zeros_like(local)
    full.view(B, Hk, H // Hk, T, D)[b, g] = grouped_attention(
        q.view(B, Hk, H // Hk, T, D)[b, g], keys["k"][b, g][:, None], keys["v"][b, g][:, None],
        allowed[b] if allowed.shape[0] > 1 else allowed, scale)
    return torch.where(gate[..., None], full, local)


# ----------------------------------------------------------------------------------------------
# DAR


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

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor, scale: float) -> torch.Tensor:
        """The ``T`` new columns: rotated ``q`` (B, H, T, d_h), their rotated ``k_loc``, ``v_loc`` (B, H_kv, T, d_h)
        and ``c`` (B, T, d_down) -> (B, H, T, d_h) (stores them). Near and far scores share one softmax (float32)."""
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
            scores.append((qg @ keys["k"].transpose(-1, -2)).float().masked_fill(~_group_rows(allowed, H, Hk),
                                                                                 float("-inf")))
        self.far.write(self._far(c, n, None), n)
        far = n + T - self.window  # columns beyond the window of the last new query
        cached = {name: t[:, :, :far] for name, t in self.far.data.items()} if far > 0 else None
        cf = cached["c"][:, 0] if cached is not None else None
        if cached is not None:
            kcols = layout.columns(0, far)
            dist = qcols[:, None] - kcols[None, :]
            allowed = (dist >= self.window)[None, None]
            ok = layout.key_ok(qcols, kcols)
            allowed = allowed if ok is None else allowed & ok[:, None]
            scores.append(self.far_scores(qg, cached).float().masked_fill(~_group_rows(allowed, H, Hk),
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


# ----------------------------------------------------------------------------------------------
# linear attention (Based's Taylor map, MSWA paper Eq. 6-7)


def linear_attention_step(pq: torch.Tensor, pk: torch.Tensor, v: torch.Tensor,
                          state: tuple[torch.Tensor, torch.Tensor] | None = None,
                          valid: torch.Tensor | None = None):
    """Causal linear attention of ``T`` new tokens after the tokens summed in ``state``:
    ``o_t = phi(q_t) (S + sum_{s<=t} phi(k_s)^T v_s) / phi(q_t) . (z + sum_{s<=t} phi(k_s))``.

    ``pq`` (B, H, T, D), ``pk`` (B, H_kv, T, D) the features, ``v`` (B, H_kv, T, d_v), all float32; ``state`` ``(S
    (B, H_kv, D, d_v), z (B, H_kv, D))`` or None (no earlier token); ``valid`` (B, T): the tokens that count
    (padding: False; their outputs are 0). -> ``(out (B, H, T, d_v), (S, z))`` with the new tokens added."""
    if valid is not None:
        pk = pk * valid[:, None, :, None]
    B, H, T, D = pq.shape
    Hk = pk.shape[1]
    S, z = state if state is not None else (pk.new_zeros(B, Hk, D, v.shape[-1]), pk.new_zeros(B, Hk, D))
    qg = pq.reshape(B, Hk, (H // Hk) * T, D)
    inside = (qg @ pk.transpose(-1, -2)).view(B, Hk, H // Hk, T, T).tril().view(B, Hk, -1, T)  # s <= t
    num = qg @ S + inside @ v
    den = (qg @ z[..., None]) + inside.sum(-1, keepdim=True)
    out = (num / den).view(B, H, T, -1)
    if valid is not None:
        out = torch.where(valid[:, None, :, None], out, 0.0)
    return out, (S + pk.transpose(-1, -2) @ v, z + pk.sum(2))


class LinearState:
    """Linear attention's cache: ``state = (S (B, H_kv, D, d_h), z (B, H_kv, D))``, float32, ``D = 1 + d_f +
    d_f^2``, the same size whatever the context."""

    def __init__(self, layout: Layout, num_kv_heads: int, features: int, value_dim: int, device: torch.device | str):
        B = layout.batch
        self.layout = layout
        self.state = (torch.zeros(B, num_kv_heads, features, value_dim, device=device),
                      torch.zeros(B, num_kv_heads, features, device=device))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state)

    def write(self, pk: torch.Tensor, v: torch.Tensor, rows: torch.Tensor) -> None:
        """Add a prompt's features ``pk`` (n, H_kv, T, D) and values ``v`` (n, H_kv, T, d_h) to ``rows``' sums."""
        S, z = self.state
        S[rows] += pk.transpose(-1, -2) @ v.float()
        z[rows] += pk.sum(2)
