"""Tokenized shards as the hidden stage reads them: flat tensors plus the consistency gate.

The gate is the check the whole project exists for: rows tokenized with one tokenizer or chat
template and features extracted from a target with another train a drafter that is silently
useless. `check_token_meta` compares the tokenized shard's .meta.json with the target's
fingerprint.json and says which side to rebuild.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from specbuild.eagle.target_info import TargetInfo
from specbuild.infra.io import read_json, read_jsonl

__all__ = ["TokenShard", "TokenizedShardError", "read_token_shard", "check_token_meta", "meta_path"]

# (meta.json key, fingerprint.json field, what it guards)
GATED_FIELDS = (
    ("tokenizer_fingerprint", "tokenizer_fingerprint", "tokenizer"),
    ("chat_template_sha256", "chat_template_sha256", "chat template"),
    ("target_fingerprint", "fingerprint", "target (weights + tokenizer + template)"),
)


class TokenizedShardError(ValueError):
    """A tokenized shard that cannot feed extraction; the message lists every fault and the fix."""


@dataclass(frozen=True)
class TokenShard:
    """One tokenized shard, flattened: sample i spans offsets[i]:offsets[i+1]."""

    path: str
    ids: list[str]
    input_ids: Tensor  # int32 [T]
    loss_mask: Tensor  # uint8 [T]
    offsets: Tensor  # int64 [N+1]

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def sample(self, i: int) -> list[int]:
        return self.input_ids[self.offsets[i] : self.offsets[i + 1]].tolist()


def meta_path(tokens_path: str | os.PathLike) -> Path:
    """results/tokenized/{dataset}/{shard}.jsonl -> results/tokenized/{dataset}/{shard}.meta.json"""
    p = Path(tokens_path)
    return p.with_name(p.name.removesuffix(".jsonl") + ".meta.json")


def read_token_shard(path: str | os.PathLike, *, vocab_size: int) -> TokenShard:
    """Read and validate every row of a tokenized shard; raise once listing each bad line."""
    faults: list[str] = []
    ids: list[str] = []
    input_ids: list[int] = []
    loss_mask: list[int] = []
    offsets = [0]
    for lineno, row in enumerate(read_jsonl(path), 1):
        where = f"line {lineno}"
        missing = [k for k in ("id", "input_ids", "loss_mask", "seq_len") if k not in row]
        if missing:
            faults.append(f"{where}: missing key(s) {missing}")
            continue
        toks, mask, n = row["input_ids"], row["loss_mask"], row["seq_len"]
        if not (len(toks) == len(mask) == n) or n < 1:
            faults.append(
                f"{where} (id {row['id']}): len(input_ids)={len(toks)}, len(loss_mask)="
                f"{len(mask)}, seq_len={n}; they must be equal and >= 1"
            )
            continue
        bad_ids = [t for t in toks if not (isinstance(t, int) and 0 <= t < vocab_size)]
        if bad_ids:
            faults.append(
                f"{where} (id {row['id']}): token ids outside [0, {vocab_size}): {bad_ids[:5]}"
            )
        if any(m not in (0, 1) for m in mask):
            faults.append(f"{where} (id {row['id']}): loss_mask values must be 0 or 1")
        ids.append(str(row["id"]))
        input_ids.extend(toks)
        loss_mask.extend(mask)
        offsets.append(offsets[-1] + n)
    if not ids and not faults:
        faults.append("no rows (an empty tokenized shard cannot make a hidden-state shard)")
    if faults:
        raise TokenizedShardError(
            f"{path}: {len(faults)} bad row(s):\n  - " + "\n  - ".join(faults) + "\n"
            "Fix: rebuild this tokenized shard (snakemake --forcerun tokenize)."
        )
    return TokenShard(
        path=str(path),
        ids=ids,
        input_ids=torch.tensor(input_ids, dtype=torch.int32),
        loss_mask=torch.tensor(loss_mask, dtype=torch.uint8),
        offsets=torch.tensor(offsets, dtype=torch.int64),
    )


def check_token_meta(
    meta_json: str | os.PathLike, target: TargetInfo, *, rows: int | None = None
) -> dict:
    """The consistency gate: the tokenized shard must come from the configured target.

    Returns the parsed meta. Raises TokenizedShardError naming each differing field, both
    values, and which side to rebuild.
    """
    meta = read_json(meta_json)
    faults: list[str] = []
    for key, field, what in GATED_FIELDS:
        have, want = meta.get(key), getattr(target, field)
        if have is None:
            faults.append(f"{key}: missing (the {what} that tokenized these rows is unknown)")
        elif have != want:
            faults.append(
                f"{key}: tokenized with {what} {str(have)[:16]}..., but the configured target "
                f"{target.name!r} has {str(want)[:16]}..."
            )
    if rows is not None and meta.get("rows") is not None and int(meta["rows"]) != rows:
        faults.append(f"rows: meta.json says {meta['rows']}, the shard holds {rows}")
    if faults:
        raise TokenizedShardError(
            f"{meta_json}: tokenized rows do not match the target used for extraction:\n  - "
            + "\n  - ".join(faults)
            + "\nFix: the configured target is the reference. Rebuild the tokenized side with it "
            "(snakemake --forcerun generate tokenize, or delete results/tokenized/ and "
            "results/generated/), or set target.source back to the model that produced these rows."
        )
    return meta
