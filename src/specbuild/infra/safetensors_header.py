"""A safetensors file's header, read and checked without loading a byte of its data.

Layout: 8 bytes little-endian N, N bytes of JSON header ({name: {dtype, shape, data_offsets}},
plus an optional "__metadata__" string map), then the data section, which the tensors' offsets
must cover exactly, each tensor's extent being its shape's element count times its dtype's
size. A file built elsewhere (a drafter from another trainer) may be truncated by a copy, or
hostile: a length of 2^62 must be refused by arithmetic, never by an allocation.

Contract: `header_faults` returns every fault of a file as one line each (empty: the header
is sound and the file holds all the data it declares); `header_shapes` the {name: shape} of a
file it found sound. Neither imports torch, so the config check can run them at parse time.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

__all__ = ["DTYPE_BYTES", "MAX_HEADER_BYTES", "header_faults", "header_shapes"]

# bytes per element of every safetensors dtype of whole bytes
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
# the safetensors library's own bound on a header (its MAX_HEADER_SIZE)
MAX_HEADER_BYTES = 100_000_000
_SHOWN = 5  # tensor faults listed; the rest counted


def _entry_faults(name: str, entry: Any) -> tuple[list[str], tuple[int, int] | None]:
    """(faults of one tensor entry, its (begin, end) when they are sound)."""
    if not isinstance(entry, dict):
        return [f"tensor {name!r}: its entry is no JSON object"], None
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        return [f"tensor {name!r}: unknown dtype {dtype!r}"], None
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        return [f"tensor {name!r}: shape {shape!r} is not a list of sizes"], None
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        return [f"tensor {name!r}: data_offsets {offsets!r} are not [begin, end]"], None
    begin, end = offsets
    extent = math.prod(shape) * DTYPE_BYTES[dtype]
    if end - begin != extent:
        return [
            f"tensor {name!r}: shape {shape} of {dtype} is {extent} bytes, its data_offsets "
            f"span {end - begin}"
        ], None
    return [], (begin, end)


def header_faults(path: str | os.PathLike) -> list[str]:
    """Every fault of the safetensors file at `path` (see the module docstring), one line each."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return [f"{size} bytes: shorter than a safetensors header's length field"]
            n = int.from_bytes(head, "little")
            if n > size - 8 or n > MAX_HEADER_BYTES:
                return [
                    f"its header claims {n:,} bytes, the file holds {size - 8:,} after the "
                    "length field: truncated, or not a safetensors file"
                ]
            raw = fh.read(n)
    except OSError as err:
        return [f"cannot be read ({err.strerror or err})"]
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return ["its header is not JSON: not a safetensors file, or a corrupt one"]
    if not isinstance(header, dict):
        return ["its header is no JSON object: not a safetensors file"]
    faults = []
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        faults.append("its __metadata__ is not a map of strings")
    spans = []
    for name, entry in header.items():
        found, span = _entry_faults(name, entry)
        faults += found
        if span:
            spans.append((*span, name))
    if len(faults) > _SHOWN:
        faults = faults[:_SHOWN] + [f"... and {len(faults) - _SHOWN} more tensor faults"]
    if faults:
        return faults
    data = size - 8 - n
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            what = "overlaps the one before" if begin < at else f"leaves a gap at byte {at}"
            return [f"tensor {name!r} at data byte {begin} {what}: a corrupt header"]
        at = end
    if at != data:
        return [
            f"its tensors declare {at:,} bytes of data, the file holds {data:,}: "
            + ("truncated (a copy that did not finish?)" if at > data else "bytes after the last")
        ]
    return []


def header_shapes(path: str | os.PathLike) -> dict[str, list[int]]:
    """{tensor name: shape} of the safetensors file at `path`, whose header `header_faults`
    found sound (its data is not read)."""
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n).decode("utf-8"))
    return {k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"}
