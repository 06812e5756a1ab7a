"""Float32 `nn.Linear` layers of an inference-only model through oneDNN instead of MKL on CPU.

Why: PyTorch's CPU build does float32 matmuls with MKL, and MKL picks its kernels by CPU
vendor: on the AMD EPYC (AVX-512) of the CPU default's machine it runs a generic path
(`MKL_VERBOSE` names no ISA) at about half the speed of oneDNN, which picks its kernels by ISA
flags. Weights are packed once for oneDNN (`torch.ops.mkldnn._reorder_linear_weight`), then
every forward is `torch.ops.mkldnn._linear_pointwise` (BENCHMARKS.md, issue 17.5).

What changes: float32 rounding only (another summation order; max |diff| ~1e-4 on logits of
magnitude ~20), so a greedy decode can differ from MKL's where two logits tie within that.
The swap is for inference: packed weights take no gradient, and tied weights (a tied lm_head)
get a packed copy of their own.
"""

from __future__ import annotations

import logging

import torch

__all__ = ["OneDNNLinear", "use_onednn_linears", "onednn_usable"]

log = logging.getLogger("specbuild")

# batch-size hint for packing; the packed weight serves every batch size
PACK_HINT = 32


def onednn_usable(model: torch.nn.Module) -> bool:
    """True where the swap applies: a float32 model on CPU and a torch built with oneDNN."""
    param = next(model.parameters(), None)
    return (
        param is not None
        and param.device.type == "cpu"
        and param.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and _has_ops()
    )


def _has_ops() -> bool:
    # private ops (torch 2.x builds with oneDNN): a torch without them keeps nn.Linear
    try:
        return all(
            hasattr(torch.ops.mkldnn, op) for op in ("_reorder_linear_weight", "_linear_pointwise")
        )
    except (AttributeError, RuntimeError):
        return False


class OneDNNLinear(torch.nn.Module):
    """`y = x W^T + b` with W packed for oneDNN; inference only."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.register_buffer(
            "packed", torch.ops.mkldnn._reorder_linear_weight(weight, PACK_HINT), persistent=False
        )
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # shape: [N, in]
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)  # shape: [..., out]


def use_onednn_linears(model: torch.nn.Module) -> int:
    """Replace every float32 CPU `nn.Linear` of `model` by a `OneDNNLinear`, in place.

    Returns how many were replaced (0 where `onednn_usable` is false: GPU, bf16, no oneDNN).
    """
    if not onednn_usable(model):
        return 0
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is torch.nn.Linear
    ]
    for parent, name, child in swaps:
        setattr(parent, name, OneDNNLinear(child))
    log.info("%d float32 linear layers run through oneDNN", len(swaps))
    return len(swaps)
