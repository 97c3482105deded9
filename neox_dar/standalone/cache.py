"""Where the tokens of a batch are in the inference caches, the ring buffers that hold per-column tensors, and the
key/value cache of softmax attention (:class:`WindowedKV`), read by grouped-query attention without repeating keys.
Plain PyTorch (the package's rule, :mod:`neox_dar.standalone`); each layer type's own cache is in its module.

**Layout.** The rows of a batch share one :class:`Layout`: row ``b`` holds its tokens in cache *columns*
``start[b] .. length - 1`` (prompts aligned to the right, i.e. left padding), column ``c`` being position
``c - start[b]``; every step appends the same number ``T`` of columns (tokens) to every row. A column left of
``start[b]`` is never read by a real query, so a row's results do not depend on the other rows. Windows are
distances between columns, which are distances between positions. The project's window convention: key ``j`` is
inside the window ``w`` of query ``i`` when ``0 <= i - j < w``.

**The key/value cache** (:class:`WindowedKV`: vanilla, SWA, MSWA, and with every column AHA and DimPO): keys and
values of each key/value head for the largest window among its query heads, in a ring of that many slots (column
``c`` in slot ``c % slots``); a head that sees every earlier key keeps all ``C`` columns: ``sum over key/value heads
of 2 d_h min(w, C)`` numbers per row at a context of ``C`` columns (``H_kv`` key/value heads of ``d_h`` dims).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

NO_WINDOW = torch.iinfo(torch.long).max  # the window of a head that sees every earlier key
READ_BLOCK = 256  # a ring not yet full is read in whole blocks of this many slots (RingBuffer.read)


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
        """The slots holding columns ``< upto`` (views, no copy), and the column each holds, (S,) long. A ring not
        yet full also gives the empty slots after them up to the next multiple of :data:`READ_BLOCK` (zeros, columns
        later than every query, which causality masks): the attention's key count then changes every
        ``READ_BLOCK`` steps, not at every step, so kernels that are planned per shape (cuDNN's attention) are not
        planned again at every generated token."""
        if upto <= self.slots:
            width = min(self.slots, -(-upto // READ_BLOCK) * READ_BLOCK)
            return {k: t[:, :, :width] for k, t in self.data.items()}, self.layout.columns(0, width)
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
    if n <= ring.slots:  # a ring not yet full: its first n slots are columns 0 .. n-1, the padding after them would
        # carry the new columns' numbers (and be read as keys): drop it
        old, columns = {k: t[:, :, :n] for k, t in old.items()}, columns[:n]
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


def group_rows(mask: torch.Tensor, H: int, Hk: int) -> torch.Tensor:
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
                                         attn_mask=group_rows(allowed, H, Hk), scale=scale)
    return out.view(B, H, T, v.shape[-1])


def _pick(x: torch.Tensor, heads: torch.Tensor | None) -> torch.Tensor:
    return x if heads is None else x.index_select(1, heads)


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


@dataclass
class ModelCache:
    """The inference caches of one batch: where each row's tokens are (``layout``) and each layer's cache (the
    class its attention variant chooses)."""

    layout: Layout
    layers: list
    is_compileable, is_linear, is_croppable = False, (False,), False  # what generate() asks of caches given back

    def nbytes(self) -> int:
        """Bytes the caches hold for the whole batch (the per-sequence state, not the layers' weights)."""
        return sum(c.nbytes() for c in self.layers)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Columns every row holds (transformers' name for it)."""
        return self.layout.length
