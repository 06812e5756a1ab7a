"""Background thread pools of stage `hidden`: host copies and checksums behind the compute.

Their threads run at a lower priority (nice +5, per thread on Linux) than the main thread,
whose job is to keep the GPU fed: on an H200 host, SGLang spends 20-60 ms of Python per
prefill step, and 16 busy copy and hash threads competing for the same cores made that time,
not the GPU, what bounded a small target. Work handed to these pools must release the GIL
(numpy, hashlib, CUDA event waits) and must not start OpenMP teams (torch CPU ops do: one team
per calling thread, so eight pool threads each asking torch for a CPU op put 8 x cores spinning
threads on the machine).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["background_pool", "usable_cores"]

# What a background thread's nice value is raised by (never lowered: that needs privileges).
BACKGROUND_NICE = 5


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask: a Snakemake or SLURM job's share)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _lower_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):  # not Linux, or not permitted: run at the same priority
        pass


def background_pool(name: str, max_threads: int = 8) -> ThreadPoolExecutor:
    """A pool of up to `max_threads` (at most the usable cores) lower-priority threads."""
    threads = max(1, min(max_threads, usable_cores()))
    return ThreadPoolExecutor(threads, thread_name_prefix=name, initializer=_lower_priority)
