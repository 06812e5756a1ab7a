"""Float32 `nn.Linear` layers through oneDNN instead of MKL on CPU: an inference-only model's
(`use_onednn_linears`) and the drafter's in float32 training (`use_onednn_training_linears`).

Why: PyTorch's CPU build does float32 matmuls with MKL, and MKL picks its kernels by CPU
vendor: on the AMD EPYC (AVX-512) of the CPU default's machine it runs a generic path
(`MKL_VERBOSE` names no ISA) at about half the speed of oneDNN, which picks its kernels by ISA
flags. Weights are packed once for oneDNN (`torch.ops.mkldnn._reorder_linear_weight`), then
every forward is `torch.ops.mkldnn._linear_pointwise` (BENCHMARKS.md, "CPU decoding").

What changes: float32 rounding only (another summation order; max |diff| ~1e-4 on logits of
magnitude ~20), so a greedy decode can differ from MKL's where two logits tie within that.
The inference swap: packed weights take no gradient, and tied weights (a tied lm_head) get a
packed copy of their own. The training one keeps each `nn.Linear` and its parameter and runs
forward and both backward products through oneDNN (an autograd function), repacking a weight
once per optimizer step: 1.15x a float32 drafter step on the real shards (BENCHMARKS.md, "CPU
training").
"""

from __future__ import annotations

import logging

import torch

__all__ = [
    "OneDNNLinear",
    "OneDNNTrainLinear",
    "onednn_usable",
    "use_onednn_linears",
    "use_onednn_training_linears",
]

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


def _linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [N, in] @ weight [out, in]^T (+ bias) through oneDNN; weight packed or plain (float32,
    CPU)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] (float32, CPU) reordered for oneDNN's linear kernels."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_HINT)


class OneDNNLinear(torch.nn.Module):
    """`y = x W^T + b` with W packed for oneDNN; inference only."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", _pack(linear.weight), persistent=False)
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # shape: [N, in]
        out = _linear(flat, self.packed, self.bias)
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


class _PackCache:
    """One packed copy of a trained weight per optimizer step: the TTT unroll runs each linear
    `ttt_steps` times between updates, and an in-place update bumps the tensor's version."""

    def __init__(self) -> None:
        self.key: tuple[int, int] | None = None
        self.value: torch.Tensor | None = None

    def get(self, weight: torch.Tensor, make) -> torch.Tensor:
        key = (weight.data_ptr(), weight._version)
        if key != self.key:
            self.key, self.value = key, make(weight)
        return self.value


class _OneDNNLinearFn(torch.autograd.Function):
    """y = x W^T with the three products of training through oneDNN:
    y = x W^T, dx = dy W (= linear(dy, W^T)), dW = dy^T x (= linear(dy^T, x^T))."""

    @staticmethod
    def forward(ctx, x, weight, layer):  # x [N, in], weight [out, in]
        ctx.save_for_backward(x, weight)
        ctx.layer = layer
        return _linear(x, layer._fwd.get(weight, _pack))  # shape: [N, out]

    @staticmethod
    def backward(ctx, grad):  # grad [N, out]
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            wt = ctx.layer._bwd.get(weight, lambda w: _pack(w.t().contiguous()))
            grad_x = _linear(grad, wt)  # shape: [N, in]
        if ctx.needs_input_grad[1]:
            grad_w = _linear(grad.t(), x.t())  # shape: [out, in]
        return grad_x, grad_w, None


class OneDNNTrainLinear(torch.nn.Linear):
    """A bias-free `nn.Linear` whose float32 CPU products, forward and backward, run through
    oneDNN (`_OneDNNLinearFn`); the same parameter, so checkpoints and the optimizer do not
    change. Anything else (GPU, bf16 or autocast inputs) takes `nn.Linear`'s path."""

    _fwd: _PackCache
    _bwd: _PackCache

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (
            w.device.type != "cpu"
            or w.dtype != torch.float32
            or x.dtype != torch.float32
            or torch.is_autocast_enabled("cpu")
        ):
            return super().forward(x)
        flat = x.reshape(-1, self.in_features).contiguous()  # shape: [N, in]
        out = _OneDNNLinearFn.apply(flat, w, self)
        return out.reshape(*x.shape[:-1], self.out_features)  # shape: [..., out]


def use_onednn_training_linears(model: torch.nn.Module) -> int:
    """Turn every bias-free float32 CPU `nn.Linear` of `model` into a `OneDNNTrainLinear`, in
    place (the same module and parameter, another class). Returns how many; 0 where
    `onednn_usable` is false."""
    if not onednn_usable(model):
        return 0
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear and m.bias is None]
    for m in layers:
        m.__class__ = OneDNNTrainLinear
        m._fwd, m._bwd = _PackCache(), _PackCache()
    log.info("%d float32 linear layers train through oneDNN", len(layers))
    return len(layers)
