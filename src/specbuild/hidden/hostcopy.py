"""Device-to-host copies of a batch's states into the shard's host tensors, behind the compute.

Why: a shard's states must end up in host memory, and copying them synchronously after each
batch leaves the GPU idle for the copy. Here each packed batch tensor goes in one asynchronous copy
on a side stream into a small pinned staging slot, ordered after the kernels that wrote it by an
event, while the next batch computes; a pool of host threads then scatters the staged rows to
their samples' rows of the shard (the shard file's mapped pages, writer.py), in tasks of a few
MB so every thread has work. Each task copies bytes with numpy, one thread per copy: torch's
copy into a file mapping spreads every copy over all OpenMP threads, which contend on the
mapping's page faults and moved 1.6-2.2 GB/s on an H200 host whatever the thread count, where
one plain copy per thread reached 5.4 GB/s with 4 threads and 7.2 GB/s with 8.
`record_stream` keeps the caching allocator from reusing a source block before its copy is done,
and with `slots` staging slots at most that many batches are in flight, so device and host
memory stay bounded whatever the GPU's lead. On the CPU the rows are copied directly.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from concurrent.futures import Future

import torch
from torch import Tensor

from specbuild.hidden.threads import background_pool

__all__ = ["HostCopier"]

# (rows of the packed batch, rows of the shard) for one run of samples
Span = tuple[slice, slice]
# told (key, shard rows) once those rows of out[key] hold their values
Landed = Callable[[str, slice], None]
# A scatter task copies about this many bytes: enough to dwarf its overhead (~20 us), small
# enough that a batch of ~100 MB keeps every thread busy.
_TASK_BYTES = 8 << 20


def _copy_bytes(dst: Tensor, src: Tensor) -> None:
    """dst[...] = src as one memcpy on this thread (numpy releases the GIL while it copies)."""
    dst.view(torch.uint8).numpy()[...] = src.view(torch.uint8).numpy()


def _tasks(tensors: dict[str, Tensor], spans: list[Span]) -> list[list[tuple[str, slice, slice]]]:
    """(key, packed rows, shard rows) copies grouped into tasks of about _TASK_BYTES; a span
    larger than that is cut into row ranges."""
    tasks: list[list[tuple[str, slice, slice]]] = [[]]
    size = 0
    for key, t in tensors.items():
        row_bytes = max(1, t[0].numel() * t.element_size())
        step = max(1, _TASK_BYTES // row_bytes)
        for src, dst in spans:
            for r in range(0, src.stop - src.start, step):
                n = min(step, src.stop - src.start - r)
                tasks[-1].append(
                    (
                        key,
                        slice(src.start + r, src.start + r + n),
                        slice(dst.start + r, dst.start + r + n),
                    )
                )
                size += n * row_bytes
                if size >= _TASK_BYTES:
                    tasks.append([])
                    size = 0
    return [t for t in tasks if t]


class HostCopier:
    """Copies packed device tensors, span by span, into host tensors of the same keys."""

    def __init__(
        self, device: torch.device | str, *, slots: int = 4, landed: Landed | None = None
    ) -> None:
        self.device = torch.device(device)
        self.landed = landed
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._slots: list[dict[str, Tensor]] = [{} for _ in range(slots)]
        self._next = 0
        self._pending: collections.deque[list[Future]] = collections.deque()
        # rows of different tasks are disjoint, so their copies (and the first touch of those
        # pages) run side by side
        self._pool = background_pool("specbuild-hostcopy")
        self.wait_s = 0.0  # the caller's time blocked on a full ring: the host is behind

    def _staging(self, slot: dict[str, Tensor], key: str, like: Tensor) -> Tensor:
        """A pinned [like.shape] view in `slot`, grown (by a quarter more) when too small."""
        buf = slot.get(key)
        if buf is None or buf.dtype != like.dtype or buf.numel() < like.numel():
            n = like.numel() + like.numel() // 4
            buf = slot[key] = torch.empty(n, dtype=like.dtype, pin_memory=True)
        return buf[: like.numel()].view(like.shape)

    def copy(self, tensors: dict[str, Tensor], spans: list[Span], out: dict[str, Tensor]) -> None:
        """out[key][dst] = tensors[key][src] for every key and span; returns before the copies
        finish on a GPU (call `finish`)."""
        if not self.cuda:
            self._scatter(tensors, spans, out)
            return
        if len(self._pending) == len(self._slots):  # the oldest batch still holds this slot
            start = time.perf_counter()
            for task in self._pending.popleft():
                task.result()
            self.wait_s += time.perf_counter() - start
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        ready = torch.cuda.Event()
        ready.record()  # on the compute stream, after the kernels that wrote `tensors`
        staged: dict[str, Tensor] = {}
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            for key, t in tensors.items():
                staged[key] = self._staging(slot, key, t)
                staged[key].copy_(t, non_blocking=True)
                t.record_stream(self.stream)
            # blocking: the scatter threads sleep until the copy is done (the default event
            # spin-waits, one core per waiting thread for the whole forward pass)
            done = torch.cuda.Event(blocking=True)
            done.record(self.stream)

        def scatter(copies: list[tuple[str, slice, slice]]) -> None:
            done.synchronize()
            for key, src, dst in copies:
                _copy_bytes(out[key][dst], staged[key][src])
                if self.landed is not None:
                    self.landed(key, dst)

        self._pending.append([self._pool.submit(scatter, t) for t in _tasks(staged, spans)])

    def _scatter(
        self, tensors: dict[str, Tensor], spans: list[Span], out: dict[str, Tensor]
    ) -> None:
        for key, t in tensors.items():
            for src, dst in spans:
                out[key][dst] = t[src]
                if self.landed is not None:
                    self.landed(key, dst)

    def finish(self) -> None:
        """Wait until every queued batch has landed in the host tensors (re-raising errors)."""
        errors = []
        while self._pending:  # every task, also after an error: none may outlive the shard
            for task in self._pending.popleft():
                try:
                    task.result()
                except Exception as err:  # noqa: BLE001 (re-raised below)
                    errors.append(err)
        self._pool.shutdown()
        if errors:
            raise errors[0]
