"""Rotary position embeddings: GPT-NeoX's "rotate half" on the first ``rotary_ndims`` dims of each head, and the
cos/sin tables (with Llama-3's frequency scaling), computed as Hugging Face does. Plain PyTorch (the package's rule,
:mod:`neox_dar.standalone`)."""

from __future__ import annotations

import math

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX "rotate half": ``[x1, x2] -> [-x2, x1]`` over the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` with its first ``r = cos.shape[-1]`` dims turned: ``x_rot * cos + rotate_half(x_rot) * sin``, the
    other dims passed through (a new tensor, ``x``'s dtype: float32 tables turn a half ``x`` in float32)."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat(((x_rot * cos + rotate_half(x_rot) * sin).to(x.dtype), x_pass), dim=-1)


class Rotary(torch.autograd.Function):
    """:func:`rotate` whose backward is the inverse turn, ``rotate(g, cos, -sin)``: the gradient of a rotation
    by the angles ``theta`` is the rotation of the output gradient by ``-theta`` (``cos``, ``sin`` have equal halves,
    ``[c, c]`` and ``[s, s]``, as :func:`rotary_table` makes them; no gradient for them). The same values as
    autograd through :func:`rotate` bit for bit, without its backward's zero-filled full-width gradients of the two
    slices and their sum."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos, sin = ctx.saved_tensors
        return rotate(grad, cos, -sin), None, None


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of ``x`` (B, H, T, d_h); ``cos``/``sin`` broadcast against
    ``x[..., :r]``: (T, r) for one set of positions, (B, 1, T, r) for positions per row. With a gradient to
    compute for ``x`` only, through :class:`Rotary` (tables that want one themselves go through autograd)."""
    if cos.shape[-1] == 0:
        return x
    if torch.is_grad_enabled() and x.requires_grad and not (cos.requires_grad or sin.requires_grad):
        return Rotary.apply(x, cos, sin)
    return rotate(x, cos, sin)


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
