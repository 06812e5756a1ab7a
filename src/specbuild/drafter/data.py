"""Training data for the drafter: hidden-state shards read sample by sample, batched by tokens.

Shards are memory-mapped (safetensors `safe_open`) and each batch slices only its own rows, so
memory is one batch however large the data set; the page cache does the rest. Shuffling is a
seeded permutation per epoch, the held-out split a hash of each sample's (shard, index), so it
stays put when shards are appended. The failures guarded: a shard whose bytes changed after
`hidden` wrote them (flipped, truncated, a corrupt header) read as if sound, since batches read
only the rows they need (`verify_shards` + `check_verified` read every byte once before
training); and shards from different extractions (layer ids, fingerprints, widths) mixed into
one training run (`ShardSet` checks them all). Each raises once, listing every fault.

For the training loop: `read_training_data` (verified shards and the train / eval split),
`plan_epochs` and `steps_from` (which batch each step takes, also after a resume) and
`batches_ahead` (the next batch read while the current one trains).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch import Tensor
from torch.profiler import record_function

from specbuild.hidden.integrity import CHECKSUM_KEY
from specbuild.hidden.shards import (
    FP8_SCALES,
    ShardError,
    dequantize_state,
    read_header,
    shard_file_faults,
)

if TYPE_CHECKING:  # annotations only
    from specbuild.drafter.config import TrainConfig
    from specbuild.drafter.launch import Ranks
    from specbuild.eagle.target_info import TargetInfo

__all__ = [
    "SampleRef",
    "Batch",
    "ShardSet",
    "verify_shards",
    "check_verified",
    "verify_for_training",
    "split_samples",
    "split_held_out_shards",
    "BatchOrder",
    "plan_batches",
    "sample_key",
    "read_training_data",
    "plan_epochs",
    "steps_from",
    "batches_ahead",
]

# Metadata that must agree across every shard of one training run.
SHARED_META = ("layer_ids", "eagle_layer_ids", "target_fingerprint", "tokenizer_fingerprint")
MIN_TOKENS = 3  # a sample needs x_t, x_{t+1} (input) and x_{t+2} (predicted)
_OPEN_FILES = 64  # memory-mapped shards kept open at once

log = logging.getLogger("specbuild")


@dataclass(frozen=True)
class SampleRef:
    shard: int  # index into ShardSet.paths
    index: int  # sample index inside the shard
    start: int  # token span in the shard: offsets[index] .. offsets[index + 1]
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass
class Batch:
    """A padded batch in drafter alignment (see train.py): index t of a sample holds

    input_ids x[t+1], aux g[t], last_next last[t+1] (teacher for x[t+2]), valid loss_mask[t+2].
    Features keep the shards' dtype (bf16; fp8 arrives dequantized, float32): widening
    them on the host would double the bytes copied to the GPU, and the model widens them
    itself where it needs to, to the very same values.
    """

    input_ids: Tensor  # int64 [B,L]
    aux: Tensor  # bf16, or float32 from fp8 [B,L,3H]
    last_next: Tensor  # bf16, or float32 from fp8 [B,L,H]
    valid: Tensor  # bool [B,L]
    position_ids: Tensor  # int64 [B,L], -1 on padding
    refs: list[SampleRef]
    # The batch on the host this one was copied from (`to`): what the step reads of the
    # batch's layout (its token count, which rows it trains) is read there, so a step on the
    # GPU never waits for the host to read a device tensor back.
    host: Batch | None = field(default=None, repr=False, compare=False)

    @property
    def on_host(self) -> Batch:
        return self.host or self

    @property
    def num_tokens(self) -> int:
        return int((self.on_host.position_ids >= 0).sum())

    def to(self, device: torch.device | str) -> Batch:
        tensors = (self.input_ids, self.aux, self.last_next, self.valid, self.position_ids)
        moved = (t.to(device, non_blocking=True) for t in tensors)
        return Batch(*moved, refs=self.refs, host=self.on_host)


def sample_key(path: str | os.PathLike, index: int) -> str:
    """Stable name of a sample: `<dataset>/<shard>:<index>` (the results path scheme)."""
    p = Path(path)
    return f"{p.parent.name}/{p.stem}:{index}"


def verify_shards(
    paths: Sequence[str | os.PathLike],
    *,
    hidden_size: int,
    rank: int = 0,
    world_size: int = 1,
    workers: int = 1,
) -> tuple[dict[str, list[str]], list[str]]:
    """Verify this rank's share of the shards (every world_size-th): checksums, NaN/Inf, shapes,
    dtypes, offsets. Returns ({path: faults} of the broken ones, paths without checksums).

    Each file is read once, front to back, `workers` files at a time (hashing and the NaN/Inf
    count release the GIL); a shard without checksums (written before they existed) gets every
    other check.
    """
    mine = [str(p) for p in list(paths)[rank::world_size]]
    with ThreadPoolExecutor(max(1, workers)) as pool:
        results = pool.map(lambda p: shard_file_faults(p, hidden_size=hidden_size), mine)
    broken: dict[str, list[str]] = {}
    unchecked: list[str] = []
    for path, (faults, meta) in zip(mine, results, strict=True):
        if faults:
            broken[path] = faults
        elif CHECKSUM_KEY not in meta:
            unchecked.append(path)
    return broken, unchecked


def check_verified(broken: Mapping[str, list[str]], total: int) -> None:
    """Raise ShardError naming every broken shard, its faults and the fix (once, for all)."""
    if not broken:
        return
    listing = "".join(
        f"\n  {path}:" + "".join(f"\n    - {f}" for f in faults)
        for path, faults in sorted(broken.items())
    )
    raise ShardError(
        f"{len(broken)} of {total} hidden-state shard(s) failed verification; training did not "
        f"start:{listing}\nFix: delete each listed shard and rerun snakemake (its `hidden` job "
        f"rebuilds it), or force those jobs: snakemake --forcerun {' '.join(sorted(broken))}"
    )


def verify_for_training(
    paths: Sequence[str | os.PathLike],
    *,
    hidden_size: int,
    rank: int = 0,
    world_size: int = 1,
    workers: int = 1,
) -> None:
    """Every shard read whole once before any step (ranks split the files and share their
    faults): raise ShardError listing every broken shard; log what was checked, and warn
    naming the shards that carry no checksums."""
    clock = time.perf_counter()
    broken, unchecked = verify_shards(
        paths, hidden_size=hidden_size, rank=rank, world_size=world_size, workers=workers
    )
    if world_size > 1:
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, (broken, unchecked))
        broken = {k: v for b, _ in gathered for k, v in b.items()}
        unchecked = sorted(p for _, u in gathered for p in u)
    check_verified(broken, len(paths))
    if rank:
        return
    gb, elapsed = sum(os.path.getsize(p) for p in paths) / 1e9, time.perf_counter() - clock
    log.info(
        "verified %d hidden-state shard(s), %.2f GB in %.1f s (%d rank(s)): checksums, NaN/Inf, "
        "shapes, offsets",
        len(paths),
        gb,
        elapsed,
        world_size,
    )
    if unchecked:
        log.warning(
            "%d of %d shard(s) carry no checksums (written before specbuild recorded them), "
            "first %s: their values, shapes and offsets passed, but a changed byte that stays "
            "finite cannot be seen. Rerun their `hidden` jobs to add checksums: "
            "snakemake --forcerun %s",
            len(unchecked),
            len(paths),
            unchecked[0],
            " ".join(unchecked),
        )


class ShardSet:
    """Every sample of a list of hidden-state shards, checked for consistency up front."""

    def __init__(
        self,
        paths: Sequence[str | os.PathLike],
        *,
        hidden_size: int,
        target_fingerprint: str | None = None,
    ):
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise ValueError("no hidden-state shards given to train on")
        self._files: OrderedDict[int, object] = OrderedDict()
        self._lock = threading.Lock()
        faults: list[str] = []
        metas: list[dict[str, str]] = []
        self.refs: list[SampleRef] = []
        self.skipped = 0  # samples too short or without a single predicted response token
        for i, path in enumerate(self.paths):
            header, meta = read_header(path)
            metas.append(meta)
            aux, last = header.get("aux"), header.get("last")
            if last is None or aux is None or "offsets" not in header:
                faults.append(f"{path}: missing aux/last/offsets tensors")
                continue
            if last[1][1] != hidden_size or aux[1][1] != 3 * hidden_size:
                faults.append(
                    f"{path}: aux {aux[1]} / last {last[1]}, the target's hidden size is "
                    f"{hidden_size} (want [T, {3 * hidden_size}] / [T, {hidden_size}])"
                )
            if target_fingerprint and meta.get("target_fingerprint") != target_fingerprint:
                faults.append(
                    f"{path}: target_fingerprint {meta.get('target_fingerprint')!r} is not the "
                    f"target's {target_fingerprint!r} (extracted from another model)"
                )
            f = self._open(i)
            offsets = f.get_tensor("offsets").tolist()
            mask = f.get_tensor("loss_mask")
            for j, (s, e) in enumerate(zip(offsets[:-1], offsets[1:], strict=True)):
                if e - s < MIN_TOKENS or not bool(mask[s + 2 : e].any()):
                    self.skipped += 1
                    continue
                self.refs.append(SampleRef(i, j, s, e))
        for key in SHARED_META:
            seen = {m.get(key) for m in metas}
            if len(seen) > 1:
                faults.append(f"metadata {key!r} differs between shards: {sorted(map(str, seen))}")
        if not self.refs and not faults:
            faults.append("no sample with a predicted response token (>= 3 tokens, loss_mask)")
        if faults:
            raise ValueError(
                f"hidden-state shards cannot train one drafter ({len(faults)} fault(s)):\n  - "
                + "\n  - ".join(faults)
                + "\nFix: re-extract the listed shards with the current target and config."
            )
        self.meta = metas[0]
        self.layer_ids: list[int] = json.loads(self.meta["layer_ids"])
        # the eagle_config ids serving needs (shards from before they were recorded: None)
        eagle = self.meta.get("eagle_layer_ids")
        self.eagle_layer_ids: list[int] | None = json.loads(eagle) if eagle else None

    def _open(self, shard: int):
        with self._lock:  # the trainer's loader thread and its eval share the cache
            f = self._files.pop(shard, None) or safe_open(str(self.paths[shard]), framework="pt")
            self._files[shard] = f
            while len(self._files) > _OPEN_FILES:
                self._files.popitem(last=False)
            return f

    def key(self, ref: SampleRef) -> str:
        return sample_key(self.paths[ref.shard], ref.index)

    def load(self, ref: SampleRef, max_length: int) -> dict[str, Tensor]:
        """One sample, cut to its first `max_length` tokens; aux/last as stored (fp8 ones
        dequantized to float32; an fp8 shard from before `last` went fp8 keeps a bf16 last)."""
        f = self._open(ref.shard)
        s, e = ref.start, min(ref.end, ref.start + max_length)
        keys = set(f.keys())
        rows = {k: f.get_slice(k)[s:e] for k in (*FP8_SCALES, *FP8_SCALES.values()) if k in keys}
        return {
            "input_ids": f.get_slice("input_ids")[s:e].long(),
            "loss_mask": f.get_slice("loss_mask")[s:e].bool(),
            "aux": dequantize_state(rows, "aux") if "aux_scale" in rows else rows["aux"],
            "last": dequantize_state(rows, "last") if "last_scale" in rows else rows["last"],
        }

    def batch(
        self, refs: Sequence[SampleRef], max_length: int, *, pin_memory: bool = False
    ) -> Batch:
        """Shift each sample into drafter alignment and right-pad to the longest.

        `pin_memory` (CUDA only): page-locked tensors, so `Batch.to(cuda)` copies without
        blocking the host.
        """
        samples = [self.load(r, max_length) for r in refs]
        L = max(s["input_ids"].shape[0] for s in samples) - 1
        B, H = len(samples), samples[0]["last"].shape[1]

        def common(key: str) -> torch.dtype:  # a run may mix bf16 and fp8 shards
            return functools.reduce(torch.promote_types, (s[key].dtype for s in samples))

        pin = {"pin_memory": pin_memory}
        out = Batch(
            input_ids=torch.zeros(B, L, dtype=torch.int64, **pin),
            aux=torch.zeros(B, L, 3 * H, dtype=common("aux"), **pin),
            last_next=torch.zeros(B, L, H, dtype=common("last"), **pin),
            valid=torch.zeros(B, L, dtype=torch.bool, **pin),
            position_ids=torch.full((B, L), -1, dtype=torch.int64, **pin),
            refs=list(refs),
        )
        for b, s in enumerate(samples):
            n = s["input_ids"].shape[0] - 1  # shape: index t = 0 .. n-1
            out.input_ids[b, :n] = s["input_ids"][1:]  # x[t+1]
            out.aux[b, :n] = s["aux"][:-1]  # g[t]
            out.last_next[b, :n] = s["last"][1:]  # last[t+1] -> distribution of x[t+2]
            out.valid[b, : n - 1] = s["loss_mask"][2:]  # x[t+2] is a response token
            out.position_ids[b, :n] = torch.arange(n)
        return out


def split_samples(keys: Sequence[str], eval_fraction: float) -> tuple[list[int], list[int]]:
    """(train, eval) indices: a sample is held out when its key hashes below the fraction.

    A hash, not a permutation, so adding shards never moves an old sample across the split.
    With eval_fraction 0 the training samples double as the eval set (an overfit check).
    A set too small for the fraction to pick anyone (a handful of samples) holds out its one
    lowest-hashing sample, so that a first run on a few records trains and evaluates.
    """
    scores = [int.from_bytes(hashlib.sha256(k.encode()).digest()[:8], "big") / 2**64 for k in keys]
    train = [i for i, h in enumerate(scores) if h >= eval_fraction]
    held = [i for i, h in enumerate(scores) if h < eval_fraction]
    if eval_fraction == 0:
        return train, list(train)
    if len(keys) < 2:
        raise ValueError(
            f"{len(keys)} sample(s) to train on: a held-out split needs at least 2 (add data, "
            "or set train.eval_fraction: 0 to evaluate on the training samples)"
        )
    if not held or not train:
        lowest = min(range(len(keys)), key=scores.__getitem__)
        log.warning(
            "train.eval_fraction %s picks %d of %d samples by hash; holding out the one "
            "lowest-hashing sample instead",
            eval_fraction,
            len(held),
            len(keys),
        )
        train, held = [i for i in range(len(keys)) if i != lowest], [lowest]
    return train, held


def split_held_out_shards(
    shard_of: Sequence[int], held_out: set[int], name: str
) -> tuple[list[int], list[int]]:
    """(train, eval) indices when a whole held-out set is the eval set (`train.eval_set`):
    sample i is held out exactly when its shard `shard_of[i]` is one of `held_out`."""
    train = [i for i, s in enumerate(shard_of) if s not in held_out]
    held = [i for i, s in enumerate(shard_of) if s in held_out]
    if not train or not held:
        raise ValueError(
            f"eval set {name!r} leaves {len(train)} training and {len(held)} held-out samples "
            "(with >= 3 tokens and a response token); both must be non-empty"
        )
    return train, held


GROUP_SAMPLES = 1024  # group_by_length: samples sorted together (a shuffled window)


@dataclass(frozen=True)
class BatchOrder:
    """The order samples fill batches in: a permutation seeded by (seed, epoch) when
    `shuffle`, else as given (evaluation)."""

    seed: int = 0
    epoch: int = 0
    shuffle: bool = True
    group_by_length: bool = False  # batches of like-length samples, then shuffled


def plan_batches(
    lengths: Sequence[int],
    *,
    token_budget: int,
    max_length: int,
    order: BatchOrder,
    rank: int = 0,
    world_size: int = 1,
    drop_tail: bool = True,
) -> list[list[int]]:
    """Batches (lists of positions into `lengths`) for one rank in one epoch.

    Order: `order` (a permutation seeded by (seed, epoch)); batches fill greedily until
    size x longest > token_budget. Every rank plans the same list and takes every
    world_size-th batch; for training (`drop_tail`) the tail that does not divide evenly is
    dropped so DDP ranks step together.

    `order.group_by_length`: each window of GROUP_SAMPLES samples of the permutation is sorted
    by length before batches fill, so a batch holds samples of like length (a batch is padded
    to its longest), and the batches are then shuffled (seeded likewise): what a step sees
    stays random, its padding shrinks.
    """
    seed, epoch = order.seed, order.epoch
    shuffle, group_by_length = order.shuffle, order.group_by_length
    positions = list(range(len(lengths)))
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    if shuffle:
        positions = torch.randperm(len(lengths), generator=g).tolist()
    if group_by_length:
        clipped = [min(n, max_length) for n in lengths]
        windows = [
            positions[i : i + GROUP_SAMPLES] for i in range(0, len(positions), GROUP_SAMPLES)
        ]
        # stable: like lengths keep the permutation's order
        positions = [i for w in windows for i in sorted(w, key=lambda j: -clipped[j])]
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in positions:
        n = min(lengths[i], max_length)
        if cur and (len(cur) + 1) * max(longest, n) > token_budget:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    if group_by_length and shuffle:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
    usable = len(batches) // world_size * world_size if drop_tail else len(batches)
    return batches[rank:usable:world_size]


def read_training_data(
    cfg: TrainConfig, shards: list[str], held_out: list[str], info: TargetInfo, ranks: Ranks
) -> tuple[ShardSet, list[SampleRef], list[SampleRef]]:
    """Every shard verified, then (the samples, training samples, eval samples): those of the
    held-out eval set's shards where given, else the `eval_fraction` split of the samples."""
    verify_for_training(
        shards + held_out,
        hidden_size=info.hidden_size,
        rank=ranks.rank,
        world_size=ranks.world,
        workers=torch.get_num_threads(),
    )
    data = ShardSet(
        shards + held_out, hidden_size=info.hidden_size, target_fingerprint=info.fingerprint
    )
    if held_out:  # train.eval_set: its shards follow the training shards in `data`
        train_idx, eval_idx = split_held_out_shards(
            [r.shard for r in data.refs], set(range(len(shards), len(data.paths))), cfg.eval_set
        )
    else:
        train_idx, eval_idx = split_samples([data.key(r) for r in data.refs], cfg.eval_fraction)
    return data, [data.refs[i] for i in train_idx], [data.refs[i] for i in eval_idx]


def plan_epochs(cfg: TrainConfig, refs: list[SampleRef], ranks: Ranks) -> list[list[list[int]]]:
    """Each epoch's batches of this rank (`plan_batches`): lists of indices into `refs`."""
    plans = [
        plan_batches(
            [r.length for r in refs],
            token_budget=cfg.token_budget,
            max_length=cfg.max_length,
            order=BatchOrder(seed=cfg.seed, epoch=e, group_by_length=cfg.group_by_length),
            rank=ranks.rank,
            world_size=ranks.world,
        )
        for e in range(cfg.epochs)
    ]
    if not any(plans):
        raise ValueError(f"{len(refs)} training samples make no batch for {ranks.world} rank(s)")
    return plans


def steps_from(plans: list[list[list[int]]], epoch: int, batch: int) -> list[tuple[int, int]]:
    """(epoch, batch) of every step from batch `batch` of epoch `epoch` on: the whole run from
    (0, 0), the rest of a resumed one from its checkpoint's position."""
    return [
        (e, b)
        for e in range(epoch, len(plans))
        for b in range(batch if e == epoch else 0, len(plans[e]))
    ]


def batches_ahead(
    load: Callable[[int, int], Batch], order: Sequence[tuple[int, int]]
) -> Iterator[Batch]:
    """Yield load(epoch, b) for each (epoch, b) of `order`, the next one loading in a thread
    while the caller trains on this one: reading shards and padding a batch takes the host
    long enough that the GPU would otherwise wait for it at every step."""

    def load_labelled(epoch: int, b: int) -> Batch:
        with record_function("specbuild::prefetch"):  # the step profile leaves it out
            return load(epoch, b)

    pool = ThreadPoolExecutor(1, thread_name_prefix="batches")
    try:
        ahead = pool.submit(load_labelled, *order[0]) if order else None
        for k in range(len(order)):
            batch = ahead.result()
            ahead = pool.submit(load_labelled, *order[k + 1]) if k + 1 < len(order) else None
            yield batch
    finally:  # also when the caller stops early (an exception): one batch at most to wait for
        pool.shutdown(wait=True, cancel_futures=True)
