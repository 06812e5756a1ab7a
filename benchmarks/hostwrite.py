"""Benchmark (not a test): how fast one host writes a shard's bytes, by method and threads.

    python -m benchmarks.hostwrite [--gb 2.5] [--folder /tmp]

Why: stage `hidden` scatters every batch's rows into the shard file's mapped pages
(hidden/writer.py, hidden/hostcopy.py); at SmolLM2's 1M tokens/s that is ~5 GB/s of host
writes, so how the copy is made decides the stage's speed. Writes `--gb` GB from a pinned
(where CUDA exists) 64 MB source, split over N threads, into: anonymous memory; a shared
mapping of a file sized by ftruncate or by fallocate; the file by pwrite. "torch" copies with
Tensor.copy_ (which spreads one copy over every OpenMP thread), "memcpy" with one numpy copy on
the calling thread. Prints GB/s per line.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

__all__ = ["main"]

_CHUNK = 64 << 20


def _parallel(k: int, offsets: list[int], write: Callable[[int], object]) -> float:
    """Seconds for k threads to call write(offset) on every k-th offset each."""

    def work(i: int) -> None:
        for off in offsets[i::k]:
            write(off)

    start = time.perf_counter()
    pool = [threading.Thread(target=work, args=(i,)) for i in range(k)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.perf_counter() - start


def _file(path: Path, n: int, fallocate: bool) -> int:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if fallocate:
        os.posix_fallocate(fd, 0, n)
    else:
        os.ftruncate(fd, n)
    return fd


def _copy_torch(dst: torch.Tensor, src: torch.Tensor, off: int) -> None:
    dst[off : off + _CHUNK].copy_(src)


def _memcpy(dst: torch.Tensor, src: torch.Tensor, off: int) -> None:
    dst[off : off + _CHUNK].numpy()[:] = src.numpy()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=2.5)
    ap.add_argument("--folder", default="/tmp")
    ap.add_argument("--threads", default="1,4,8,16")
    args = ap.parse_args(argv)
    n = int(args.gb * 1e9) // _CHUNK * _CHUNK
    path = Path(args.folder) / f".specbuild-hostwrite-{os.getpid()}.bin"
    src = torch.empty(_CHUNK, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    src.random_(0, 255)
    offsets = list(range(0, n, _CHUNK))
    print(f"{n / 1e9:.2f} GB; torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}")
    try:
        for k in (int(x) for x in args.threads.split(",")):
            for target in ("anonymous", "mmap ftruncate", "mmap fallocate"):
                for how in ("torch", "memcpy"):
                    if target == "anonymous":
                        dst = torch.empty(n, dtype=torch.uint8)
                    else:
                        os.close(_file(path, n, target.endswith("fallocate")))
                        dst = torch.from_file(str(path), shared=True, size=n, dtype=torch.uint8)
                    write = partial(_copy_torch if how == "torch" else _memcpy, dst, src)
                    seconds = _parallel(k, offsets, write)
                    del dst
                    print(f"{target:15s} {how:6s} threads {k:2d}: {n / seconds / 1e9:6.2f} GB/s")
            fd = _file(path, n, fallocate=True)
            try:
                seconds = _parallel(k, offsets, partial(os.pwrite, fd, src.numpy()))
            finally:
                os.close(fd)
            print(
                f"{'pwrite fallocate':15s} {'-':6s} threads {k:2d}: {n / seconds / 1e9:6.2f} GB/s"
            )
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
