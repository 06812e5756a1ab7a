"""The teacher: the target's next-token distribution, read through the target's own `lm_head`.

The shards store the target's final post-norm state `last`; lm_head(last) is exactly the
target's logits, so the teacher costs one matmul and no target forward. Restricted to the
draft vocabulary and renormalized it is the training target; positions where the target's
argmax lies outside the draft vocabulary cannot be drafted at all and are masked.
The failure guarded: a vocab map that does not fit the target (wrong size, ids out of
range, d2t and t2d disagreeing) silently trains the drafter on the wrong tokens.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import Tensor

from specbuild.eagle.text_model import find_text_model, weight_map

__all__ = ["Teacher", "read_target_weights", "read_vocab"]

_CHUNK = 1024  # rows per full-vocabulary matmul: bounds the [rows, V] logits in memory


def read_target_weights(folder: str | os.PathLike, names: list[str]) -> dict[str, Tensor]:
    """Named tensors of the target's text model, by their plain names (`model.*`,
    `lm_head.weight`), wherever the folder keeps them (`specbuild.eagle.text_model`: a multimodal
    wrapper's prefix, sharded or single file). A tied `lm_head.weight` reads the embedding.
    """
    folder = Path(folder)
    text = find_text_model(folder)
    files = weight_map(folder)
    out, missing = {}, []
    for name in names:
        key = text.tensor_name(name)
        if key not in files:
            missing.append(key)
            continue
        with safe_open(str(folder / files[key]), framework="pt") as f:
            out[name] = f.get_tensor(key)
    if missing:
        raise KeyError(
            f"{folder}: target weights lack {missing} (is this a Llama-style HF folder?)"
        )
    return out


def read_vocab(path: str | os.PathLike, *, vocab_size: int) -> tuple[Tensor, Tensor]:
    """(d2t int64 [Vd], t2d bool [V]) from vocab.safetensors, checked against each other."""
    t = load_file(str(path))
    faults = [f"missing tensor {k!r}" for k in ("d2t", "t2d") if k not in t]
    if not faults:
        d2t, t2d = t["d2t"], t["t2d"]
        if d2t.dtype != torch.int64 or d2t.dim() != 1:
            faults.append(f"d2t: {d2t.dtype} {list(d2t.shape)}, want int64 [Vd]")
        if t2d.dtype != torch.bool or tuple(t2d.shape) != (vocab_size,):
            faults.append(f"t2d: {t2d.dtype} {list(t2d.shape)}, want bool [{vocab_size}]")
        if not faults:
            ids = torch.arange(d2t.shape[0]) + d2t
            if bool((ids < 0).any() | (ids >= vocab_size).any()):
                faults.append("d2t maps draft ids outside the target vocabulary")
            elif int(t2d.sum()) != d2t.shape[0] or not bool(t2d[ids].all()):
                faults.append("t2d does not mark exactly the target ids d2t maps to")
            elif bool((ids[1:] <= ids[:-1]).any()):
                faults.append("draft ids do not map to increasing target ids")
    if faults:
        raise ValueError(f"{path}: not a vocab map for this target: " + "; ".join(faults))
    return t["d2t"], t["t2d"]


class Teacher:
    """Target logits from `last` [N,H]: full-vocab argmax/logsumexp and draft-vocab logits."""

    def __init__(self, lm_head: Tensor, d2t: Tensor, t2d: Tensor):
        self.full = lm_head  # shape: [V,H]
        self.draft_ids = torch.arange(d2t.shape[0]) + d2t  # shape: [Vd] target ids
        self.draft = lm_head[self.draft_ids].contiguous()  # shape: [Vd,H]
        self.t2d = t2d

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> Teacher:
        self.full = self.full.to(device, dtype)
        self.draft = self.draft.to(device, dtype)
        self.draft_ids, self.t2d = self.draft_ids.to(device), self.t2d.to(device)
        return self

    @torch.no_grad()
    def targets(self, last: Tensor, *, with_lse: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """(in_draft bool [N], argmax target id [N], logsumexp over the full vocab [N]).

        The logsumexp (only the metrics need it) is as costly as the matmul: skip it in training.
        """
        top, lse = [last.new_zeros(0, dtype=torch.int64)], [last.new_zeros(0)]
        for rows in last.split(_CHUNK):
            logits = rows.to(self.full.dtype) @ self.full.T  # shape: [n,V]
            top.append(logits.argmax(-1))
            lse.append(logits.float().logsumexp(-1) if with_lse else logits.new_zeros(0))
        top_ids = torch.cat(top)
        return self.t2d[top_ids], top_ids, torch.cat(lse)

    @torch.no_grad()
    def draft_logits(self, last: Tensor) -> Tensor:
        return (last.to(self.draft.dtype) @ self.draft.T).float()  # shape: [N,Vd]
