"""Device-to-host copies of a batch's states into the shard's host buffers, behind the compute.

Why: a shard's states must end up in host memory, and copying them synchronously after each
batch leaves the GPU idle for the copy (transformers extraction ran at 0.455 of a bare forward
on an H200 that way: BENCHMARKS.md). Here each packed batch tensor goes in one asynchronous copy
on a side stream into a small pinned staging slot, ordered after the kernels that wrote it by an
event, while the next batch computes; host threads then scatter the staged rows to their
samples' rows of the shard buffers (plain pageable memory: pinning a whole multi-GB shard costs
seconds and may be refused). `record_stream` keeps the caching allocator from reusing a source
block before its copy is done, and with `slots` staging slots at most that many batches are in
flight, so device and host memory stay bounded whatever the GPU's lead. On the CPU the rows are
copied directly.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch import Tensor

__all__ = ["HostCopier"]

# (rows of the packed batch, rows of the shard) for one run of samples
Span = tuple[slice, slice]
# told (key, shard rows) once those rows of out[key] hold their values
Landed = Callable[[str, slice], None]


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
        self._pending: collections.deque[Future] = collections.deque()
        # one host thread per slot: batches land in disjoint rows, so their scatters (and the
        # first touch of those pages) run side by side; one thread moved ~1.4 GB/s on an H200 host
        self._pool = ThreadPoolExecutor(slots, thread_name_prefix="specbuild-hostcopy")

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
            self._pending.popleft().result()
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
            done = torch.cuda.Event()
            done.record(self.stream)

        def scatter() -> None:
            done.synchronize()
            self._scatter(staged, spans, out)

        self._pending.append(self._pool.submit(scatter))

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
        while self._pending:
            self._pending.popleft().result()
        self._pool.shutdown()
