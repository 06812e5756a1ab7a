"""Stage `hidden`: run the target over one tokenized shard and publish one hidden-state shard.

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

A backend is chosen at construction (`hf` and `sglang`, each in its own module) and implements
only the forward pass; batching, storage, copies, checks and writing are written once, here.
The job's entry point, which picks the job's own engine or a shared one (hidden.shared), is
hidden.shard_job.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

import specbuild
from specbuild.disk import ensure_free_space
from specbuild.eagle_layers import AUX_LAYERS, default_layer_ids
from specbuild.engines.registry import lazy_class
from specbuild.hidden.fp8 import parse_storage, quantize_fp8, scale_groups
from specbuild.hidden.hostcopy import HostCopier, Landed
from specbuild.hidden.shards import (
    FP8_SCALES,
    LAYERS,
    STORAGE_DTYPES,
    check_shard,
    shard_layout,
    shard_nbytes,
    state_nbytes_per_token,
)
from specbuild.hidden.tokens import TokenShard, check_token_meta, read_token_shard
from specbuild.hidden.writer import shard_writer
from specbuild.target import TargetInfo, read_target_info

__all__ = [
    "FeatureBackend",
    "Features",
    "BACKENDS",
    "ExtractStats",
    "Written",
    "resolve_layer_ids",
    "plan_batches",
    "open_backend",
    "extract_features",
    "write_features",
    "EngineSpec",
    "ShardInputs",
    "read_shard_inputs",
    "extract_with",
]

log = logging.getLogger("specbuild")

# name -> "module:Class"; each class has `from_folder(folder, *, layer_ids, dtype, device,
# **options)`, options being engine settings (server flags for sglang; none for hf).
# Imported when chosen (specbuild.engines.registry).
BACKENDS = {
    "hf": "specbuild.hidden.hf:HFFeatureBackend",
    "sglang": "specbuild.hidden.sglang:SGLangFeatureBackend",
}


# A batch takes a sample only if it is at least (1 - MAX_PADDING) as long as the batch's longest,
# so at most 20% of the computed tokens are pads. Filling the budget with short samples instead
# pads them to the longest: 8 random lengths in 64..256 in one batch computed 39% pads.
MAX_PADDING = 0.2


@dataclass(frozen=True)
class Features:
    """One batch's states, packed in batch order on the backend's device.

    Sample j of the batch owns rows sum(lengths[:j]) .. sum(lengths[:j+1]) of both tensors.
    aux [T, 3H] is the three layer outputs `layer_ids` (HF hidden_states[id + 1]) concatenated
    low|mid|high; last [T, H] is the final post-norm state (HF hidden_states[-1]).
    """

    aux: Tensor
    last: Tensor
    lengths: tuple[int, ...]

    def split(self) -> list[tuple[Tensor, Tensor]]:
        """Per sample (aux [n, 3H], last [n, H]), views of the packed tensors."""
        return list(
            zip(
                self.aux.split(list(self.lengths)), self.last.split(list(self.lengths)), strict=True
            )
        )


@runtime_checkable
class FeatureBackend(Protocol):
    """Runs the target over a batch of token-id lists (any lengths; padding or packing is the
    backend's business) and returns its packed `Features` on `device`, computed in `dtype`
    (recorded in the shard). A backend may also have `close()`, called when the shard is done.
    """

    name: str
    device: torch.device
    dtype: str
    eagle_layer_ids: list[int]  # eagle_config ids under which SGLang captures the same layers

    def extract(self, batch: list[list[int]]) -> Features: ...


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


def plan_batches(
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


def open_backend(
    name: str,
    *,
    folder: str | os.PathLike,
    layer_ids: list[int],
    dtype: str,
    device: str,
    options: Mapping[str, Any] | None = None,
) -> FeatureBackend:
    """Construct the named backend over the target HF folder."""
    cls = lazy_class(BACKENDS, name, key="hidden.backend")
    return cls.from_folder(
        folder, layer_ids=layer_ids, dtype=dtype, device=device, **(options or {})
    )


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
    *,
    out: Mapping[str, Tensor],
    hidden_size: int,
    storage: str = "bf16",
    fp8_group_size: int = 0,
    batch_tokens: int = 2048,
    landed: Landed | None = None,
) -> Written:
    """Fill out["aux"], out["last"] (and their scales for fp8), host tensors of the shard's
    layout, with `backend`'s states of every sample of `tokens`, telling `landed` (key, rows)
    as rows are final."""
    if storage not in STORAGE_DTYPES:
        raise ValueError(f"hidden.storage {storage!r}: choose one of {sorted(STORAGE_DTYPES)}")
    groups = scale_groups(hidden_size, fp8_group_size) if storage == "fp8" else 0
    offsets = tokens.offsets.tolist()
    lengths = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    copier = HostCopier(backend.device, landed=landed)
    batches = plan_batches(lengths, batch_tokens)
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
    *,
    hidden_size: int,
    storage: str = "bf16",
    fp8_group_size: int = 0,
    batch_tokens: int = 2048,
    expected_meta: Mapping[str, str] | None = None,
) -> Written:
    """Extract every sample of `tokens` straight into the shard file `path` (writer.py), check
    it (check_shard) and publish it. A shard that fails the check raises ShardError and leaves
    nothing at `path`."""
    layout = shard_layout(
        tokens=tokens.num_tokens,
        samples=len(tokens),
        hidden_size=hidden_size,
        storage=storage,
        fp8_group_size=fp8_group_size,
    )
    with shard_writer(path, layout, meta) as shard:
        for key in ("input_ids", "loss_mask", "offsets"):
            shard.tensors[key].copy_(getattr(tokens, key))
            shard.landed(key, slice(0, len(shard.tensors[key])))
        done = extract_features(
            tokens,
            backend,
            out=shard.tensors,
            hidden_size=hidden_size,
            storage=storage,
            fp8_group_size=fp8_group_size,
            batch_tokens=batch_tokens,
            landed=shard.landed,
        )
        sealing = time.perf_counter()
        scan = shard.seal()
        check_shard(
            shard.tensors,
            shard.meta,
            name=path,
            hidden_size=hidden_size,
            tokens=tokens,
            expected_meta=expected_meta,
            nonfinite=scan.nonfinite,
        )
        seal_s = time.perf_counter() - sealing
    return done._replace(seal_s=seal_s)


@dataclass(frozen=True)
class ShardInputs:
    """A shard's checked inputs: what `extract_with` needs beside the engine."""

    target: TargetInfo
    layer_ids: list[int]  # resolved against the target
    tokens: TokenShard
    storage: str  # bf16 or fp8
    fp8_group_size: int


def read_shard_inputs(
    *,
    tokens: str | os.PathLike,
    meta: str | os.PathLike,
    fingerprint: str | os.PathLike,
    out: str | os.PathLike,
    layer_ids: list[int] | None = None,
    storage: str = "bf16",
) -> ShardInputs:
    """Read and check everything a shard is made from, and that its file fits on disk at
    `out`: all of it before any model loads."""
    storage, fp8_group_size = parse_storage(storage)
    target = read_target_info(fingerprint)
    ids = resolve_layer_ids(layer_ids or [], target.num_hidden_layers)
    shard = read_token_shard(tokens, vocab_size=target.vocab_size)
    check_token_meta(meta, target, rows=len(shard))
    nbytes = shard_nbytes(
        tokens=shard.num_tokens,
        samples=len(shard),
        hidden_size=target.hidden_size,
        storage=storage,
        fp8_group_size=fp8_group_size,
    )
    ensure_free_space(
        out,
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
        tokens,
        len(shard),
        shard.num_tokens,
        ids,
        storage,
        nbytes / 1e9,
    )
    return ShardInputs(target, ids, shard, storage, fp8_group_size)


@dataclass(frozen=True)
class EngineSpec:
    """Everything `open_backend` loads an engine from: one engine serves every shard that
    names the same (and runs on the same GPUs)."""

    backend: str
    folder: str  # the target's HF folder, absolute
    layer_ids: list[int]
    dtype: str
    device: str
    options: dict[str, Any]

    def open(self) -> FeatureBackend:
        start = time.perf_counter()
        engine = open_backend(
            self.backend,
            folder=self.folder,
            layer_ids=self.layer_ids,
            dtype=self.dtype,
            device=self.device,
            options=self.options,
        )
        log.info(
            "loaded feature backend %s (device %s, compute dtype %s) from %s in %.1f s",
            self.backend,
            self.device,
            self.dtype,
            self.folder,
            time.perf_counter() - start,
        )
        return engine


def extract_with(
    engine: FeatureBackend,
    inputs: ShardInputs,
    *,
    out: str | os.PathLike,
    batch_tokens: int = 2048,
) -> ExtractStats:
    """Extract, verify and publish `out` with an open `engine`: the shard code of both the
    job's own engine and a shared one."""
    target, shard = inputs.target, inputs.tokens
    shard_meta = {
        "layer_ids": json.dumps(inputs.layer_ids),
        "eagle_layer_ids": json.dumps(engine.eagle_layer_ids),
        "backend": engine.name,
        "target_fingerprint": target.fingerprint,
        "tokenizer_fingerprint": target.tokenizer_fingerprint,
        "chat_template_sha256": target.chat_template_sha256,
        "dtype": inputs.storage,
        "compute_dtype": engine.dtype,
        "specbuild_version": specbuild.__version__,
    }
    start = time.perf_counter()
    written = write_features(
        out,
        shard,
        engine,
        shard_meta,
        hidden_size=target.hidden_size,
        storage=inputs.storage,
        fp8_group_size=inputs.fp8_group_size,
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
        state_nbytes_per_token(target.hidden_size, inputs.storage, inputs.fp8_group_size),
        8 * target.hidden_size,
    )
    return stats
