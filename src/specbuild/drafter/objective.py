"""The training-time-test objective and its evaluation (alignment: see drafter/train.py).

Loss = sum_i decay**i * soft cross-entropy(teacher, drafter) at unroll step i, averaged over
the positions that count: the predicted token is a response token and the target's argmax is
in the draft vocabulary. With an acceptance weight w, each position's term is
(1 - w) * cross-entropy + w * -log(sum_v min(p_v, q_v)): the expected acceptance of a draft
from q checked against p, the quantity serving pays for (an LK-style loss). The teacher is the
target's softmax over the draft vocabulary at `temperature` (1: as is; 0: its argmax,
one-hot), computed once per batch at those positions; step i reads it shifted by i (step i at
index t predicts what index t+i's teacher predicts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.profiler import record_function

from specbuild.drafter.data import Batch, BatchOrder, SampleRef, ShardSet, plan_batches
from specbuild.drafter.flops import StepWork, step_flops
from specbuild.drafter.fused_loss import linear_soft_cross_entropy
from specbuild.drafter.metrics import StepCounts, step_counts
from specbuild.drafter.model import Eagle3Drafter
from specbuild.drafter.teacher import Teacher

__all__ = ["LossForm", "LossRows", "TTTObjective", "evaluate", "loss_rows", "step_loss"]


@dataclass(frozen=True)
class LossForm:
    """What each position's loss compares: the teacher at `teacher_temperature` (1: as is; 0:
    its argmax, one-hot) against the drafter, with `acceptance_weight` of the loss on -log of
    the expected acceptance instead of the soft cross-entropy (train config keys alike)."""

    teacher_temperature: float = 1.0
    acceptance_weight: float = 0.0


@dataclass(frozen=True)
class LossRows:
    """Where a batch's loss is taken, as indices on the step's device.

    taught [M]: the flat [B*L] indices of the loss mask's positions (row-major, as boolean
    indexing orders them), whose teacher rows the step computes; steps[i] = (flat [B*(L-i)]
    indices of the positions step i is scored at, the teacher row each one reads).
    """

    taught: Tensor
    steps: list[tuple[Tensor, Tensor]]


def loss_rows(mask: Tensor, steps: int, device: torch.device) -> LossRows:
    """The LossRows of host `mask` [B,L] for `steps` unroll steps.

    Picked on the host and copied in one transfer: boolean indexing on the GPU reads the
    count back to the host, a wait on every queued kernel, once per unroll step.
    """
    row = torch.full(mask.shape, -1, dtype=torch.int64)  # shape: [B,L] -> teacher row
    row[mask] = torch.arange(int(mask.sum()))
    parts = [mask.flatten().nonzero().squeeze(1)]
    for i in range(steps):
        m = mask[:, i:]
        parts += [m.flatten().nonzero().squeeze(1), row[:, i:][m]]
    sizes = [len(p) for p in parts]
    flat = torch.cat(parts)
    if device.type == "cuda":  # page-locked: the copy does not block the host
        flat = flat.pin_memory()
    moved = flat.to(device, non_blocking=True).split(sizes)
    return LossRows(moved[0], [(moved[1 + 2 * i], moved[2 + 2 * i]) for i in range(steps)])


class TTTObjective(nn.Module):
    """The loss as a module, so DDP sees one forward per optimizer step."""

    def __init__(
        self,
        drafter: Eagle3Drafter,
        teacher: Teacher,
        *,
        steps: int,
        decay: float,
        amp: bool,
        form: LossForm = LossForm(),
        attention: str = "reference",
        fused_loss: bool = False,
    ):
        super().__init__()
        self.drafter, self.teacher = drafter, teacher
        self.steps, self.decay, self.amp = steps, decay, amp
        self.attention = attention  # config.ATTENTION: how the unroll attends
        self.temperature = form.teacher_temperature
        self.acceptance_weight = form.acceptance_weight
        # Per sample: is the target's argmax at each loss position in the draft vocabulary?
        # One full-vocabulary matmul per sample per run (memoized: it costs like a step).
        self.in_draft: dict[SampleRef, Tensor] = {}
        self.work: StepWork | None = None  # the sizes of the last forward (flops.step_flops)
        self.fused_loss = fused_loss  # training's lm_head + loss in one pass (config.LOSS)

    def _mask(self, batch: Batch) -> tuple[Tensor, int]:
        """(loss mask [B,L] on the host, rows the full-vocabulary head ran over for it)."""
        valid = batch.on_host.valid
        mask, full_rows = valid.clone(), 0  # shape: [B,L]
        new = [b for b, ref in enumerate(batch.refs) if ref not in self.in_draft]
        if new:
            # the batch's new samples in one pass and one copy to the host: a copy per sample
            # waits on every queued kernel each time
            rows = valid[new]  # shape: [n,L]
            picked = rows.flatten().nonzero().squeeze(1).to(batch.last_next.device)
            last = batch.last_next[new].flatten(0, 1)[picked]
            ok, _, _ = self.teacher.targets(last, with_lse=False)
            full_rows = ok.numel()
            for b, part in zip(new, ok.cpu().split(rows.sum(1).tolist()), strict=True):
                self.in_draft[batch.refs[b]] = part
        for b, ref in enumerate(batch.refs):
            mask[b, valid[b]] = self.in_draft[ref]
        return mask, full_rows  # the target's argmax cannot be drafted: no loss there

    def _soft_targets(self, t_logits: Tensor) -> Tensor:
        if self.temperature == 0:  # the masked positions' argmax is in the draft vocab
            return nn.functional.one_hot(t_logits.argmax(-1), t_logits.shape[-1]).float()
        return (t_logits / self.temperature).softmax(-1)

    def forward(self, batch: Batch, counts: StepCounts | None = None) -> Tensor:
        # record_function labels: where the step profile (benchmarks/) puts the time (free when off)
        with record_function("specbuild::teacher_full_vocab"):
            mask, full_rows = self._mask(batch)
            picks = loss_rows(mask, min(self.steps, mask.shape[1]), batch.last_next.device)
            last = batch.last_next.flatten(0, 1)[picks.taught]  # = last_next[mask]: [M,H]
            if counts is not None:  # metrics want the target's argmax and full-vocab logsumexp
                _, top, lse = self.teacher.targets(last)
                full_rows += top.numel()
        with record_function("specbuild::teacher_draft"):
            t_logits = self.teacher.draft_logits(last)  # shape: [M,Vd]
            t_probs = self._soft_targets(t_logits)
        device_type = batch.aux.device.type
        with (
            record_function("specbuild::unroll"),
            torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.amp),
        ):
            positions = batch.position_ids.clamp_min(0)
            hiddens = self.drafter.unroll(
                batch.input_ids, batch.aux, positions, self.steps, self.attention
            )
        # float32 whatever the features' dtype (the batch keeps the shards' bf16)
        loss, step_rows = torch.zeros((), device=batch.aux.device), []
        # training: lm_head and loss fused over row chunks (drafter/fused_loss.py); metrics
        # want each step's logits, so evaluation keeps the plain expression
        fused = counts is None and torch.is_grad_enabled()
        # the acceptance term needs each row's whole softmax, which the fused pass never holds
        fused = fused and self.fused_loss and not self.acceptance_weight
        head = self.drafter.lm_head.weight
        for i, h in enumerate(hiddens):
            at, r = picks.steps[i]  # step i at index t targets index t+i
            h = h.flatten(0, 1)[at]  # = h[mask[:, i:]]: [N_i,H]
            if fused:
                with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.amp):
                    x = self.drafter.norm(h)  # shape: [N_i,H]
                dtype = torch.bfloat16 if self.amp else head.dtype
                ce = linear_soft_cross_entropy(x, head, t_probs, r, compute_dtype=dtype)
            else:
                with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.amp):
                    logits = self.drafter.logits(h).float()  # shape: [N_i,Vd]
                ce = step_loss(t_probs[r], logits.log_softmax(-1), self.acceptance_weight)
            loss = loss + self.decay**i * ce / max(r.numel(), 1)
            step_rows.append(r.numel())
            if counts is not None:
                stats = step_counts(logits, t_logits[r], lse[r], top[r], self.teacher.draft_ids)
                counts.add(i, *stats)
        B, L = batch.input_ids.shape
        self.work = StepWork(B, L, tuple(step_rows), t_logits.shape[0], full_rows)
        return loss

    def flops(self) -> int:
        """Useful FLOPs of the last training step (`flops.step_flops`)."""
        return sum(step_flops(self.drafter.config, self.work).values())


def step_loss(p: Tensor, log_q: Tensor, acceptance_weight: float = 0.0) -> Tensor:
    """Summed over rows: soft cross-entropy of teacher `p` [N,Vd] and drafter `log_q` [N,Vd],
    with `acceptance_weight` of it moved to -log(sum_v min(p_v, q_v)) per row."""
    ce = -(p * log_q).sum()
    if not acceptance_weight:
        return ce
    accepted = torch.minimum(p, log_q.exp()).sum(-1)  # shape: [N], in [0, 1]
    # floored: a row the drafter has all but ruled out stays finite (and past the floor
    # passes no gradient; its cross-entropy share still does)
    lk = -accepted.clamp_min(1e-6).log().sum()
    return (1 - acceptance_weight) * ce + acceptance_weight * lk


@torch.no_grad()
def evaluate(
    objective: TTTObjective,
    data: ShardSet,
    refs: list[SampleRef],
    *,
    token_budget: int,
    max_length: int,
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | str = "cpu",
) -> dict:
    """Metrics over `refs` (split across DDP ranks, summed with all_reduce)."""
    counts = StepCounts.zeros(objective.steps)
    plan = plan_batches(
        [r.length for r in refs],
        token_budget=token_budget,
        max_length=max_length,
        order=BatchOrder(shuffle=False),  # every sample once, as given
        rank=rank,
        world_size=world_size,
        drop_tail=False,
    )
    for idx in plan:
        batch = data.batch([refs[i] for i in idx], max_length).to(device)
        counts.loss_sum += objective(batch, counts).item()
        counts.batches += 1
    if world_size > 1:
        flat = counts.as_tensor().to(device)
        dist.all_reduce(flat)
        counts = StepCounts.from_tensor(flat.cpu(), objective.steps)
    return counts.summary()
