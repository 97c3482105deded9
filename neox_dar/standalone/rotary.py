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
