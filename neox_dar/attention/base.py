"""What every attention variant shares: the fused QKV projection, rotary, heads, output projection.

Shapes: ``B`` batch, ``T`` tokens, ``d`` hidden size, ``H`` heads, ``d_h = d / H``.
"""

from __future__ import annotations

import abc

import torch
from torch import nn

from ..config import Config


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

    Subclasses implement :meth:`attend` over per-head ``q, k, v`` of shape (B, H, T, d_h), and may add
    parameters under their own names (``dar_down``, ``router``, ...). A variant that adds a loss term
    stores it in ``self.aux_loss`` (a scalar tensor) during ``forward``; per-head statistics for the
    logs go in ``self.stats`` (a dict of tensors).
    """

    def __init__(self, cfg: Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.impl = cfg.attention_impl
        self.query_key_value = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.aux_loss: torch.Tensor | None = None
        self.stats: dict[str, torch.Tensor] = {}

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

    def attended_keys(self, seq_len: int) -> float:
        """Mean number of keys one query scores, over positions 0..T-1 (for the FLOP counter)."""
        return (seq_len + 1) / 2

    def extra_flops_per_token(self) -> float:
        """Training FLOPs per token of matrix products that ``6 * params`` misses (a weight used twice)."""
        return 0.0

    def resolved_impl(self, device: torch.device) -> str:
        """``attention_impl`` with ``auto`` resolved: ``triton`` on CUDA, ``sdpa`` elsewhere."""
        if self.impl == "auto":
            return "triton" if device.type == "cuda" else "sdpa"
        return self.impl
