"""Documents and per-layer instances (paper Sec. 3.3), streamed so that memory never grows with queries x keys.

Documents: the first ``T`` tokens (4096 in the paper) of documents of at least ``T`` tokens, never concatenated;
the train, validation and test documents are disjoint (several splits read from one dataset take successive
documents of it).

For one layer, each document runs through the model only up to that layer's attention: a pre-hook on the
attention module takes its rotary-embedded ``q, k, v`` with ``module.split_heads(...)`` and stops the forward,
so only one layer's vectors are ever held (and never the logits).

An instance is ``(document, head, position)``: the query at that position, its causal keys ``k[:pos + 1]`` (of
the head's key/value head under GQA) and their original weights ``softmax(q K^T / sqrt(d_h))``. Keys are held once
per document and key/value head, never copied per query, and the work runs over blocks of queries of one
(document, head): a split holds ``O(docs x T x d_h)`` numbers, a block ``O(block x T)``.

* training and validation: every ``H``-th query of every head, offset by the head's index (positions ``h, h + H,
  ...``) so that the heads together cover every position: ``T`` instances per document (the paper's 10 x 4096 =
  40,960 per layer);
* test: every query of every head.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..data import IndexedDataset
from ..progress import progress_bar

SPLITS = ("train", "valid", "test")


class DimPOError(ValueError):
    """A user mistake (bad data, a file for another model, an impossible option): one line, no traceback."""


@dataclass
class Documents:
    """One split's documents: ``tokens`` (N, T) int64, the first T tokens of sequences ``ids`` of ``source``."""

    source: str
    ids: list[int]
    tokens: torch.Tensor


def select_documents(sources: dict[str, str], counts: dict[str, int], seq_len: int,
                     vocab_size: int) -> dict[str, Documents]:
    """The documents of each split: split ``name`` takes ``counts[name]`` documents of at least ``seq_len`` tokens
    from the dataset ``sources[name]`` (a ``.bin/.idx`` prefix), after those that earlier splits (in
    :data:`SPLITS` order) took from the same dataset."""
    taken: dict[str, int] = {}
    out = {}
    for name in SPLITS:
        prefix, n = sources[name], counts[name]
        if n < 1:
            raise DimPOError(f"the {name} split needs at least 1 document, got {n}")
        ds = IndexedDataset(prefix)
        eligible = np.flatnonzero(ds.sizes >= seq_len)
        skip = taken.get(prefix, 0)
        if len(eligible) - skip < n:
            others = f" ({skip} taken by the splits before it)" if skip else ""
            raise DimPOError(f"{prefix} has {len(eligible)} documents of at least {seq_len} tokens{others}; the {name} "
                             f"split needs {n} (documents are never concatenated: lower --seq-len or the "
                             f"document counts)")
        ids = [int(i) for i in eligible[skip:skip + n]]
        taken[prefix] = skip + n
        tokens = torch.from_numpy(np.stack([np.asarray(ds.get(i, 0, seq_len), dtype=np.int64) for i in ids]))
        if int(tokens.max()) >= vocab_size:
            raise DimPOError(f"{prefix} holds token id {int(tokens.max())}, beyond the model's vocabulary of "
                             f"{vocab_size} (tokenized with another tokenizer?)")
        out[name] = Documents(prefix, ids, tokens)
    return out


# ----------------------------------------------------------------------------------------------
# one layer's vectors


class _Captured(Exception):
    """Raised by the capture hook to end the forward once the layer's ``(q, k, v)`` are taken."""

    def __init__(self, qkv: tuple[torch.Tensor, ...]):
        super().__init__()
        self.qkv = qkv


def check_layers_vanilla(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's attention modules, each checked to be vanilla softmax attention (the one DimPO projects)."""
    modules = model.attention_modules()
    for layer, module in enumerate(modules):
        name = getattr(module, "name", type(module).__name__)
        if name != "vanilla":
            raise DimPOError(f"layer {layer} uses '{name}' attention; DimPO projects vanilla softmax attention")
    return modules


@torch.no_grad()
def layer_qkv(model: torch.nn.Module, layer: int, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Rotary-embedded ``(q, k, v)`` of attention layer ``layer`` for ``tokens`` (B, T): q (B, H, T, d_h),
    k and v (B, H_kv, T, d_h), float32; the forward stops at that layer."""
    module = model.attention_modules()[layer]

    def take(mod, args, kwargs):
        raise _Captured(mod.split_heads(*args, **kwargs))

    hook = module.register_forward_pre_hook(take, with_kwargs=True)
    try:
        model(tokens)
    except _Captured as c:
        return tuple(t.float() for t in c.qkv)
    finally:
        hook.remove()
    raise RuntimeError(f"the forward never reached attention layer {layer}")


@dataclass
class LayerSplit:
    """One layer's vectors on one split (float32, rotary applied).

    Instances are rows sorted by (document, head, position): ``doc``, ``head``, ``pos`` (n,) int64 and their
    queries ``q`` (n, d_h). ``k`` and ``v`` (N, H_kv, T, d_h) hold every key and value of each document (``v`` is
    None when not kept); query head ``h`` reads key/value head ``h // group``."""

    q: torch.Tensor
    doc: torch.Tensor
    head: torch.Tensor
    pos: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor | None
    group: int

    @property
    def head_dim(self) -> int:
        return self.q.shape[-1]

    def __len__(self) -> int:
        return self.q.shape[0]

    def kv_head(self, rows: torch.Tensor) -> torch.Tensor:
        return self.head[rows] // self.group

    def blocks(self, size: int) -> Iterator[tuple[slice, int, int]]:
        """Runs of at most ``size`` consecutive instances of one (document, head): ``(rows, doc, kv_head)``."""
        key = self.doc * (self.group * self.k.shape[1]) + self.head
        change = torch.ones_like(key, dtype=torch.bool)
        change[1:] = key[1:] != key[:-1]
        starts = change.nonzero().flatten().tolist() + [len(key)]
        for a, b in itertools.pairwise(starts):
            for s in range(a, b, size):
                yield slice(s, min(b, s + size)), int(self.doc[a]), int(self.head[a]) // self.group

    def original_logits(self, rows: slice, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Original logits ``q K^T / sqrt(d_h)`` (b, m) of a block's queries against ``keys`` (m, d_h), and the
        causal mask (b, m)."""
        valid = torch.arange(keys.shape[0], device=keys.device)[None, :] <= self.pos[rows, None]
        return self.q[rows] @ keys.T / math.sqrt(self.head_dim), valid

    def pooled_vectors(self) -> list[torch.Tensor]:
        """What PCA is fitted on: the instances' queries (n, d_h) and every key of the documents (N H_kv T, d_h)."""
        return [self.q, self.k.reshape(-1, self.head_dim)]


def capture_split(model: torch.nn.Module, layer: int, docs: Documents, every_query: bool, keep_values: bool,
                  desc: str) -> LayerSplit:
    """Layer ``layer``'s :class:`LayerSplit` on ``docs``: every query of every head (``every_query``), or every
    H-th query of head ``h`` from position ``h``; values kept when ``keep_values``. Each document's vectors are
    written into storage allocated once, at the first document."""
    device = next(model.parameters()).device
    N = len(docs.ids)
    for n in progress_bar(iterable=range(N), desc=desc, unit="doc", leave=False):
        q, k, v = (t[0] for t in layer_qkv(model, layer, docs.tokens[n:n + 1].to(device)))
        if n == 0:
            H, T, D = q.shape
            if H % k.shape[0]:
                raise ValueError(f"layer {layer}: {H} query heads do not share {k.shape[0]} key/value heads evenly")
            heads = torch.arange(H, device=device)[:, None].expand(H, T)
            positions = torch.arange(T, device=device).expand(H, T)
            keep = torch.ones(H, T, dtype=torch.bool, device=device) if every_query else positions % H == heads
            head, pos = heads[keep], positions[keep]  # sorted by (head, position)
            per_doc = len(pos)
            queries = torch.empty(N * per_doc, D, device=device)
            keys = torch.empty(N, *k.shape, device=device)
            values = torch.empty(N, *v.shape, device=device) if keep_values else None
        queries[n * per_doc:(n + 1) * per_doc] = q[head, pos]
        keys[n] = k
        if keep_values:
            values[n] = v
    doc = torch.arange(N, device=device).repeat_interleave(per_doc)
    return LayerSplit(queries, doc, head.repeat(N), pos.repeat(N), keys, values, H // k.shape[0])
