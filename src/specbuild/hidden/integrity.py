"""Checksums of hidden-state shards: recorded when a shard is written, verified from its file.

`write_shard` stores, in the safetensors string metadata under `checksums`, a JSON object

    {"algorithm": "sha256-16MiB",
     "tensors": {name: hex digest, for every tensor},
     "layout": hex digest of the header (names, dtypes, shapes, other metadata)}

A tensor's digest is the sha256 of the concatenated sha256 digests of its bytes' consecutive
16 MiB pieces (the last one shorter): pieces hash on every core at once, where one sha256 over
a whole tensor runs on one (1.7 GB/s; a 2.5 GB shard took 1.5 s to hash at write and again at
every verification). Shards of specbuild 0.1 record "sha256" (one digest over each tensor's
bytes) and still verify.

`scan_tensors` hashes tensors in memory (a shard file mapped by `scan_file`, or the buffers
`ShardWriter` fills) and counts NaN/Inf values on the same pieces, so one pass over the bytes
gives both. The failure guarded: bytes that changed after `hidden` wrote them (a bad disk, a
partial copy, a flipped page) give finite-looking features or a NaN loss hours into training,
and neither names the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from collections.abc import Collection, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from specbuild.hidden.fp8 import FP8_DTYPE
from specbuild.hidden.threads import background_pool

__all__ = [
    "CHECKSUM_KEY",
    "CHECKSUM_ALGORITHM",
    "ST_DTYPES",
    "TORCH_DTYPES",
    "FileScan",
    "tensor_layout",
    "tensor_digests",
    "checksums_json",
    "build_checksums",
    "count_nonfinite",
    "PieceScan",
    "scan_tensors",
    "map_file",
    "scan_file",
    "recorded_algorithm",
    "checksum_faults",
]

CHECKSUM_KEY = "checksums"
# sha256, not blake2b: CPUs with SHA extensions (x86 SHA-NI, ARMv8) hash it in hardware, 1.7 GB/s
# against blake2b's 0.7 GB/s on the 2-core build machine. Pieces of 16 MiB (see module doc).
CHECKSUM_ALGORITHM = "sha256-16MiB"
_LEGACY_ALGORITHM = "sha256"
# A multiple of every itemsize, so a piece never splits an element.
_PIECE_BYTES = 16 << 20
# Finite checks run over chunks of this many values, each a few temporaries of that size.
_CHECK_VALUES = 1 << 22
# torch dtype -> the name safetensors writes in the header
ST_DTYPES = {
    torch.int32: "I32",
    torch.uint8: "U8",
    torch.int64: "I64",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    FP8_DTYPE: "F8_E4M3",
}
TORCH_DTYPES = {v: k for k, v in ST_DTYPES.items()}


# A bf16 is NaN/Inf when its 8 exponent bits (mask 0x7F80) are all ones, an e4m3fn is NaN when
# its low 7 bits are. Adding the lowest of those bits to the masked value carries into the
# value's top bit exactly then, and never beyond it, so one int64 add tests 4 (8) values at once.
_ALL_ONES = {torch.bfloat16: (0x7F80, 0x0080, 0x8000), FP8_DTYPE: (0x7F, 0x01, 0x80)}
# Host tensors are tested with numpy over chunks of this many int64 words (1 MiB: the
# temporaries stay in cache): 6.9 GB/s on one core of the build machine, against 2.5 GB/s for
# the same test in torch. numpy also starts no OpenMP team, which matters on the scan threads
# (threads.py).
_WORDS_PER_CHUNK = 1 << 17


def _lanes(value: int, itemsize: int) -> int:
    """`value` repeated in every itemsize-byte lane of an int64 (as a signed int64)."""
    word = sum(value << (8 * itemsize * i) for i in range(8 // itemsize))
    return word - (1 << 64) if word >= 1 << 63 else word


def _words_may_hold_nonfinite(words: np.ndarray, mask: int, low: int, top: int) -> bool:
    tmp = np.empty(min(_WORDS_PER_CHUNK, words.size), dtype=np.int64)
    for i in range(0, words.size, _WORDS_PER_CHUNK):
        chunk = words[i : i + _WORDS_PER_CHUNK]
        t = tmp[: chunk.size]
        np.bitwise_and(chunk, mask, out=t)
        np.add(t, low, out=t)  # wraps in the top lane by design: that sets the sign bit
        np.bitwise_and(t, top, out=t)
        if t.any():
            return True
    return False


def _may_hold_nonfinite(values: Tensor) -> bool:
    """False only when no value is NaN/Inf; True also when the fast test cannot run."""
    try:
        words = values.reshape(-1).view(torch.int64)
    except RuntimeError:  # not a multiple of 8 bytes, or misaligned: count exactly
        return True
    mask, low, top = (_lanes(v, values.dtype.itemsize) for v in _ALL_ONES[values.dtype])
    if words.device.type == "cpu":
        with np.errstate(over="ignore"):
            return _words_may_hold_nonfinite(words.numpy(), mask, low, top)
    lanes = words & mask
    lanes += low
    lanes &= top
    return bool(lanes.any())


def count_nonfinite(values: Tensor) -> int:
    """NaN/Inf values in a tensor of any float dtype, fp8 included (0 for integer tensors),
    counted over chunks of _CHECK_VALUES so the temporaries stay small whatever its size."""
    flat = values.reshape(-1)
    if flat.numel() > _CHECK_VALUES:
        return sum(
            _count_chunk(flat[i : i + _CHECK_VALUES]) for i in range(0, flat.numel(), _CHECK_VALUES)
        )
    return _count_chunk(flat)


def _count_chunk(values: Tensor) -> int:
    if values.dtype in _ALL_ONES and not _may_hold_nonfinite(values):
        return 0
    if values.dtype == FP8_DTYPE:  # e4m3fn has no Inf, and torch.isfinite does not take it
        return int(((values.view(torch.uint8) & 0x7F) == 0x7F).sum())
    if not values.is_floating_point():
        return 0
    return int((~torch.isfinite(values)).sum())


def _layout_digest(layout: Mapping[str, tuple[str, list[int]]], meta: Mapping[str, str]) -> str:
    blob = json.dumps(
        {
            "tensors": {k: [d, list(s)] for k, (d, s) in layout.items()},
            "metadata": {k: v for k, v in meta.items() if k != CHECKSUM_KEY},
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def tensor_layout(tensors: Mapping[str, Tensor]) -> dict[str, tuple[str, list[int]]]:
    """{name: (safetensors dtype, shape)}: what the header says of these tensors."""
    return {k: (ST_DTYPES.get(v.dtype, str(v.dtype)), list(v.shape)) for k, v in tensors.items()}


def tensor_digests(
    tensors: Mapping[str, Tensor], algorithm: str = CHECKSUM_ALGORITHM
) -> dict[str, str]:
    """{name: hex digest of the bytes safetensors writes for it}."""
    return scan_tensors(tensors, algorithm=algorithm, count=False).digests


def checksums_json(
    layout: Mapping[str, tuple[str, list[int]]], meta: Mapping[str, str], digests: Mapping[str, str]
) -> str:
    """The `checksums` metadata value: `digests` of the tensors `layout` describes, and a digest
    of that layout and (the rest of) `meta`. Its length depends only on the tensor names."""
    return json.dumps(
        {
            "algorithm": CHECKSUM_ALGORITHM,
            "tensors": dict(digests),
            "layout": _layout_digest(layout, meta),
        },
        sort_keys=True,
    )


def build_checksums(tensors: Mapping[str, Tensor], meta: Mapping[str, str]) -> str:
    """The `checksums` metadata value for these tensors and (the rest of) this metadata."""
    return checksums_json(tensor_layout(tensors), meta, tensor_digests(tensors))


@dataclass
class FileScan:
    """What one pass over a shard's bytes found."""

    digests: dict[str, str] = field(default_factory=dict)  # name -> hex digest of its bytes
    nonfinite: dict[str, int] = field(default_factory=dict)  # name -> NaN/Inf values
    tensors: dict[str, Tensor] = field(default_factory=dict)  # the `keep` tensors, loaded
    faults: list[str] = field(default_factory=list)  # unreadable dtypes, short files


def _scan_piece(piece: Tensor, dtype: torch.dtype, count: bool) -> tuple[bytes, int]:
    """(sha256 digest, NaN/Inf values) of a flat uint8 piece holding `dtype` values."""
    digest = hashlib.sha256(memoryview(piece.numpy())).digest()  # releases the GIL
    if not count or not (dtype.is_floating_point or dtype == FP8_DTYPE):
        return digest, 0
    if piece.data_ptr() % 8:  # the word-wise test needs 8-byte alignment: copy (cheap) to get it
        piece = piece.clone()
    return digest, count_nonfinite(piece.view(dtype))


class PieceScan:
    """Digests and NaN/Inf counts of named host tensors, piece by piece on a thread pool
    (hashlib and torch release the GIL), in whatever order the pieces become final.

    `landed(name, start, stop)` says bytes [start, stop) of a tensor are written for good; a
    piece is scanned as soon as all its bytes have landed, so a writer's hashing runs while it
    still fills other pieces. `result()` scans what is left and waits.
    """

    def __init__(
        self,
        tensors: Mapping[str, Tensor],
        *,
        algorithm: str = CHECKSUM_ALGORITHM,
        count: bool = True,
    ) -> None:
        if algorithm not in (CHECKSUM_ALGORITHM, _LEGACY_ALGORITHM):
            raise ValueError(
                f"checksum algorithm {algorithm!r}: this specbuild knows {CHECKSUM_ALGORITHM!r}"
            )
        self.algorithm, self.count = algorithm, count
        self._data = {
            k: t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
            for k, t in tensors.items()
        }
        self._dtypes = {k: t.dtype for k, t in tensors.items()}
        # legacy: one digest over a whole tensor, so one piece
        self._step = {
            k: _PIECE_BYTES if algorithm == CHECKSUM_ALGORITHM else max(d.numel(), 1)
            for k, d in self._data.items()
        }
        self._left = {
            k: [min(step, d.numel() - i) for i in range(0, d.numel(), step)]
            for (k, d), step in zip(self._data.items(), self._step.values(), strict=True)
        }
        self._futures: dict[str, list[Future | None]] = {
            k: [None] * len(v) for k, v in self._left.items()
        }
        self._tracked: set[str] = set()
        self._lock = threading.Lock()
        self._pool = background_pool("specbuild-scan")

    def _submit(self, name: str, i: int) -> None:
        step = self._step[name]
        piece = self._data[name][i * step : (i + 1) * step]
        self._futures[name][i] = self._pool.submit(
            _scan_piece, piece, self._dtypes[name], self.count
        )

    def landed(self, name: str, start: int, stop: int) -> None:
        """Bytes [start, stop) of tensor `name` hold their final values (thread-safe)."""
        step, left = self._step[name], self._left[name]
        with self._lock:
            self._tracked.add(name)
            for i in range(start // step, (stop - 1) // step + 1 if stop > start else 0):
                left[i] -= min(stop, (i + 1) * step) - max(start, i * step)
                if left[i] == 0:
                    self._submit(name, i)

    def close(self) -> None:
        """Drop the scans not started and wait for the running ones (the result is lost)."""
        self._pool.shutdown(cancel_futures=True)

    def result(self) -> FileScan:
        """Scan every piece not scanned yet, wait for all; digests and counts per tensor."""
        scan = FileScan()
        try:
            with self._lock:
                for name, futures in self._futures.items():
                    if name in self._tracked and any(self._left[name]):
                        # a writer that marks bytes must mark each exactly once
                        how = "twice" if min(self._left[name]) < 0 else "never"
                        raise RuntimeError(f"{name}: some bytes written {how}")
                    for i, future in enumerate(futures):
                        if future is None:
                            self._submit(name, i)
            for name, futures in self._futures.items():
                results = [f.result() for f in futures]
                digests = [d for d, _ in results]
                scan.nonfinite[name] = sum(bad for _, bad in results)
                if self.algorithm == _LEGACY_ALGORITHM:
                    scan.digests[name] = (
                        digests[0].hex() if digests else hashlib.sha256().hexdigest()
                    )
                else:
                    scan.digests[name] = hashlib.sha256(b"".join(digests)).hexdigest()
        finally:
            self.close()
        return scan


def scan_tensors(
    tensors: Mapping[str, Tensor], *, algorithm: str = CHECKSUM_ALGORITHM, count: bool = True
) -> FileScan:
    """Digest of every tensor's bytes (as `algorithm` defines it) and, with `count`, its NaN/Inf
    values, in one parallel pass. The tensors live in host memory: a mapped file, or buffers."""
    return PieceScan(tensors, algorithm=algorithm, count=count).result()


def map_file(path: str | os.PathLike) -> Tensor:
    """The file's bytes as a uint8 tensor over a private read-only use of its pages (mmap): no
    copy, and the kernel pages it in as the scan goes."""
    size = os.path.getsize(path)
    if size == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)


def scan_file(
    path: str | os.PathLike,
    entries: Mapping[str, Mapping],
    data_start: int,
    *,
    keep: Collection[str] = (),
    algorithm: str = CHECKSUM_ALGORITHM,
) -> FileScan:
    """Hash every tensor of a safetensors file and count its NaN/Inf values in one pass.

    `entries` is the parsed header ({name: {"dtype", "shape", "data_offsets"}}), `data_start`
    the byte where the data section begins; tensors named in `keep` are also returned loaded.
    """
    faults: list[str] = []
    data = map_file(path)
    views: dict[str, Tensor] = {}
    for name, entry in sorted(entries.items(), key=lambda e: int(e[1]["data_offsets"][0])):
        begin, end = (data_start + int(x) for x in entry["data_offsets"])
        dtype = TORCH_DTYPES.get(entry["dtype"])
        if dtype is None:
            faults.append(f"{name}: dtype {entry['dtype']!r} is not a shard dtype")
        elif end - begin != math.prod(entry["shape"]) * dtype.itemsize:
            faults.append(
                f"{name}: the header gives shape {entry['shape']} of {entry['dtype']} but "
                f"{end - begin} bytes of data"
            )
        elif end > data.numel():
            faults.append(f"{name}: {end - data.numel()} byte(s) of its data missing from the file")
        else:
            raw = data[begin:end]
            # a view needs the offset aligned to the itemsize; specbuild's writer aligns it
            views[name] = (raw if begin % dtype.itemsize == 0 else raw.clone()).view(dtype)
    scan = scan_tensors(views, algorithm=algorithm)
    scan.faults = faults + scan.faults
    scan.tensors = {k: views[k].clone().reshape(entries[k]["shape"]) for k in keep if k in views}
    return scan


def recorded_algorithm(meta: Mapping[str, str]) -> str:
    """The checksum algorithm a shard's metadata records (this specbuild's when unreadable:
    `checksum_faults` then reports the corrupt entry)."""
    try:
        algorithm = json.loads(meta[CHECKSUM_KEY])["algorithm"]
    except (json.JSONDecodeError, TypeError, KeyError):
        return CHECKSUM_ALGORITHM
    return algorithm if algorithm == _LEGACY_ALGORITHM else CHECKSUM_ALGORITHM


def checksum_faults(
    meta: Mapping[str, str],
    layout: Mapping[str, tuple[str, list[int]]],
    digests_now: Mapping[str, str],
) -> list[str]:
    """Every way a shard differs from the checksums recorded when it was written.

    `layout`: {name: (safetensors dtype, shape)} as read; `digests_now`: {name: hex digest}
    of the bytes as read (`scan_file` or `tensor_digests`). Call only when `meta` holds
    `checksums`; a shard written before checksums has none.
    """
    try:
        recorded = json.loads(meta[CHECKSUM_KEY])
        algorithm, digests, recorded_layout = (
            recorded[k] for k in ("algorithm", "tensors", "layout")
        )
    except (json.JSONDecodeError, TypeError, KeyError):
        return [f"metadata {CHECKSUM_KEY}: not the JSON object write_shard records (corrupt)"]
    if algorithm not in (CHECKSUM_ALGORITHM, _LEGACY_ALGORITHM):
        return [
            f"metadata {CHECKSUM_KEY}: algorithm {algorithm!r}, this specbuild checks "
            f"{CHECKSUM_ALGORITHM!r}"
        ]
    faults = []
    if _layout_digest(layout, meta) != recorded_layout:
        faults.append("header: tensor names, dtypes, shapes or metadata changed since written")
    faults += [f"{k}: no checksum recorded" for k in sorted(layout.keys() - digests.keys())]
    faults += [
        f"{k}: checksummed when written, now absent" for k in sorted(digests.keys() - layout.keys())
    ]
    for name in sorted(digests.keys() & digests_now.keys()):
        if digests_now[name] != digests[name]:
            faults.append(f"{name}: checksum mismatch, its bytes changed since `hidden` wrote them")
    return faults
