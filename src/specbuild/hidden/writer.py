"""A shard file filled in place: the stage's buffers are the file's own pages.

Why: extraction used to fill multi-GB host buffers (allocated and first touched per shard), then
safetensors copied them once more into bytes and wrote the file, and the checksums hashed them
on one thread, so the host side outlasted the GPU's prefill. Here the temp file is sized up
front (fallocate: a full disk fails now, not mid-write), mapped shared, and each tensor of the
shard is a view into the mapping at its final place in the file, so a batch's rows land in the
page cache once and the kernel writes them back in the background. Each 16 MiB piece of a tensor
is hashed (and its NaN/Inf counted, integrity.py) on a pool of threads as soon as the writer
says all its rows `landed`, while later batches still compute; `seal` scans what is left and
writes the safetensors header last: its length is fixed up front because digests are fixed-width
hex.

A thread faults the mapping's pages in ahead of the writers (madvise MADV_POPULATE_WRITE, one
call per 64 MiB): a first write into a page of a shared file mapping takes a page fault per
4 KiB, and on the 2-core build machine plain copies into a fresh mapping moved 0.2-0.3 GB/s
against 8-13 GB/s into populated pages, populating itself running at 2.1-2.6 GB/s.

    with shard_writer(path, layout, meta) as w:
        w.tensors["aux"][rows] = ...     # views into the file
        w.landed("aux", rows)            # final: hash its pieces when complete
        scan = w.seal()                  # checksums, NaN/Inf counts, header written
        ...check; raise to discard...
    # renamed into place only here, when the block ended without an exception

The layout is the safetensors format (8-byte header length, JSON header, data), tensors in
the data section by decreasing itemsize so every view is aligned; any safetensors reader
loads the result.
"""

from __future__ import annotations

import ctypes
import errno
import json
import math
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

from specbuild.hidden.integrity import (
    CHECKSUM_KEY,
    ST_DTYPES,
    FileScan,
    PieceScan,
    checksums_json,
)
from specbuild.infra.io import atomic_path
from specbuild.infra.safetensors_file import sorted_metadata

__all__ = ["Layout", "ShardWriter", "shard_writer"]

# name -> (dtype, shape)
Layout = Mapping[str, tuple[torch.dtype, tuple[int, ...]]]
# madvise advice (Linux >= 5.14): fault a range in, writable, as a write would
_MADV_POPULATE_WRITE = 23
# populated per madvise call: small enough for `close` not to wait long on the thread
_POPULATE_BYTES = 64 << 20


def _populate(data: Tensor, stop: threading.Event) -> None:
    """Fault in every page of `data` (a shared file mapping, page-aligned) unless `stop` is set;
    quietly nothing where madvise cannot (another OS, an older kernel): the writers then fault
    the pages themselves, only slower."""
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base, n = data.data_ptr(), data.numel()
    for start in range(0, n, _POPULATE_BYTES):
        size = min(_POPULATE_BYTES, n - start)
        if stop.is_set() or madvise(base + start, size, _MADV_POPULATE_WRITE) != 0:
            return


class ShardWriter:
    """The mapped temp file of one shard; `tensors` are its views (see module doc)."""

    def __init__(self, tmp: Path, layout: Layout, meta: Mapping[str, str]) -> None:
        self.tmp = tmp
        self.meta = {k: v for k, v in meta.items() if k != CHECKSUM_KEY}
        # largest itemsize first: every tensor then starts aligned to its own itemsize
        order = sorted(layout, key=lambda k: -layout[k][0].itemsize)
        self._entries: dict[str, dict] = {}
        end = 0
        for name in order:
            dtype, shape = layout[name]
            n = math.prod(shape) * dtype.itemsize
            self._entries[name] = {
                "dtype": ST_DTYPES[dtype],
                "shape": list(shape),
                "data_offsets": [end, end + n],
            }
            end += n
        placeholder = {name: "0" * 64 for name in layout}  # a hex sha256 is 64 characters
        self._header_len = len(self._header(placeholder))
        self.nbytes = self._header_len + end
        fd = os.open(tmp, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, max(self.nbytes, 1))
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
            raise OSError(
                err.errno, f"{tmp}: no room for a {self.nbytes / 1e9:.2f} GB hidden shard"
            ) from None
        finally:
            os.close(fd)
        self._file = torch.from_file(str(tmp), shared=True, size=self.nbytes, dtype=torch.uint8)
        self._stop = threading.Event()
        self._populating = threading.Thread(
            target=_populate, args=(self._file, self._stop), name="specbuild-populate", daemon=True
        )
        self._populating.start()
        self.tensors: dict[str, Tensor] = {}
        for name in layout:
            dtype, shape = layout[name]
            begin, stop = (self._header_len + x for x in self._entries[name]["data_offsets"])
            self.tensors[name] = self._file[begin:stop].view(dtype).view(shape)
        self._scan = PieceScan(self.tensors)
        self.sealed = False

    def landed(self, name: str, rows: slice) -> None:
        """Rows `rows` of tensor `name` hold their final values (thread-safe)."""
        t = self.tensors[name]
        row_bytes = t[0].numel() * t.element_size() if t.dim() > 1 else t.element_size()
        self._scan.landed(name, rows.start * row_bytes, rows.stop * row_bytes)

    def _header(self, digests: Mapping[str, str]) -> bytes:
        layout = {k: (e["dtype"], e["shape"]) for k, e in self._entries.items()}
        meta = dict(self.meta, **{CHECKSUM_KEY: checksums_json(layout, self.meta, digests)})
        header = {"__metadata__": sorted_metadata(meta), **self._entries}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-(8 + len(raw)) % 8)  # safetensors allows space padding; aligns the data
        return len(raw).to_bytes(8, "little") + raw

    def seal(self) -> FileScan:
        """Hash and count the filled tensors, write the header, check it reads back; returns
        the scan (digests, NaN/Inf counts per tensor) for the caller's checks."""
        scan = self._scan.result()
        header = self._header(scan.digests)
        if len(header) != self._header_len:  # cannot happen: digests are fixed-width
            raise RuntimeError(f"{self.tmp}: header length changed from {self._header_len}")
        self._file[: len(header)] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
        fd = os.open(self.tmp, os.O_RDONLY)
        try:
            back, size = os.pread(fd, len(header), 0), os.fstat(fd).st_size
        finally:
            os.close(fd)
        if back != header or size != self.nbytes:
            raise OSError(f"{self.tmp}: the shard file does not read back as written; not kept")
        self.sealed = True
        return scan

    def close(self) -> None:
        """Drop the views and the mapping (the data stays in the file)."""
        self._stop.set()
        self._populating.join()  # nor may madvise still walk the mapping
        self._scan.close()  # no scan thread may still read the file when it goes
        self.tensors.clear()
        self._file = None


@contextmanager
def shard_writer(
    path: str | os.PathLike, layout: Layout, meta: Mapping[str, str]
) -> Iterator[ShardWriter]:
    """A ShardWriter over a temp file beside `path`; renamed onto `path` when the block ends
    without an exception and `seal` was called, deleted otherwise."""
    with atomic_path(path) as tmp:
        writer = ShardWriter(tmp, layout, meta)
        try:
            yield writer
            if not writer.sealed:
                raise RuntimeError(f"{path}: shard written but never sealed; not kept")
        finally:
            writer.close()
