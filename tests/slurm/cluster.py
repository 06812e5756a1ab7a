"""The test cluster's lifetime: started for the first test that needs it, stopped after the last.

Every pytest process that uses the cluster (each of `make test`'s workers, and a second
pytest run on the same machine alike) holds a lease while it does: a file named by its pid
and holding its start time, in STATE. The first to come runs tests/slurm/start_slurm.sh,
which lists the daemons it started, those that were not running before it; the last lease
released stops exactly those, checked by pid and start time. A cluster found running is
left as it was found, and so is munged where only munged was running. A lease whose process
died (a killed pytest) no longer counts, so the next run's last lease still stops them.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from specbuild.infra.run_lock import process_start, same_process

# root's: starting the daemons needs root anyway
STATE = Path(os.environ.get("SPECBUILD_SLURM_STATE", "/run/specbuild-slurm-test"))
STARTED = "started"  # "<daemon> <pid> <start time>" a line: what the tests started
LEASE = "lease."  # + pid; holds the process's start time
STOP_WAIT_S = 30  # slurmctld saves its state on SIGTERM; then it is killed
KILL_WAIT_S = 10


class ClusterLease:
    """This process's claim on the test cluster (`acquire`, then `release`)."""

    def __init__(self, state: Path = STATE, pid: int | None = None) -> None:
        self.state = state
        self.pid = os.getpid() if pid is None else pid

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.state.mkdir(parents=True, exist_ok=True)
        with open(self.state / "lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def _live_leases(self) -> list[int]:
        """The pids of the leases whose process still runs; a dead one's file is removed."""
        live = []
        for f in sorted(self.state.glob(LEASE + "*")):
            pid = int(f.name.removeprefix(LEASE))
            text = f.read_text().strip()
            if text and same_process(pid, int(text)):
                live.append(pid)
            else:
                f.unlink()
        return live

    def _record(self, started_by_script: Path) -> None:
        """Add what the start script reported to STARTED, with each daemon's start time."""
        if not started_by_script.is_file():
            return
        lines = []
        for line in started_by_script.read_text().split("\n"):
            if line.strip():
                name, pid = line.split()
                start = process_start(int(pid))
                if start is not None:
                    lines.append(f"{name} {pid} {start}\n")
        started_by_script.unlink()
        with open(self.state / STARTED, "a") as fh:
            fh.writelines(lines)

    def _stop_unused(self) -> list[str]:
        """With no live lease left, stop what the tests started (last first); their names."""
        record = self.state / STARTED
        if self._live_leases() or not record.is_file():
            return []
        started = [line.split() for line in record.read_text().split("\n") if line.strip()]
        stopped = []
        for name, pid, start in reversed(started):
            if stop_process(int(pid), int(start)):
                stopped.append(name)
        record.unlink()
        return stopped

    def acquire(self, start: Callable[[Path], str]) -> str:
        """Run `start` (given the file where it lists the daemons it starts) under the lock,
        then hold a lease; returns what `start` returned. A failing `start` leaves no lease,
        and what it did start is stopped unless another process holds a lease."""
        with self._locked():
            listed = self.state / f"started-by.{self.pid}"
            listed.unlink(missing_ok=True)
            try:
                result = start(listed)
            except BaseException:
                self._record(listed)
                self._stop_unused()
                raise
            self._record(listed)
            start_time = process_start(self.pid)
            (self.state / f"{LEASE}{self.pid}").write_text(f"{start_time}\n")
            return result

    def release(self) -> list[str]:
        """Drop this process's lease; the last one stops what the tests started. Returns the
        names of the daemons stopped."""
        with self._locked():
            (self.state / f"{LEASE}{self.pid}").unlink(missing_ok=True)
            return self._stop_unused()


def stop_process(pid: int, start: int, wait_s: float = STOP_WAIT_S) -> bool:
    """SIGTERM the process `pid` if it is still the one that started at `start`, wait for it
    to end, SIGKILL it after `wait_s`; False when it had already gone."""
    if not same_process(pid, start):
        return False
    for sig, wait in ((signal.SIGTERM, wait_s), (signal.SIGKILL, KILL_WAIT_S)):
        os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while same_process(pid, start) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not same_process(pid, start):
            return True
    raise RuntimeError(f"process {pid} did not end on SIGTERM nor SIGKILL")
