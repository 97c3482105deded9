"""DAR two-path attention: local keys/values inside the window, the bottleneck's global ones beyond it."""

from __future__ import annotations

import torch

from .banded import banded_backward, banded_forward
from .runtime import check_qkv, head_windows, unit_last_dim


class DARKernelFunction(torch.autograd.Function):
    """Fused DAR attention; gradients for all five inputs. See :func:`dar_attention`."""

    @staticmethod
    def forward(ctx, q, k_loc, v_loc, k_glob, v_glob, windows):
        o, lse = banded_forward(q, k_loc, v_loc, k_glob, v_glob, windows, has_local=True, has_far=True)
        ctx.save_for_backward(q, k_loc, v_loc, k_glob, v_glob, o, lse)
        ctx.windows = windows
        return o

    @staticmethod
    def backward(ctx, do):
        q, k_loc, v_loc, k_glob, v_glob, o, lse = ctx.saved_tensors
        (do,) = unit_last_dim(do)
        grads = banded_backward(q, k_loc, v_loc, k_glob, v_glob, o, lse, do, ctx.windows, has_far=True)
        return (*grads, None)


@torch.compiler.disable  # host-side launch logic: runs eagerly between compiled graphs
def dar_attention(q: torch.Tensor, k_loc: torch.Tensor, v_loc: torch.Tensor, k_glob: torch.Tensor,
                  v_glob: torch.Tensor, window: int) -> torch.Tensor:
    """Causal attention where pair ``(i, j)`` uses ``k_loc[j], v_loc[j]`` if ``i - j < window`` else
    ``k_glob[j], v_glob[j]``, one softmax over all ``j <= i``, scale ``1/sqrt(d_h)``.

    ``q`` (B, H, T, d_h); the four key/value tensors (B, H_kv, T, d_h) with H_kv dividing H (grouped-query
    attention: query head ``h`` reads key/value head ``h // (H // H_kv)``); same dtype (float16/bfloat16/float32)
    and device. Returns (B, H, T, d_h).
    """
    kv_group = check_qkv("dar_attention", q, k_loc=k_loc, v_loc=v_loc, k_glob=k_glob, v_glob=v_glob)
    windows = head_windows("dar_attention", window, q.shape[1], q.shape[2], q.device, kv_group=kv_group)
    return DARKernelFunction.apply(*unit_last_dim(q, k_loc, v_loc, k_glob, v_glob), windows)
