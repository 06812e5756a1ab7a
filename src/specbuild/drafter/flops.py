"""FLOPs of one drafter training step, counted from the shapes it ran at (the MFU numerator).

A multiply-add is 2 FLOPs. Counted: every matrix product of the step, plus the two elementwise
products that stand in for matrix products in training-time-test attention (below). Not
counted: norms, RoPE, softmax, SiLU, the loss's elementwise ops, the optimizer and gradient
clipping, all O(rows x width) and together a few % of the products at real shapes.

Per TTT step i (`Eagle3Drafter.unroll`: step i runs over T_i = L - i positions of every padded
sample, R_i = B * T_i rows; H hidden, nh/nkv heads of hd, I MLP width):

    projections  q: 2 R_i 2H nh*hd    k, v: 2 R_i 2H nkv*hd each    o: 2 R_i nh*hd H
                 (multi-latent attention: q_a 2 R_i 2H q_lora, q_b 2 R_i q_lora nh*(nope+rope),
                 kv_a 2 R_i 2H (kv_lora+rope), kv_b 2 R_i kv_lora nh*(nope+v), o 2 R_i nh*v H;
                 in the attention terms below hd is nope+rope for the scores, v for the values)
    mlp          gate, up, down: 3 * 2 R_i H I
    attention    scores q k0^T and values p v0 over the causal step-0 prefix, the
                 T_i (T_i + 1) / 2 (query, key) pairs query t >= key s: 2 * 2 B nh hd T_i (T_i+1)/2.
                 Useful work only, whichever implementation runs (`unroll`'s `attention`):
                 the reference (`ttt_attention`) computes the whole T_i x T_i square and masks
                 the upper half; the fused kernel (`fused_attention`) computes the causal
                 blocks, the diagonal blocks whole (128 x 128 tiles, half masked) and the
                 padding of T_i up to a power of two in its last block. The masked scores of
                 either are not model FLOPs, so neither is counted.
    extra keys   the i keys of the query's own draft chain (steps 1..i), one score and one
                 value each: 2 * 2 B nh T_i hd * i. Elementwise (mul + sum) in the reference;
                 in the fused kernel one diagonal 128 x 128 tile per query block and key step,
                 of which 128 scores count (the rest is masked, as above).
    lm_head      2 N_i H Vd, N_i = the loss rows of step i (logits are computed there only)

Once per step: fc 2 B L 3H_t H over all L positions; the teacher's draft-vocab logits
2 M H Vd (M loss rows); the target's full-vocabulary argmax 2 F H V, F = the loss rows of the
samples seen for the first time in this run (memoized after: in `TTTObjective._mask`).

Backward = 2x forward for every product whose input needs a gradient too (input and weight
gradients), which is all of the drafter but fc: its input is data (the target's features), so
fc's backward is the weight gradient alone, 1x. The teacher and full-vocab products have no
backward. `torch.utils.flop_counter.FlopCounterMode` on the reference path counts these
products plus the masked upper half of each T_i x T_i square and minus the extra keys (it
counts matmul-like ops only, and what runs); tests/unit/drafter/test_flops.py checks that.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbuild.drafter.config import DrafterConfig
from specbuild.eagle.layers import AUX_LAYERS

__all__ = ["PEAK_BF16_TFLOPS", "StepWork", "device_name", "peak_tflops", "step_flops"]

# Dense (no 2:4 sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s, matched as
# a substring of torch.cuda.get_device_name(); the first match wins ("H200 NVL" before "H200").
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200 NVL", 835.5),
    ("H200", 989.5),  # SXM; GH200 matches here too (same Hopper SXM part)
    ("H100 NVL", 835.5),
    ("H100 PCIe", 756.5),
    ("H100", 989.5),  # SXM
    ("A100", 312.0),
)


@dataclass(frozen=True)
class StepWork:
    """The sizes one training step ran at: host ints the step knew anyway (no extra sync)."""

    batch: int  # B samples
    length: int  # L padded positions (index t = 0 .. L-1)
    loss_rows: tuple[int, ...]  # N_i: lm_head rows at TTT step i (one entry per step run)
    teacher_rows: int  # M: rows through the teacher's draft-vocab logits
    full_vocab_rows: int  # F: rows through the target's full-vocabulary head


def step_flops(cfg: DrafterConfig, work: StepWork) -> dict[str, int]:
    """FLOPs (forward + backward) of one training step by part; the module docstring says how.

    Parts: fc, projections, mlp, attention, attention_extra_keys, lm_head, teacher_draft,
    teacher_full_vocab. Their sum is the step's count.
    """
    H, inter, Vd, V = cfg.hidden_size, cfg.intermediate_size, cfg.draft_vocab_size, cfg.vocab_size
    nh = cfg.num_attention_heads
    q, kv = nh * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    if cfg.mla:  # per row: the down projections, the up projections, o
        ql, kvl, rope = cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        vo = nh * cfg.v_head_dim  # the values' width; q (nh*(nope+rope)) the scores'
        up = ql * q + kvl * nh * (cfg.qk_nope_head_dim + cfg.v_head_dim)
        proj = 2 * H * (ql + kvl + rope) + up + vo * H
    else:
        vo, proj = q, 2 * H * (q + 2 * kv) + q * H
    B, L = work.batch, work.length
    fwd = dict.fromkeys(("projections", "mlp", "attention", "attention_extra_keys", "lm_head"), 0)
    for i, n_loss in enumerate(work.loss_rows):
        T = L - i
        R = B * T
        fwd["projections"] += 2 * R * proj
        fwd["mlp"] += 3 * 2 * R * H * inter
        fwd["attention"] += B * (q + vo) * T * (T + 1)  # scores, values (causal)
        fwd["attention_extra_keys"] += 2 * B * (q + vo) * T * i
        fwd["lm_head"] += 2 * n_loss * H * Vd
    out = {"fc": 2 * (2 * B * L * AUX_LAYERS * cfg.target_hidden_size * H)}  # fwd + weight grad
    out |= {k: 3 * v for k, v in fwd.items()}  # forward + the gradients of both operands
    out["teacher_draft"] = 2 * work.teacher_rows * H * Vd  # no grad
    out["teacher_full_vocab"] = 2 * work.full_vocab_rows * H * V
    return out


def device_name(device: torch.device) -> str:
    """The accelerator's marketing name ("NVIDIA H200"), or "cpu"."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def peak_tflops(name: str) -> float | None:
    """Dense bf16 peak TFLOP/s of a device named `name`; None when unknown (CPU: no MFU)."""
    return next((peak for key, peak in PEAK_BF16_TFLOPS if key in name), None)
