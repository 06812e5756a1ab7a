"""The block drafters' loss (DFlash, DSpark) and their evaluation, over the shared batches.

A batch is in drafter alignment (`data.Batch`): index t holds input_ids x[t+1], aux g[t],
last_next last[t+1] (the target's state that predicts x[t+2]), valid = x[t+2] is a response
token. A block anchored at index s is what serving drafts right after the target emitted
x[s+1]: context g[0..s], block [x[s+1], mask, ...] at positions s+1 .., and draft d (0-based)
predicts x[s+2+d], labelled with the target's argmax at last_next[s+d] (what greedy
verification accepts) and counted where valid[s+d]. Anchors are the indices whose first
draft is a response token, `anchors` of them per sample drawn at random each step.

Loss = sum_d decay**d * mean cross-entropy of draft d, over the target's whole vocabulary
(the block reads the target's lm_head; `block.chunked_cross_entropy`). DSpark's Markov bias
for draft d reads the token before it: the anchor for d = 0, the label of d - 1 after that
(serving reads its own previous draft, which is that label whenever the block still counts).

Evaluation: a block's accepted length is 1 + its leading correct drafts, over the blocks
whose drafts all count; `acc` holds the conditional rates P(draft d right | drafts before it
right), so `simulated_acceptance_length(acc)` (eagle.chain) is that mean exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from specbuild.drafter.block import BlockDrafter, chunked_cross_entropy
from specbuild.drafter.data import Batch
from specbuild.drafter.metrics import StepCounts
from specbuild.drafter.teacher import Teacher

__all__ = ["BlockObjective", "BlockWork", "Blocks", "pick_blocks"]


@dataclass(frozen=True)
class Blocks:
    """Where a batch's blocks sit: anchors [B,N] (index s), keep [B,N] (a real block)."""

    anchors: Tensor
    keep: Tensor


@dataclass(frozen=True)
class BlockWork:
    """The sizes of the last forward, for FLOP counts: rows through the layers, context
    positions, loss rows over the full vocabulary."""

    block_rows: int
    context: int
    loss_rows: int


def pick_blocks(valid: Tensor, per_sample: int, generator: torch.Generator | None) -> Blocks:
    """Up to `per_sample` anchors per row of host `valid` [B,L], drawn without replacement
    among the indices where valid is True (all of them when there are fewer)."""
    B, _ = valid.shape
    counts = valid.sum(1)
    N = max(1, min(per_sample, int(counts.max())))
    noise = torch.rand(valid.shape, generator=generator)
    noise = noise.masked_fill(~valid, 2.0)  # invalid indices sort last
    order = noise.argsort(1)[:, :N]
    anchors = order.sort(1).values
    keep = torch.arange(N)[None] < counts.clamp(max=N)[:, None]
    return Blocks(anchors.masked_fill(~keep, 0), keep)


class BlockObjective(nn.Module):
    """The loss as a module, so DDP sees one forward per optimizer step."""

    def __init__(
        self,
        drafter: BlockDrafter,
        teacher: Teacher,
        *,
        anchors: int,
        decay: float,
        amp: bool,
        seed: int = 0,
    ):
        super().__init__()
        self.drafter, self.teacher = drafter, teacher
        self.anchors, self.decay, self.amp = anchors, decay, amp
        self.steps = drafter.config.drafts  # eval rows hold one entry per draft position
        self.generator = torch.Generator().manual_seed(seed)
        self.work: BlockWork | None = None

    def _blocks(self, batch: Batch, evaluating: bool) -> Blocks:
        valid = batch.on_host.valid
        if evaluating:  # the same anchors at every eval: one seed, not the training stream
            return pick_blocks(valid, self.anchors, torch.Generator().manual_seed(0))
        return pick_blocks(valid, self.anchors, self.generator)

    def forward(self, batch: Batch, counts: StepCounts | None = None) -> Tensor:
        cfg, d = self.drafter.config, self.drafter
        dev = batch.aux.device
        blocks = self._blocks(batch, evaluating=counts is not None)
        anchors, keep = blocks.anchors.to(dev), blocks.keep.to(dev)
        B, L = batch.input_ids.shape
        N, S, D = anchors.shape[1], cfg.block_len, cfg.drafts
        # labels: the target's argmax at every index (no gradient), as greedy verify accepts
        _, top, _ = self.teacher.targets(batch.last_next.flatten(0, 1), with_lse=False)
        labels = top.view(B, L)
        # drafts d of block n: indices s + d (past the sequence: not counted)
        idx = anchors[:, :, None] + torch.arange(D, device=dev)  # shape: [B,N,D]
        inside = idx < L
        idx_c = idx.clamp(max=L - 1)
        take = torch.gather
        counted = take(batch.valid, 1, idx_c.flatten(1)).view(B, N, D) & inside & keep[..., None]
        label = take(labels, 1, idx_c.flatten(1)).view(B, N, D)
        anchor_tok = take(batch.input_ids, 1, anchors)  # x[s+1]
        block_ids = torch.full((B, N, S), cfg.mask_token_id, dtype=torch.long, device=dev)
        block_ids[:, :, 0] = anchor_tok
        block_pos = anchors[:, :, None] + 1 + torch.arange(S, device=dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.amp):
            rows = d(batch.aux, block_ids, block_pos, anchors)  # shape: [B,N,S,H]
        rows = rows[:, :, cfg.first_row : cfg.first_row + D]  # shape: [B,N,D,H]
        prev = None
        if cfg.markov_rank:  # the token before each draft: the anchor, then the labels
            prev = torch.cat([anchor_tok[..., None], label[..., :-1]], -1)  # shape: [B,N,D]
        sel = counted.flatten()
        flat_rows = rows.reshape(-1, rows.shape[-1])[sel]
        flat_label = label.flatten()[sel]
        flat_prev = None if prev is None else prev.flatten()[sel]
        position = torch.arange(D, device=dev).expand(B, N, D).flatten()[sel]
        head = d.lm_head.weight
        bias = None if prev is None else d.markov_head
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.amp):
            ce = chunked_cross_entropy(flat_rows, head, flat_label, bias=bias, prev=flat_prev)
        n_d = torch.bincount(position, minlength=D).clamp_min(1).float()
        sums = torch.zeros(D, device=dev).index_add(0, position, ce)
        weights = self.decay ** torch.arange(D, device=dev, dtype=torch.float32)
        loss = (weights * sums / n_d).sum()
        self.work = BlockWork(B * N * S, L, int(sel.sum()))
        if counts is not None:
            self._count(counts, flat_rows, flat_label, flat_prev, counted, keep)
        return loss

    @torch.no_grad()
    def _count(self, counts, rows, labels, prev, counted, keep) -> None:
        d = self.drafter
        logits = d.logits(rows).float()
        if prev is not None:
            logits = logits + d.markov_head(prev).float()
        right = torch.zeros(counted.shape, dtype=torch.bool, device=counted.device)
        right[counted] = logits.argmax(-1) == labels
        whole = counted.all(-1) & keep  # blocks whose every draft counts
        lead = right[whole].int().cumprod(-1)  # shape: [n,D] 1 while every draft so far is right
        reached = torch.cat([torch.ones_like(lead[:, :1]), lead[:, :-1]], -1)
        for i in range(self.steps):
            counts.add(i, int(lead[:, i].sum()), 0.0, int(reached[:, i].sum()))

    def flops(self) -> int:
        """Useful FLOPs of the last training step (forward and backward: 3x the forward)."""
        w, c = self.work, self.drafter.config
        if w is None:
            return 0
        H, inter = c.hidden_size, c.intermediate_size
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        per_row = 2 * (H * (q + 2 * kv) + q * H + 3 * H * inter)  # projections and MLP
        attn = 4 * q * (w.context + c.block_len)  # scores and weighted values, per row
        layers = c.num_layers * (w.block_rows * (per_row + attn) + w.context * 2 * H * 2 * kv)
        fc = 2 * w.context * c.num_context_features * H * H
        head = 2 * w.loss_rows * H * c.vocab_size
        return 3 * (layers + fc + head)
