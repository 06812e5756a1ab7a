"""Drafter quality, per unrolled position, computed once and used by every evaluation.

- acc_i: share of positions where the drafter's argmax (mapped to a target id) is the
  target's argmax at draft position i (greedy acceptance of that token);
- expected acceptance at i: mean of sum_v min(p(v), q(v)), the chance speculative sampling
  accepts the drafted token (p: the target's full-vocabulary distribution, q: the drafter's);
- simulated acceptance length: 1 + sum_k prod_{i<=k} acc_i, tokens per verify step for a
  chain of drafts, the bonus token included (what the bench stage measures for real;
  `eagle.chain.simulated_acceptance_length`, which the report reads too).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specbuild.eagle.chain import simulated_acceptance_length

__all__ = ["StepCounts", "step_counts"]


@torch.no_grad()
def step_counts(
    student_logits: Tensor,
    teacher_draft_logits: Tensor,
    teacher_lse: Tensor,
    teacher_top: Tensor,
    draft_ids: Tensor,
) -> tuple[int, float, int]:
    """(correct, sum of sum_v min(p, q), positions) for one unrolled step.

    student_logits / teacher_draft_logits: [N,Vd]; teacher_lse: logsumexp of the target's
    full-vocab logits [N]; teacher_top: the target's argmax id [N]; draft_ids: [Vd] target ids.
    """
    drafted = draft_ids[student_logits.argmax(-1)]  # shape: [N] target ids
    p = (teacher_draft_logits.float() - teacher_lse[:, None]).exp()  # target probs on draft ids
    q = student_logits.float().softmax(-1)  # shape: [N,Vd]
    overlap = torch.minimum(p, q).sum(-1)  # shape: [N]
    return int((drafted == teacher_top).sum()), float(overlap.sum()), student_logits.shape[0]


@dataclass
class StepCounts:
    """Sums over an eval set, one entry per unrolled step (reduced across DDP ranks)."""

    correct: list[int]
    overlap: list[float]
    positions: list[int]
    loss_sum: float = 0.0
    batches: int = 0

    @classmethod
    def zeros(cls, steps: int) -> StepCounts:
        return cls([0] * steps, [0.0] * steps, [0] * steps)

    def add(self, i: int, correct: int, overlap: float, positions: int) -> None:
        self.correct[i] += correct
        self.overlap[i] += overlap
        self.positions[i] += positions

    def as_tensor(self) -> Tensor:
        rows = [self.correct, self.overlap, self.positions]
        flat = [float(v) for row in rows for v in row] + [self.loss_sum, float(self.batches)]
        return torch.tensor(flat, dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: Tensor, steps: int) -> StepCounts:
        v = t.tolist()
        return cls(
            [int(x) for x in v[:steps]],
            v[steps : 2 * steps],
            [int(x) for x in v[2 * steps : 3 * steps]],
            v[-2],
            int(v[-1]),
        )

    def summary(self) -> dict:
        acc = [c / n if n else 0.0 for c, n in zip(self.correct, self.positions, strict=True)]
        exp = [o / n if n else 0.0 for o, n in zip(self.overlap, self.positions, strict=True)]
        return {
            "eval_loss": self.loss_sum / max(self.batches, 1),
            "acc": [round(a, 6) for a in acc],
            "expected_acceptance": [round(e, 6) for e in exp],
            "acceptance_length": round(simulated_acceptance_length(acc), 6),
            "eval_positions": self.positions,
        }
