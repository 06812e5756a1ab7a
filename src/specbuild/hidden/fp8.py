"""fp8 storage for the auxiliary hidden states: float8_e4m3fn with one scale per token and layer.

Why per token and per layer: hidden-state magnitudes differ by orders of magnitude between the
low, mid and high layers and between tokens (attention-sink tokens carry huge activations). One
scale per (token, layer) keeps each 1 x H group inside e4m3's range, so the error of every element
is bounded relative to its own group's largest value, not the shard's.

Error bound (tested): with scale = amax / 448, every element x of a group dequantizes to x' with
|x - x'| <= |x| / 16 + scale / 1024 (3 mantissa bits round to half a step, 2**-4 relative; below
e4m3's smallest normal 2**-6 the spacing is 2**-9, half of it 2**-10 after scaling back).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["FP8_DTYPE", "FP8_MAX", "quantize_fp8", "dequantize_fp8"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
# An all-zero group (padding-like rows) would give scale 0 and 0/0 on the way back; any
# positive scale stores zeros exactly, so floor it at the smallest normal float32.
_MIN_SCALE = float(torch.finfo(torch.float32).tiny)


def quantize_fp8(x: Tensor, groups: int) -> tuple[Tensor, Tensor]:
    """Quantize `x` [T, groups*H] to (float8_e4m3fn [T, groups*H], float32 scale [T, groups])."""
    t, width = x.shape
    if width % groups:
        raise ValueError(f"width {width} is not a multiple of {groups} groups")
    g = x.float().reshape(t, groups, width // groups)  # shape: [T, G, H]
    scale = (g.abs().amax(dim=-1) / FP8_MAX).clamp_min(_MIN_SCALE)  # shape: [T, G]
    q = (g / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(t, width), scale


def dequantize_fp8(q: Tensor, scale: Tensor) -> Tensor:
    """Inverse of quantize_fp8: float32 [T, groups*H]."""
    t, width = q.shape
    groups = scale.shape[1]
    g = q.float().reshape(t, groups, width // groups) * scale.float().unsqueeze(-1)
    return g.reshape(t, width)
