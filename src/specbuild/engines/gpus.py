"""GPU pinning for local runs: a job that asks the scheduler for N GPUs takes N device ids that
no other specbuild job on this host holds, and sees only those.

Why: Snakemake counts the `gpu` resource but hands out no device ids outside a cluster, so
with `--resources gpu=2` two single-GPU jobs would both land on GPU 0 (two SGLang servers
there run out of memory). A job claims an id with an exclusive flock on
`<lock dir>/<id>.lock`; the kernel drops the lock when the process ends however it ends, so a
killed job frees its GPUs. CUDA_VISIBLE_DEVICES is set before anything initializes CUDA; the
job's SGLang servers and torchrun workers inherit it. Where CUDA_VISIBLE_DEVICES is already
set, the ids are drawn from that set. Inside a SLURM job nothing is pinned: SLURM allocated the
job's GPUs, and with device cgroups every job on a node sees its own as id 0, so host-wide
locks on ids would make jobs wait for each other's unrelated GPUs.

SPECBUILD_GPU_SLOTS=N lets N jobs share each GPU (a small target on a large GPU: a server
start or a single-stream bench leaves most of an H200 idle). Each slot is its own lock; a
job's ids are distinct GPUs, spread over GPUs before sharing one. A training takes more than
half of each of its GPUs' slots (`train_slots`): two trainings never share a GPU (three 135M
drafters sharing one H200 trained at ~0.75x the throughput of one alone), while a bench or a
server start, which leave a GPU mostly idle, may run beside one. Give Snakemake
`--resources gpu=<GPUs x N>` to match (the train rule asks for `train_slots()` a GPU);
SGLang servers size their memory from what is free when they start (`mem_fraction_static` is
a fraction of that), so they fit beside each other. Slots are for local runs: under SLURM
leave the variable unset (the `gpu` resource there is what each job asks SLURM for).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from specbuild.infra.private_dirs import private_dir

__all__ = ["gpu_slots", "pin_gpus", "startup_lock", "train_slots", "visible_gpu_ids"]

log = logging.getLogger("specbuild")

T = TypeVar("T")

_held: list[int] = []  # lock file descriptors, open for the life of the process


def visible_gpu_ids() -> list[str]:
    """The device ids a job may take: CUDA_VISIBLE_DEVICES when set, else `nvidia-smi -L`."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [i.strip() for i in env.split(",") if i.strip()]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "-L"], capture_output=True, text=True, check=False, timeout=60
        ).stdout
    except subprocess.TimeoutExpired:  # a wedged driver: let the job fail on CUDA itself
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def gpu_slots() -> int:
    """Jobs that may share one GPU (SPECBUILD_GPU_SLOTS, default 1)."""
    raw = os.environ.get("SPECBUILD_GPU_SLOTS", "1")
    try:
        slots = int(raw)
    except ValueError:
        slots = 0
    if slots < 1:
        raise ValueError(f"SPECBUILD_GPU_SLOTS={raw!r}: want a whole number >= 1")
    return slots


def train_slots() -> int:
    """Slots a training takes on each of its GPUs: a majority, so no two trainings share one."""
    slots = gpu_slots()
    return slots // 2 + 1 if slots > 1 else 1


def _lock_dir() -> Path:
    path = os.environ.get("SPECBUILD_GPU_LOCK_DIR") or Path(
        tempfile.gettempdir(), f"specbuild-gpus-{os.getuid()}"
    )
    # a predictable name under /tmp: someone else's folder there could hold our GPUs' locks
    return private_dir(path, setting="SPECBUILD_GPU_LOCK_DIR")


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _lock_path(folder: Path, gpu: str, kind: str = "") -> Path:
    """`<id><kind>.lock` in `folder`, the id made safe for a file name."""
    return folder / f"{re.sub(r'[^A-Za-z0-9_-]', '_', gpu)}{kind}.lock"


def _slot_lock(folder: Path, gpu: str, slot: int) -> int | None:
    return _try_lock(_lock_path(folder, gpu, f".slot{slot}" if slot else ""))


def _wait_for(
    attempt: Callable[[], T | None],
    *,
    wait_s: float,
    poll_s: float,
    log_every_s: float,
    waiting: str,
    timed_out: str,
) -> T:
    """`attempt()` until it returns something, logging `waiting` now and then; TimeoutError
    (`timed_out`, the seconds waited appended) after `wait_s`."""
    start = last_log = time.monotonic()
    while (got := attempt()) is None:
        now = time.monotonic()
        if now - start > wait_s:
            raise TimeoutError(f"{timed_out} after {wait_s:.0f} s")
        if now - last_log >= log_every_s:
            log.info("%s", waiting)
            last_log = now
        time.sleep(poll_s)
    return got


def _take(ids: list[str], count: int, slots: int, each: int, folder: Path) -> list[tuple[str, int]]:
    """One attempt: (gpu, lock fd) pairs, `each` slots on `count` distinct GPUs, or fewer when
    not free."""
    taken: list[tuple[str, int]] = []
    if each > 1:  # several slots of one GPU: the GPUs with that many free, in order
        for gpu in ids:
            if len({g for g, _ in taken}) == count:
                break
            fds: list[int] = []
            for slot in range(slots):
                if len(fds) < each and (fd := _slot_lock(folder, gpu, slot)) is not None:
                    fds.append(fd)
            if len(fds) == each:
                taken += [(gpu, fd) for fd in fds]
            else:
                for fd in fds:
                    os.close(fd)
        return taken
    # slot-major: every GPU's first slot before any GPU's second
    for slot in range(slots):
        for gpu in ids:
            if len(taken) < count and gpu not in (g for g, _ in taken):
                if (fd := _slot_lock(folder, gpu, slot)) is not None:
                    taken.append((gpu, fd))
    return taken


def pin_gpus(
    count: int,
    *,
    slots_each: int = 1,
    wait_s: float = 3600.0,
    poll_s: float = 2.0,
    log_every_s: float = 60.0,
) -> list[str]:
    """Claim `count` free GPUs for this process and restrict CUDA_VISIBLE_DEVICES to them.

    Returns the ids taken ([] for count 0, inside a SLURM job, or where no GPU is visible:
    then nothing changes and a CUDA job fails on its own with its own message). Waits up to
    `wait_s` for another job to free GPUs, then raises naming the holders' lock folder.
    `slots_each`: slots of each GPU the job takes (SPECBUILD_GPU_SLOTS; a training takes
    `train_slots()`, a majority, so no other training shares its GPUs).
    """
    if count <= 0:
        return []
    if os.environ.get("SLURM_JOB_ID"):
        log.info(
            "SLURM job %s: its allocation holds the GPUs, not pinning", os.environ["SLURM_JOB_ID"]
        )
        return []
    ids = visible_gpu_ids()
    if not ids:
        log.warning("job asks for %d GPU(s) but none is visible: not pinning", count)
        return []
    if count > len(ids):
        raise RuntimeError(
            f"job asks for {count} GPU(s); this host shows {len(ids)} ({','.join(ids)})"
        )
    folder = _lock_dir()
    slots = gpu_slots()
    if not 1 <= slots_each <= slots:
        raise ValueError(f"slots_each={slots_each}: want 1 to SPECBUILD_GPU_SLOTS={slots}")

    def attempt() -> list[str] | None:
        taken = _take(ids, count, slots, slots_each, folder)
        chosen = list(dict.fromkeys(gpu for gpu, _ in taken))
        if len(chosen) == count:
            _held.extend(fd for _, fd in taken)
            return chosen
        for _, fd in taken:  # all or nothing: two waiting jobs must not each hold half
            os.close(fd)
        return None

    chosen = _wait_for(
        attempt,
        wait_s=wait_s,
        poll_s=poll_s,
        log_every_s=log_every_s,
        waiting=f"waiting for {count} free GPU(s) among {','.join(ids)}",
        timed_out=f"no {count} free GPU(s) among {','.join(ids)} (holders keep locks in {folder})",
    )
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
    log.info("pinned to GPU(s) %s (of the %d here: %s)", ",".join(chosen), len(ids), ",".join(ids))
    return chosen


@contextlib.contextmanager
def startup_lock(
    what: str, *, wait_s: float = 3600.0, poll_s: float = 1.0, log_every_s: float = 60.0
) -> Iterator[None]:
    """Hold the start-up lock of every GPU this process sees while `what` sizes its memory.

    Why: SGLang's model runner sizes its KV pool from the memory free when it starts, read once
    before the weights load and once after. A runner starting on the GPU between another's two
    reads takes its pool out of that one's count, which fails ("Loaded weights leave no GPU
    memory for the KV cache"; two `hidden` jobs on one H200 failed so, at fractions
    0.4 and 0.7 alike). One start at a time per GPU (locks taken in id order: no deadlock)
    removes the race. Inside a SLURM job nothing is locked, as in `pin_gpus`.
    """
    if os.environ.get("SLURM_JOB_ID"):
        yield
        return
    folder = _lock_dir()
    fds: list[int] = []
    try:
        for gpu in sorted(visible_gpu_ids()):
            path = _lock_path(folder, gpu, ".startup")
            fd = _wait_for(
                lambda path=path: _try_lock(path),
                wait_s=wait_s,
                poll_s=poll_s,
                log_every_s=log_every_s,
                waiting=f"{what}: waiting for another start on GPU {gpu}",
                timed_out=f"{what}: GPU {gpu}'s start-up lock ({path}) still held",
            )
            fds.append(fd)
        yield
    finally:
        for fd in fds:
            os.close(fd)
