"""Triton fused attention kernels for the DAR, SWA/MSWA and AHA variants (forward and backward), and the per-row
key-range attention of AHA's decode step and DAR's decode step over its compressed cache.

``from kernels import dar_attention, mswa_attention, aha_attention, range_attention, dar_decode_attention``. Inputs
(B, H, T, d_h), causal, scale ``1/sqrt(d_h)``, window convention "key j inside when i - j < w". CUDA tensors, or CPU
tensors when ``TRITON_INTERPRET=1`` was set before this import (Triton's interpreter: slow, for tests). See
docs/kernels.md.
"""

from .aha import aha_attention
from .dar import dar_attention
from .dar_decode import dar_decode_attention
from .decode import range_attention
from .mswa import mswa_attention
from .runtime import INTERPRET

__all__ = ["dar_attention", "mswa_attention", "aha_attention", "range_attention", "dar_decode_attention", "INTERPRET"]
