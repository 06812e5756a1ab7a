"""Writing safetensors files byte for byte reproducibly.

safetensors' `save_file` writes the string metadata in the order of a Rust hash map, seeded per
process: the same tensors and metadata came out as different bytes from one run to the next
(`results/vocab/vocab.safetensors` among them), so a checksum of an output or a comparison of two
builds saw a change where there was none. `save_tensors` is every writer's way in: it writes
with `save_file`, then rewrites the header in place with the metadata keys sorted (same keys
and values, so the same length). specbuild's own shard writer (hidden.writer) builds its header
itself, with `sorted_metadata`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from safetensors.torch import save_file
from torch import Tensor

__all__ = ["save_tensors", "sorted_metadata"]

METADATA_KEY = "__metadata__"


def sorted_metadata(meta: Mapping[str, str]) -> dict[str, str]:
    """`meta` with its keys in sorted order: the order a header is written in."""
    return dict(sorted(meta.items()))


def save_tensors(
    tensors: Mapping[str, Tensor],
    path: str | os.PathLike,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """`save_file(tensors, path, metadata)`, the metadata keys sorted in the header, so that
    the same tensors and metadata give the same bytes. Writes `path` in place: give it a
    temporary path (infra.io.atomic_path)."""
    save_file(dict(tensors), str(path), metadata=dict(metadata) if metadata else None)
    if metadata and len(metadata) > 1:
        _sort_header(path)


def _sort_header(path: str | os.PathLike) -> None:
    with open(path, "r+b") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
        meta = sorted_metadata(header.pop(METADATA_KEY, {}))
        raw = json.dumps(
            {METADATA_KEY: meta, **header}, separators=(",", ":"), ensure_ascii=False
        ).encode()
        if len(raw) > size:  # the same JSON in another order: never longer
            raise RuntimeError(f"{path}: the sorted safetensors header grew ({len(raw)} > {size})")
        fh.seek(8)
        fh.write(raw + b" " * (size - len(raw)))  # safetensors pads headers with spaces
