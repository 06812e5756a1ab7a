"""The drafter's lm_head and soft cross-entropy in one pass over row chunks, gradients included.

The training loss at TTT step i is -sum_rows sum_v t[v] log softmax(x W^T)[v] over the rows
that count (`objective.TTTObjective`). Written as autograd sees it, each step keeps its
[rows, Vd] logits and their float32 log-softmax for the backward: at the GPU example's shapes
(~11K rows, Vd 32,000, 7 steps) that is gigabytes a step, and the memory-bound softmax and KL
passes were 28% of a step's kernel time (BENCHMARKS.md, `make bench-train` smollm2 preset),
against 7.6% for the lm_head matmul itself. Here the loss and both gradients come from one
pass over chunks of rows: per chunk the logits are computed, reduced to the loss, turned into
d loss / d logits = softmax * sum(t) - t, and multiplied back into the gradients of x and W;
no [rows, Vd] tensor outlives its chunk, and nothing but the two gradients is kept for the
backward.

Rounding matches the unfused path under autocast: logits from a `compute_dtype` matmul, the
softmax and the loss in float32, d loss / d logits rounded to `compute_dtype` before the two
gradient matmuls, as autocast's matmul backward does. The unit tests check the loss and both
gradients against the unfused expression.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

__all__ = ["CHUNK_ROWS", "linear_soft_cross_entropy"]

log = logging.getLogger("specbuild")

CHUNK_ROWS = 4096  # rows a chunk: [4096, 32,000] float32 logits are 0.5 GB


def _soft_cross_entropy(logits: Tensor, targets: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """(summed loss, d loss / d logits in the logits' dtype) of one chunk of rows."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))  # shape: [n,Vd]
    t = targets[rows].to(z.dtype)  # shape: [n,Vd]
    mass = t.sum(-1, keepdim=True)  # 1 for a softmax or one-hot teacher
    lse = z.logsumexp(-1, keepdim=True)
    loss = (mass * lse).sum() - (t * z).sum()
    return loss, ((z - lse).exp() * mass - t).to(logits.dtype)


_compiled: list = []  # the CUDA kernel of _soft_cross_entropy, compiled at first use


def _chunk_kernel(device: torch.device):
    """On CUDA `_soft_cross_entropy` compiled (Inductor fuses its reductions and elementwise
    passes over the chunk into a few kernels: the memory traffic is what the loss cost);
    elsewhere, or if compiling fails, the same function eagerly."""
    if device.type != "cuda":
        return _soft_cross_entropy
    if not _compiled:
        _compiled.append(torch.compile(_soft_cross_entropy, dynamic=True))
    return _compiled[0]


class _LinearSoftCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        x: Tensor,
        weight: Tensor,
        targets: Tensor,
        rows: Tensor,
        compute_dtype: torch.dtype,
        chunk_rows: int,
    ) -> Tensor:
        w = weight.to(compute_dtype)
        acc = torch.promote_types(compute_dtype, torch.float32)  # softmax and sums: >= float32
        loss = torch.zeros((), dtype=acc, device=x.device)
        grad_x = torch.empty_like(x)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        kernel = _chunk_kernel(x.device)
        for start in range(0, x.shape[0], chunk_rows):
            xc = x[start : start + chunk_rows].to(compute_dtype)
            logits = xc @ w.T  # shape: [n,Vd]
            chunk = rows[start : start + chunk_rows]
            try:
                part, grad = kernel(logits, targets, chunk)
            except Exception as err:  # a compiler fault costs speed, never the run
                if kernel is _soft_cross_entropy:
                    raise
                log.warning("fused loss: compiling failed (%s); running it eagerly", err)
                _compiled[0] = kernel = _soft_cross_entropy
                part, grad = kernel(logits, targets, chunk)
            loss += part
            grad_x[start : start + chunk_rows] = (grad @ w).to(x.dtype)
            grad_w += (grad.T @ xc).to(acc)
        ctx.save_for_backward(grad_x, grad_w)
        ctx.weight_dtype = weight.dtype
        return loss.float()

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        grad_x, grad_w = ctx.saved_tensors
        return (
            grad_x * grad_loss.to(grad_x.dtype),
            (grad_w * grad_loss.to(grad_w.dtype)).to(ctx.weight_dtype),
            None,
            None,
            None,
            None,
        )


def linear_soft_cross_entropy(
    x: Tensor,
    weight: Tensor,
    targets: Tensor,
    rows: Tensor,
    *,
    compute_dtype: torch.dtype,
    chunk_rows: int = CHUNK_ROWS,
) -> Tensor:
    """sum over i of -sum_v targets[rows[i], v] * log_softmax(x[i] @ weight.T)[v], float32
    (softmax and sums in float32, or float64 when `compute_dtype` is).

    x [N,H] (the normed hidden states), weight [Vd,H] (lm_head), targets [M,Vd] float32 (no
    gradient), rows [N] int64 into targets. Gradients flow to x and weight.
    """
    if targets.requires_grad:
        raise ValueError("linear_soft_cross_entropy: targets take no gradient")
    return _LinearSoftCrossEntropy.apply(x, weight, targets, rows, compute_dtype, chunk_rows)
