"""The decoder of the model families: the MLPs, one layer (two norms, the attention and the MLP, named as the
family's Hugging Face class names them, and the residual wiring around them) and the stack (embedding, layers, final
norm) with the decode step through the caches. neox-dar's model and the exported one are both built on these classes,
with their own norms and attention. Plain PyTorch (the package's rule, :mod:`neox_dar.standalone`).

Shapes: ``B`` batch, ``T`` tokens, ``d`` hidden size.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .cache import ModelCache


class GeluMLP(nn.Module):
    """``dense_4h_to_h(gelu(dense_h_to_4h(m)))`` with exact (erf) GeLU (GPT-NeoX); (B, T, d) -> (B, T, d)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.dense_4h_to_h = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(m)))


class SwiGLU(nn.Module):
    """``down_proj(silu(gate_proj(m)) * up_proj(m))`` (Llama, OLMo-2, Qwen); (B, T, d) -> (B, T, d)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))


def build_mlp(activation: str, hidden_size: int, intermediate_size: int, bias: bool) -> nn.Module:
    """The family's MLP: :class:`SwiGLU` for ``activation: swiglu``, else :class:`GeluMLP`."""
    return (SwiGLU if activation == "swiglu" else GeluMLP)(hidden_size, intermediate_size, bias)


class DecoderLayer(nn.Module):
    """One decoder layer: ``mlp``, the attention under the family's name (``attention`` in GPT-NeoX, ``self_attn``
    elsewhere) and two norms, ``input_layernorm`` and ``post_attention_layernorm`` before the sub-layers, or
    ``post_attention_layernorm`` and ``post_feedforward_layernorm`` after them (OLMo-2), wired as

    * pre-norm, parallel (GPT-NeoX): ``x + Attn(N1(x)) + MLP(N2(x))``
    * pre-norm, sequential (Llama, Qwen): ``y = x + Attn(N1(x)); y + MLP(N2(y))``
    * post-norm (OLMo-2): ``y = x + N1(Attn(x)); y + N2(MLP(y))``

    with ``dropout`` on each branch's output."""

    def build_layer(self, norm, attention_name: str, attention: nn.Module, mlp: nn.Module, post_norm: bool,
                    parallel: bool, dropout: nn.Module | None = None) -> None:
        """Add the modules, in this order: the two norms (``norm()`` makes one), ``attention``, ``mlp`` and
        ``dropout`` (none: identity)."""
        self.parallel, self.post_norm = parallel, post_norm
        self.norm_names = (("post_attention_layernorm", "post_feedforward_layernorm") if post_norm
                           else ("input_layernorm", "post_attention_layernorm"))
        for name in self.norm_names:
            self.add_module(name, norm())
        self.attn_name = attention_name
        self.add_module(attention_name, attention)
        self.mlp = mlp
        self.dropout = dropout if dropout is not None else nn.Identity()

    @property
    def attn(self) -> nn.Module:
        """The layer's attention module (``attention`` or ``self_attn``)."""
        return getattr(self, self.attn_name)

    def residual(self, x: torch.Tensor, attend) -> torch.Tensor:
        """The layer around ``attend`` (the attention input (B, T, d) -> its output), on ``x`` (B, T, d)."""
        norm1, norm2 = (getattr(self, n) for n in self.norm_names)
        if self.post_norm:
            y = x + self.dropout(norm1(attend(x)))
            return y + self.dropout(norm2(self.mlp(y)))
        attn = self.dropout(attend(norm1(x)))
        if self.parallel:  # summed in GPT-NeoX's order, (mlp + attn) + x: in half precision the order shows
            return self.dropout(self.mlp(norm2(x))) + attn + x
        y = x + attn
        return y + self.dropout(self.mlp(norm2(y)))

    def decode(self, x: torch.Tensor, cache, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The next tokens (B, T, d) of every row against the layer's ``cache`` (its attention's ``decode``)."""
        return self.residual(x, lambda a: self.attn.decode(a, cache, cos, sin))


class DecoderStack(nn.Module):
    """Embedding, layers and final norm, named as the family's class names them (``embed_in``/``final_layer_norm`` in
    GPT-NeoX, ``embed_tokens``/``norm`` elsewhere)."""

    def build_decoder(self, embed_name: str, embed: nn.Embedding, layers: Iterable[DecoderLayer], norm_name: str,
                      norm: nn.Module, dropout: nn.Module | None = None) -> None:
        """Add the modules, in this order: ``embed``, ``layers``, ``norm``; ``dropout`` (none: identity) applies to
        the embeddings."""
        self.embed_name, self.norm_name = embed_name, norm_name
        self.add_module(embed_name, embed)
        self.layers = nn.ModuleList(layers)
        self.add_module(norm_name, norm)
        self.dropout = dropout if dropout is not None else nn.Identity()

    @property
    def embed(self) -> nn.Embedding:
        return getattr(self, self.embed_name)

    @property
    def final_norm(self) -> nn.Module:
        return getattr(self, self.norm_name)

    def decode(self, input_ids: torch.Tensor, cache: ModelCache) -> torch.Tensor:
        """The next ``T`` tokens of every row (B, T), each at its row's next position, through the caches (which
        store them) -> hidden states (B, T, d)."""
        layout = cache.layout
        T = input_ids.shape[1]
        if layout.capacity is not None and layout.length + T > layout.capacity:
            raise ValueError(f"the cache holds {layout.capacity} tokens per row; {layout.length} are used and "
                             f"{T} more were given")
        x = self.dropout(self.embed(input_ids))
        cos, sin = layout.rotary(layout.length, T)  # (B or 1, T, r): each row's positions
        for layer, layer_cache in zip(self.layers, cache.layers):
            x = layer.decode(x, layer_cache, cos[:, None], sin[:, None])
        layout.advance(T)
        return self.final_norm(x)
