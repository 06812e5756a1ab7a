"""The analytic FLOP count of a training step, and the devices' peaks.

The FLOP count is checked against torch's own FlopCounterMode on a real forward + backward of
the tiny drafter (reference attention): the matrix products agree exactly once two known
differences are accounted for: the training-time-test extra keys, which the reference computes
elementwise and FlopCounterMode does not count (0.6% of the step at these shapes, under 0.01%
at 8B shapes), and the masked upper half of each step's T x T scores, which the reference
computes and FlopCounterMode counts but which is no model work (flops.py counts causal pairs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.flop_counter import FlopCounterMode

from specbuild.drafter.build import build_drafter
from specbuild.drafter.config import DrafterConfig
from specbuild.drafter.data import ShardSet
from specbuild.drafter.flops import StepWork, peak_tflops, step_flops
from specbuild.drafter.model import Eagle3Drafter
from specbuild.drafter.objective import TTTObjective
from specbuild.drafter.train import TrainConfig
from specbuild.eagle.target_info import read_target_info

H, V = 64, 256  # the tiny preset's hidden size and target vocabulary


def _objective(ws, steps: int) -> tuple[TTTObjective, ShardSet]:
    info = read_target_info(ws["target_fingerprint"])
    target = Path(ws["target_fingerprint"]).parent
    model, teacher = build_drafter(TrainConfig(), target, ws["vocab"], info.vocab_size)
    objective = TTTObjective(model, teacher, steps=steps, decay=0.8, amp=False)
    return objective, ShardSet(ws["shards"], hidden_size=H)


@pytest.mark.parametrize("steps", [1, 3, 7])
def test_step_flops_equal_torch_flop_counter_but_for_extra_keys_and_masked_scores(ws, steps):
    objective, data = _objective(ws, steps)
    batch = data.batch(data.refs[:3], 24)
    with FlopCounterMode(display=False) as counter:
        objective(batch).backward()
    parts = step_flops(objective.drafter.config, objective.work)
    B, L = objective.work.batch, objective.work.length
    assert B == 3 and len(objective.work.loss_rows) == steps
    assert objective.work.full_vocab_rows > 0  # a sample's first sight runs the full vocab
    # the reference's masked upper half: T (T - 1) / 2 pairs a head, scores and values, x3
    q = objective.drafter.config.num_attention_heads * objective.drafter.config.head_dim
    masked = sum(3 * 2 * B * q * (L - i) * (L - i - 1) for i in range(steps))
    ours = sum(parts.values()) - parts["attention_extra_keys"]
    assert ours + masked == counter.get_total_flops()
    assert (parts["attention_extra_keys"] > 0) == (steps > 1)
    assert sum(parts.values()) + masked == pytest.approx(counter.get_total_flops(), rel=0.01)
    objective(batch)  # the same samples again: their full-vocab argmax is memoized
    assert objective.work.full_vocab_rows == 0


def test_dense_parts_follow_six_times_parameters_times_rows():
    """The textbook count (2 per weight per row forward, 4 backward), from parameter counts."""
    cfg = DrafterConfig(
        hidden_size=H,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=V,
        draft_vocab_size=128,
        target_hidden_size=H,
    )
    model = Eagle3Drafter(cfg)
    layer = model.midlayer
    dense = sum(
        m.weight.numel()
        for m in [*layer.self_attn.children(), layer.mlp.gate_proj, layer.mlp.up_proj]
        + [layer.mlp.down_proj]
    )
    B, L, N = 2, 10, 5
    parts = step_flops(cfg, StepWork(B, L, (N,), teacher_rows=N, full_vocab_rows=3))
    assert parts["projections"] + parts["mlp"] == 6 * dense * B * L
    assert parts["fc"] == 4 * model.fc.weight.numel() * B * L  # fc's input is data: no dgrad
    assert parts["lm_head"] == 6 * model.lm_head.weight.numel() * N
    assert parts["teacher_draft"] == 2 * model.lm_head.weight.numel() * N  # no backward
    assert parts["teacher_full_vocab"] == 2 * H * V * 3
    pairs = L * (L + 1) // 2  # causal (query, key) pairs a head: the masked half is not work
    assert parts["attention"] == 3 * 2 * 2 * B * 4 * 16 * pairs
    assert parts["attention_extra_keys"] == 0


def test_the_peak_comes_from_the_device_name_and_a_cpu_has_none():
    assert peak_tflops("NVIDIA H200") == 989.5
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.5
    assert peak_tflops("NVIDIA H100 PCIe") == 756.5
    assert peak_tflops("NVIDIA H200 NVL") == 835.5
    assert peak_tflops("cpu") is None
