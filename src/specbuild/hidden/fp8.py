"""fp8 storage for hidden states: float8_e4m3fn with one float32 scale per token and group of
channels, a group being a whole layer (the default) or `group_size` channels of one.

Why per token and per layer: hidden-state magnitudes differ by orders of magnitude between the
low, mid and high layers and between tokens (attention-sink tokens carry huge activations). One
scale per (token, layer) keeps each 1 x H group inside e4m3's range, so the error of every element
is bounded relative to its own group's largest value, not the shard's. Smaller groups (a scale
per 64 channels, say) keep a few huge channels (SmolLM2's channel 507 reaches ~25,000 where the
median is ~2) from setting the scale of all the others; e4m3's 3 mantissa bits set the error of
everything above its smallest normal either way (~2% relative, BENCHMARKS.md), so they buy less
than they cost in scale bytes unless acceptance says otherwise.

Error bound (tested): with scale = amax / 448, every element x of a group dequantizes to x' with
|x - x'| <= |x| / 16 + scale / 1024 (3 mantissa bits round to half a step, 2**-4 relative; below
e4m3's smallest normal 2**-6 the spacing is 2**-9, half of it 2**-10 after scaling back).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "parse_storage",
    "scale_groups",
    "quantize_fp8",
    "dequantize_fp8",
]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
# An all-zero group (padding-like rows) would give scale 0 and 0/0 on the way back; any
# positive scale stores zeros exactly, so floor it at the smallest normal float32.
_MIN_SCALE = float(torch.finfo(torch.float32).tiny)


def parse_storage(storage: str) -> tuple[str, int]:
    """hidden.storage -> (shard dtype, channels per fp8 scale; 0: the whole layer).

    "bf16", "fp8" (a scale per token and layer) or "fp8-g<N>" (a scale per N channels). One
    string, not a second key, so that the `hidden` jobs' params of bf16 and per-layer fp8 runs
    stay what they were and their shards (the expensive part) are not rebuilt.
    """
    dtype, sep, group = storage.partition("-g")
    if dtype in ("bf16", "fp8") and (
        not sep or (dtype == "fp8" and group.isdigit() and int(group))
    ):
        return dtype, int(group or 0)
    raise ValueError(
        f"hidden.storage {storage!r}: choose bf16, fp8 (a scale per token and layer) or "
        "fp8-g<N> (a scale per N channels, N dividing the hidden size)"
    )


def scale_groups(hidden_size: int, group_size: int) -> int:
    """Scales per token and layer: 1 for `group_size` 0 (the whole layer), else H / group_size.

    Raises ValueError naming hidden.storage when the group size does not divide H.
    """
    if group_size == 0 or group_size == hidden_size:
        return 1
    if group_size < 0 or hidden_size % group_size:
        raise ValueError(
            f"hidden.storage fp8-g{group_size}: {group_size} channels per scale do not divide "
            f"the target's hidden size {hidden_size}; use fp8 (a scale per token and layer) "
            f"or fp8-g<N> with N dividing {hidden_size}"
        )
    return hidden_size // group_size


def quantize_fp8(x: Tensor, groups: int) -> tuple[Tensor, Tensor]:
    """Quantize `x` [T, W] in `groups` equal runs of channels per token to (float8_e4m3fn
    [T, W], float32 scale [T, groups])."""
    t, width = x.shape
    if width % groups:
        raise ValueError(f"width {width} is not a multiple of {groups} groups")
    g = x.float().reshape(t, groups, width // groups)  # shape: [T, G, W/G]
    scale = (g.abs().amax(dim=-1) / FP8_MAX).clamp_min(_MIN_SCALE)  # shape: [T, G]
    q = (g / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(t, width), scale


def dequantize_fp8(q: Tensor, scale: Tensor) -> Tensor:
    """Inverse of quantize_fp8: float32 [T, W], the group width taken from scale's shape."""
    t, width = q.shape
    groups = scale.shape[1]
    g = q.float().reshape(t, groups, width // groups) * scale.float().unsqueeze(-1)
    return g.reshape(t, width)
