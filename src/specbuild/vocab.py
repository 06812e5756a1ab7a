"""Stage `vocab`: the draft vocabulary, from target tokens the drafter is trained to predict.

Counts every token whose `loss_mask` is 1 over all tokenized shards, keeps the `draft_size`
most frequent (ties broken by the smaller token id; filled with unused ids, smallest first, when
fewer distinct tokens occur, so the size is what the config says), and writes

    d2t  int64 [Vd]   target_id = draft_id + d2t[draft_id]   (draft ids sorted by target id,
                      so d2t is non-decreasing, as SGLang's EAGLE-3 path expects)
    t2d  bool  [V]    True where a target id has a draft id

to results/vocab/vocab.safetensors, and coverage numbers to results/vocab/vocab_stats.json.
The map is checked before it is written: a broken map makes SGLang propose wrong tokens, which
only shows up as a low acceptance rate.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from specbuild.eagle.target_info import read_target_info
from specbuild.hidden.tokens import check_token_meta, read_token_shard
from specbuild.infra.io import atomic_path, write_json
from specbuild.infra.safetensors_file import save_tensors

__all__ = [
    "VocabMap",
    "VocabError",
    "count_masked_tokens",
    "build_vocab_map",
    "check_vocab_map",
    "build_vocab",
]

log = logging.getLogger("specbuild")
# Coverage is also reported at these draft sizes, to show what a smaller head would keep.
COVERAGE_AT = (1024, 4096, 8192, 16384, 32000, 65536)


class VocabError(ValueError):
    """A draft vocabulary map that breaks an invariant; lists every fault."""


@dataclass(frozen=True)
class VocabMap:
    draft_ids: Tensor  # int64 [Vd], target id of each draft id, increasing
    d2t: Tensor  # int64 [Vd]
    t2d: Tensor  # bool [V]
    filler: int  # draft ids that never occurred with loss_mask 1 (padding up to draft_size)


def count_masked_tokens(paths: Iterable[str | os.PathLike], *, vocab_size: int) -> Counter[int]:
    """Counts of token ids where loss_mask is 1, over every row of every shard.

    Reads one shard at a time (memory: one shard plus a [V] count vector).
    """
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for path in paths:
        shard = read_token_shard(path, vocab_size=vocab_size)
        masked = shard.input_ids[shard.loss_mask.bool()].long()
        counts += torch.bincount(masked, minlength=vocab_size)
    nz = counts.nonzero().flatten()
    return Counter(dict(zip(nz.tolist(), counts[nz].tolist(), strict=True)))


def build_vocab_map(counts: Mapping[int, int], *, draft_size: int, target_size: int) -> VocabMap:
    """Pure: counts -> map. draft_size is capped at target_size; see the module doc for ties."""
    bad = [t for t in counts if not 0 <= t < target_size]
    if bad:
        raise VocabError(f"token ids outside [0, {target_size}): {sorted(bad)[:10]}")
    size = min(draft_size, target_size)
    ranked = sorted((t for t, c in counts.items() if c > 0), key=lambda t: (-counts[t], t))
    chosen = set(ranked[:size])
    filler = size - len(chosen)
    if filler:
        chosen.update([t for t in range(target_size) if t not in chosen][:filler])
    draft_ids = torch.tensor(sorted(chosen), dtype=torch.int64)
    t2d = torch.zeros(target_size, dtype=torch.bool)
    t2d[draft_ids] = True
    d2t = draft_ids - torch.arange(size, dtype=torch.int64)
    return VocabMap(draft_ids=draft_ids, d2t=d2t, t2d=t2d, filler=filler)


def check_vocab_map(d2t: Tensor, t2d: Tensor, *, name: str = "vocab map") -> None:
    """Raise VocabError listing every broken invariant of (d2t, t2d)."""
    faults = []
    if d2t.dtype != torch.int64 or d2t.dim() != 1:
        faults.append(f"d2t: want int64 [Vd], got {d2t.dtype} {tuple(d2t.shape)}")
    if t2d.dtype != torch.bool or t2d.dim() != 1:
        faults.append(f"t2d: want bool [V], got {t2d.dtype} {tuple(t2d.shape)}")
    if faults:
        raise VocabError(f"{name}: " + "; ".join(faults))
    targets = d2t + torch.arange(d2t.shape[0])
    if d2t.shape[0] > t2d.shape[0]:
        faults.append(f"draft vocab {d2t.shape[0]} is larger than the target's {t2d.shape[0]}")
    if bool((d2t < 0).any()):
        faults.append("d2t has negative offsets (a draft id above its target id)")
    if bool((targets >= t2d.shape[0]).any()):
        faults.append("d2t maps draft ids past the target vocabulary")
    if bool((d2t[1:] < d2t[:-1]).any()):
        faults.append("d2t decreases: draft ids are not sorted by target id")
    if int(t2d.sum()) != d2t.shape[0]:
        faults.append(f"t2d marks {int(t2d.sum())} target ids, d2t has {d2t.shape[0]}")
    elif not faults and not bool(t2d[targets].all()):
        faults.append("t2d is False for a target id that d2t maps to")
    if faults:
        raise VocabError(f"{name}: " + "; ".join(faults))


def _stats(counts: Counter[int], vmap: VocabMap, target_size: int) -> dict:
    total = sum(counts.values())
    ranked = sorted(counts.values(), reverse=True)
    covered = sum(counts.get(int(t), 0) for t in vmap.draft_ids)
    return {
        "target_vocab_size": target_size,
        "draft_vocab_size": int(vmap.d2t.shape[0]),
        "masked_tokens": total,
        "distinct_tokens": len(counts),
        "filler_ids": vmap.filler,
        "covered_tokens": covered,
        "coverage": covered / total if total else 0.0,
        "coverage_at": {
            str(k): (sum(ranked[:k]) / total if total else 0.0)
            for k in COVERAGE_AT
            if k <= target_size
        },
    }


def build_vocab(
    *,
    tokens: list[str | os.PathLike],
    metas: list[str | os.PathLike],
    fingerprint: str | os.PathLike,
    out: str | os.PathLike,
    stats_out: str | os.PathLike,
    draft_size: int = 32000,
) -> dict:
    """Count, build, check and write the vocab files; returns the stats written.

    Each tokenized shard's .meta.json (`metas`, in the same order) must name the configured
    target's tokenizer and chat template: ids from another tokenizer pick a meaningless vocabulary.
    """
    target = read_target_info(fingerprint)
    if len(metas) != len(tokens):
        raise ValueError(f"{len(tokens)} tokenized shards but {len(metas)} meta.json files")
    for meta in metas:
        check_token_meta(meta, target)
    counts = count_masked_tokens(tokens, vocab_size=target.vocab_size)
    if not counts:
        raise VocabError(f"no token with loss_mask 1 in {len(tokens)} tokenized shard(s)")
    vmap = build_vocab_map(counts, draft_size=draft_size, target_size=target.vocab_size)
    check_vocab_map(vmap.d2t, vmap.t2d, name=str(out))
    stats = _stats(counts, vmap, target.vocab_size)
    stats.update(shards=len(tokens), target_fingerprint=target.fingerprint)
    with atomic_path(out) as tmp:
        save_tensors(
            {"d2t": vmap.d2t, "t2d": vmap.t2d},
            str(tmp),
            metadata={"target_fingerprint": target.fingerprint, "draft_size": str(draft_size)},
        )
    write_json(stats_out, stats)
    log.info(
        "draft vocab %d of %d: %d masked tokens, %d distinct, coverage %.4f, %d filler ids",
        stats["draft_vocab_size"],
        target.vocab_size,
        stats["masked_tokens"],
        stats["distinct_tokens"],
        stats["coverage"],
        vmap.filler,
    )
    return stats
