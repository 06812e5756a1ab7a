"""Pid files: a pid names a process only together with that process's start time.

A pid is reused once its process has exited, so a file holding a pid alone (the older format
of `keeper.pid` and `host.pid`) may name whatever process got the number since: a job would
wait on it forever for an engine that never answers, and a run's end would wait for it to
exit. Every pid file specbuild reads is written and read here, as `<pid> <start>` (the start
time in clock ticks after boot, /proc/<pid>/stat field 22, as `run_lock.process_start` reads
it), and checked as a run's lock owner is (`run_lock.same_process`); a file without the start
time, or whose start time differs from the live process's, names no process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specbuild.infra.io import atomic_open
from specbuild.infra.run_lock import process_start, same_process

__all__ = ["ProcessId", "live_pid", "read_pid_file", "write_pid_file"]


@dataclass(frozen=True)
class ProcessId:
    """One process, for as long as it runs: its pid and start time."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        """Process `pid` as it runs now; None when it is gone (or a zombie)."""
        start = process_start(pid)
        return None if start is None else cls(pid, start)

    def running(self) -> bool:
        """Whether this very process still runs; an exited child of ours is reaped here, so
        it does not linger as a zombie."""
        try:
            os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pass  # not our child
        return same_process(self.pid, self.start)


def write_pid_file(path: str | os.PathLike, pid: int) -> None:
    """Record process `pid` in `path`, whole or absent; a process already gone is recorded as
    one that never matches (start 0)."""
    found = ProcessId.of(pid)
    with atomic_open(path) as fh:
        fh.write(f"{pid} {found.start if found else 0}\n")


def read_pid_file(path: str | os.PathLike) -> ProcessId | None:
    """The process `path` records; None when the file is absent, unreadable, or holds a pid
    without its start time (the older format: it cannot be told from a reused pid)."""
    try:
        fields = Path(path).read_text().split()
    except OSError:
        return None
    if len(fields) != 2 or not all(f.isdigit() for f in fields):
        return None
    return ProcessId(int(fields[0]), int(fields[1]))


def live_pid(path: str | os.PathLike) -> int | None:
    """The pid `path` records while that very process runs; None otherwise."""
    found = read_pid_file(path)
    return found.pid if found is not None and found.running() else None
