"""Stage `hidden`, its core: one tokenized shard in, one hidden-state shard out, with an engine
already loaded (the job's entry, hidden.extract, picks the job's own or a kept one).

    tokenized shard (.jsonl + .meta.json) + target fingerprint.json
      -> consistency gate (tokenizer, chat template, target fingerprint)
      -> batches by token budget -> FeatureBackend.extract (packed states on its device)
      -> bf16 or fp8 on that device -> copied behind the compute into the shard file's own
         pages (writer.py: the file is sized up front and mapped; no separate host buffers)
      -> checksums and NaN/Inf counts on every core -> check_shard (shapes, dtypes, NaN/Inf,
         offsets and token ids vs the tokenized shard, fingerprints) -> renamed into place

Memory stays at a few batches of activations on the device and a few pinned staging slots on
the host, whatever the shard's size: the shard itself lives in the page cache, which the
kernel writes back as it goes. A shard whose file would not fit on disk is refused before any
model loads.

A backend is chosen at construction (`hf` and `sglang`, each in its own module, named in
engines.registry) and implements only the forward pass; batching, storage, copies, checks and
writing are written once, here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

import specbuild
from specbuild.eagle.layers import AUX_LAYERS, default_layer_ids
from specbuild.eagle.target_info import TargetInfo, read_target_info
from specbuild.engines.model import FeatureBackend, Features, ModelSpec
from specbuild.hidden.fp8 import parse_storage, quantize_fp8, scale_groups
from specbuild.hidden.hostcopy import HostCopier, Landed
from specbuild.hidden.shards import (
    FP8_SCALES,
    LAYERS,
    STORAGE_DTYPES,
    check_shard,
    layout_nbytes,
    shard_layout,
    state_nbytes_per_token,
)
from specbuild.hidden.tokens import TokenShard, check_token_meta, read_token_shard
from specbuild.hidden.writer import Layout, shard_writer
from specbuild.infra.disk import ensure_free_space

__all__ = [
    "ExtractRequest",
    "ExtractStats",
    "ShardFiles",
    "ShardFormat",
    "ShardInputs",
    "Written",
    "extract_features",
    "extract_with",
    "plan_forward_batches",
    "read_shard_inputs",
    "resolve_layer_ids",
    "resolve_request",
    "run_kept_shard",
    "write_features",
]

log = logging.getLogger("specbuild")

# A batch takes a sample only if it is at least (1 - MAX_PADDING) as long as the batch's longest,
# so at most 20% of the computed tokens are pads. Filling the budget with short samples instead
# pads them to the longest: 8 random lengths in 64..256 in one batch computed 39% pads.
MAX_PADDING = 0.2


@dataclass(frozen=True)
class ExtractStats:
    samples: int
    tokens: int
    padded_tokens: int
    batches: int
    seconds: float
    file_bytes: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    @property
    def bytes_per_token(self) -> float:
        return self.file_bytes / max(self.tokens, 1)


class Written(NamedTuple):
    """What `extract_features` (seal_s 0) and `write_features` did, and where the caller's
    thread spent its time."""

    batches: int
    padded_tokens: int  # tokens computed, pads included
    forward_s: float  # in the backend's extract (on a GPU: launching it, and its syncs)
    wait_s: float  # blocked on the host copies (the ring of staging slots was full)
    seal_s: float = 0.0  # after the last batch: the checksums left, NaN/Inf counts, checks


def resolve_layer_ids(configured: list[int], num_layers: int) -> list[int]:
    """`configured` as given, or the EAGLE-3 default when empty; checked against the target."""
    ids = list(configured) or default_layer_ids(num_layers)
    if (
        len(ids) != AUX_LAYERS
        or any(not 0 <= i < num_layers for i in ids)
        or any(a >= b for a, b in zip(ids, ids[1:], strict=False))
    ):
        raise ValueError(
            f"hidden.layer_ids {ids}: want {AUX_LAYERS} increasing layer-output ids in "
            f"[0, {num_layers - 1}] (low, mid, high) for this {num_layers}-layer target, "
            f"or [] for the default {default_layer_ids(num_layers)}"
        )
    return ids


def plan_forward_batches(
    lengths: list[int], batch_tokens: int, max_padding: float = MAX_PADDING
) -> list[list[int]]:
    """Sample indices grouped so that each padded batch (n * longest) fits `batch_tokens` and
    pads at most `max_padding` of it.

    Longest first, so that each batch holds similar lengths and a sample longer than the budget
    runs alone rather than failing. Deterministic: ties keep input order.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        # sorted descending: the batch's first sample is its longest
        longest = lengths[batches[-1][0]] if batches else 0
        fits = batches and (len(batches[-1]) + 1) * longest <= batch_tokens
        if fits and lengths[i] >= (1 - max_padding) * longest:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def _stored(features: Features, storage: str, groups: int) -> dict[str, Tensor]:
    """The batch's tensors in their on-disk dtypes, converted where they are (the GPU halves
    or quarters what crosses to the host); fp8 with `groups` scales per token and layer."""
    if storage != "fp8":
        return {"aux": features.aux.to(torch.bfloat16), "last": features.last.to(torch.bfloat16)}
    out = {}
    for key, layers in LAYERS.items():
        out[key], out[FP8_SCALES[key]] = quantize_fp8(getattr(features, key), layers * groups)
    return out


def _spans(batch: list[int], lengths: list[int], offsets: list[int]) -> list[tuple[slice, slice]]:
    """(rows in the packed batch, rows in the shard) per sample; runs of samples adjacent in
    both merge into one copy."""
    spans: list[tuple[slice, slice]] = []
    row = 0
    for i in batch:
        n = lengths[i]
        if spans and spans[-1][0].stop == row and spans[-1][1].stop == offsets[i]:
            src, dst = spans.pop()
            spans.append((slice(src.start, row + n), slice(dst.start, offsets[i] + n)))
        else:
            spans.append((slice(row, row + n), slice(offsets[i], offsets[i] + n)))
        row += n
    return spans


def extract_features(
    tokens: TokenShard,
    backend: FeatureBackend,
    fmt: ShardFormat,
    *,
    out: Mapping[str, Tensor],
    batch_tokens: int = 2048,
    landed: Landed | None = None,
) -> Written:
    """Fill out["aux"], out["last"] (and their scales for fp8), host tensors of the shard's
    layout, with `backend`'s states of every sample of `tokens`, telling `landed` (key, rows)
    as rows are final."""
    hidden_size, storage = fmt.hidden_size, fmt.storage
    if storage not in STORAGE_DTYPES:
        raise ValueError(f"hidden.storage {storage!r}: choose one of {sorted(STORAGE_DTYPES)}")
    groups = scale_groups(hidden_size, fmt.fp8_group_size) if storage == "fp8" else 0
    offsets = tokens.offsets.tolist()
    lengths = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    copier = HostCopier(backend.device, landed=landed)
    batches = plan_forward_batches(lengths, batch_tokens)
    widths = {"aux": AUX_LAYERS * hidden_size, "last": hidden_size}
    padded, forward_s = 0, 0.0
    try:
        for b, batch in enumerate(batches, 1):
            want = [lengths[i] for i in batch]
            samples = [tokens.sample(i) for i in batch]
            start = time.perf_counter()
            features = backend.extract(samples)
            forward_s += time.perf_counter() - start
            padded += len(batch) * want[0]
            got = {k: tuple(getattr(features, k).shape) for k in widths}
            if list(features.lengths) != want or any(
                got[k] != (sum(want), w) for k, w in widths.items()
            ):
                first = tokens.ids[batch[0]]
                raise RuntimeError(
                    f"backend {backend.name!r}, batch of {len(batch)} samples from {first!r}: "
                    f"got lengths {list(features.lengths)[:8]}, aux {got['aux']}, last "
                    f"{got['last']}; expected lengths {want[:8]}, aux [{sum(want)}, "
                    f"{widths['aux']}], last [{sum(want)}, {widths['last']}]"
                )
            stored = _stored(features, storage, groups)
            copier.copy(stored, _spans(batch, lengths, offsets), out)
            if b % 20 == 0 or b == len(batches):
                log.info("batch %d/%d done", b, len(batches))
    finally:
        copier.finish()  # also on error: no copy may still write into a file being deleted
    return Written(len(batches), padded, forward_s, copier.wait_s)


def write_features(
    path: str | os.PathLike,
    tokens: TokenShard,
    backend: FeatureBackend,
    meta: Mapping[str, str],
    fmt: ShardFormat,
    *,
    batch_tokens: int = 2048,
    expected_meta: Mapping[str, str] | None = None,
) -> Written:
    """Extract every sample of `tokens` straight into the shard file `path` (writer.py), check
    it (check_shard) and publish it. A shard that fails the check raises ShardError and leaves
    nothing at `path`."""
    layout = fmt.layout(tokens.num_tokens, len(tokens))
    with shard_writer(path, layout, meta) as shard:
        for key in ("input_ids", "loss_mask", "offsets"):
            shard.tensors[key].copy_(getattr(tokens, key))
            shard.landed(key, slice(0, len(shard.tensors[key])))
        done = extract_features(
            tokens, backend, fmt, out=shard.tensors, batch_tokens=batch_tokens, landed=shard.landed
        )
        sealing = time.perf_counter()
        scan = shard.seal()
        check_shard(
            shard.tensors,
            shard.meta,
            name=path,
            hidden_size=fmt.hidden_size,
            tokens=tokens,
            expected_meta=expected_meta,
            nonfinite=scan.nonfinite,
        )
        seal_s = time.perf_counter() - sealing
    return done._replace(seal_s=seal_s)


@dataclass(frozen=True)
class ShardFormat:
    """How a shard's states are stored: their width, and bf16 or fp8 with its scale groups."""

    hidden_size: int
    storage: str = "bf16"  # bf16 or fp8 (hidden.storage parsed: fp8-g<N> is fp8, group N)
    fp8_group_size: int = 0  # 0: one scale per token and layer

    def layout(self, tokens: int, samples: int) -> Layout:
        """The tensors of a shard of `tokens` tokens in `samples` samples in this format."""
        return shard_layout(
            tokens=tokens,
            samples=samples,
            hidden_size=self.hidden_size,
            storage=self.storage,
            fp8_group_size=self.fp8_group_size,
        )


@dataclass(frozen=True)
class ShardFiles:
    """A hidden job's files: its tokenized shard and that shard's meta, the target's
    fingerprint.json (beside the target's HF folder), and the shard it writes."""

    tokens: str | os.PathLike
    meta: str | os.PathLike
    fingerprint: str | os.PathLike
    out: str | os.PathLike

    def resolved(self, out: str | os.PathLike | None = None) -> ShardFiles:
        """Absolute paths (a keeper runs in another working directory), `out` replaced."""
        return ShardFiles(
            *(str(Path(p).resolve()) for p in (self.tokens, self.meta, self.fingerprint)),
            out=str(Path(self.out if out is None else out).resolve()),
        )


@dataclass(frozen=True)
class ExtractRequest:
    """What a shard is made from and how it is written, with its layer ids resolved against
    the target once: the job's own engine runs it as it is, a kept one gets it whole."""

    files: ShardFiles
    layer_ids: list[int]  # resolved: three increasing layer-output ids
    storage: str = "bf16"  # hidden.storage as configured (bf16, fp8, fp8-g<N>)
    batch_tokens: int = 2048
    threads: int | None = None  # the job's Snakemake `threads:`

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, fields: Mapping[str, Any]) -> ExtractRequest:
        return cls(**{**fields, "files": ShardFiles(**fields["files"])})


@dataclass(frozen=True)
class ShardInputs:
    """A shard's checked inputs: what `extract_with` needs beside the engine."""

    target: TargetInfo
    layer_ids: list[int]  # resolved against the target
    tokens: TokenShard
    fmt: ShardFormat


def resolve_request(
    files: ShardFiles,
    *,
    layer_ids: list[int] | None = None,
    storage: str = "bf16",
    batch_tokens: int = 2048,
    threads: int | None = None,
) -> ExtractRequest:
    """The request of a shard, its configured layer ids ([]: the EAGLE-3 default) resolved
    against the target `files.fingerprint` names."""
    target = read_target_info(files.fingerprint)
    ids = resolve_layer_ids(layer_ids or [], target.num_hidden_layers)
    return ExtractRequest(files, ids, storage, batch_tokens, threads)


def read_shard_inputs(request: ExtractRequest) -> ShardInputs:
    """Read and check everything a shard is made from, and that its file fits on disk at
    `request.files.out`: all of it before any model loads."""
    files = request.files
    storage, fp8_group_size = parse_storage(request.storage)
    target = read_target_info(files.fingerprint)
    shard = read_token_shard(files.tokens, vocab_size=target.vocab_size)
    check_token_meta(files.meta, target, rows=len(shard))
    fmt = ShardFormat(target.hidden_size, storage, fp8_group_size)
    nbytes = layout_nbytes(fmt.layout(shard.num_tokens, len(shard)))
    ensure_free_space(
        files.out,
        nbytes,
        "a hidden-state shard",
        hint=(
            "halve the hidden states with hidden.storage: fp8"
            if storage == "bf16"
            else "use smaller shards (datasets.<name>.shard_size)"
        ),
    )
    log.info(
        "%s: %d samples, %d tokens; layer ids %s, storage %s (~%.2f GB on disk)",
        files.tokens,
        len(shard),
        shard.num_tokens,
        request.layer_ids,
        storage,
        nbytes / 1e9,
    )
    return ShardInputs(target, list(request.layer_ids), shard, fmt)


def extract_with(
    engine: FeatureBackend,
    inputs: ShardInputs,
    *,
    out: str | os.PathLike,
    batch_tokens: int = 2048,
) -> ExtractStats:
    """Extract, verify and publish `out` with a loaded `engine`: the shard code of both the
    job's own engine and a kept one."""
    target, shard = inputs.target, inputs.tokens
    shard_meta = {
        "layer_ids": json.dumps(inputs.layer_ids),
        "eagle_layer_ids": json.dumps(engine.eagle_layer_ids),
        "backend": engine.name,
        "target_fingerprint": target.fingerprint,
        "tokenizer_fingerprint": target.tokenizer_fingerprint,
        "chat_template_sha256": target.chat_template_sha256,
        "dtype": inputs.fmt.storage,
        "compute_dtype": engine.dtype,
        "specbuild_version": specbuild.__version__,
    }
    start = time.perf_counter()
    written = write_features(
        out,
        shard,
        engine,
        shard_meta,
        inputs.fmt,
        batch_tokens=batch_tokens,
        expected_meta={k: shard_meta[k] for k in ("target_fingerprint", "tokenizer_fingerprint")},
    )
    seconds = time.perf_counter() - start
    stats = ExtractStats(
        samples=len(shard),
        tokens=shard.num_tokens,
        padded_tokens=written.padded_tokens,
        batches=written.batches,
        seconds=seconds,
        file_bytes=os.path.getsize(out),
    )
    log.info(
        "wrote %s: %d tokens in %d batches (%.1f%% padding), %.1f tokens/s in %.1f s (in the "
        "backend %.1f s, waiting for host copies %.1f s, checksums and checks after the last "
        "batch %.2f s); %.0f bytes/token on disk (aux and last %d; one-file-per-sample bf16 "
        "format: %d)",
        out,
        stats.tokens,
        stats.batches,
        100 * (1 - stats.tokens / max(stats.padded_tokens, 1)),
        stats.tokens_per_s,
        stats.seconds,
        written.forward_s,
        written.wait_s,
        written.seal_s,
        stats.bytes_per_token,
        state_nbytes_per_token(target.hidden_size, inputs.fmt.storage, inputs.fmt.fp8_group_size),
        8 * target.hidden_size,
    )
    return stats


def run_kept_shard(
    engine: FeatureBackend, spec: ModelSpec, request: Mapping[str, Any], tag: str
) -> dict[str, Any]:
    """A kept engine's run of a hidden job's shard (engines.kept_model's `shard` request),
    written to the job's part file: its ExtractStats."""
    shard = ExtractRequest.from_json(request["shard"])
    if str(shard.files.out) != request["out"]:  # the keeper checked request["out"] alone
        raise ValueError(f"the shard is written to {request['out']}, not {shard.files.out}")
    log.info("request %s: %s -> %s", tag, shard.files.tokens, shard.files.out)
    if list(shard.layer_ids) != list(spec.layer_ids):  # the key holds them: a fault of ours
        raise RuntimeError(f"layer ids {shard.layer_ids}, engine {spec.layer_ids}")
    inputs = read_shard_inputs(shard)
    stats = extract_with(engine, inputs, out=shard.files.out, batch_tokens=shard.batch_tokens)
    return dataclasses.asdict(stats)
