"""Stale Snakemake locks: cleared after a run that was killed, never under a live one.

Contract: Snakemake locks a working directory (files in `.snakemake/locks/`) while it runs and
removes the lock when it ends. A run killed with SIGKILL, or by a reboot, leaves the lock
behind, and the next run stops with "Directory cannot be locked" until `snakemake --unlock`.
`--unlock` deletes every lock of the directory, a live run's too, so it is safe only when no
Snakemake process works there. `lock_holders` finds such processes (Linux `/proc`): a
`snakemake` executable or module, or a job it started (`.snakemake/scripts/...`), whose
working directory is this one. `main` runs the unlock command it is given only when the
directory is locked and nothing holds it:

    python -m specbuild.run_lock -- snakemake --configfile config/config.yaml --unlock

Exit status: 0 when nothing was locked or the unlock command succeeded; 1 when a live process
holds the lock (each one named) or when processes cannot be inspected (no /proc).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Holder",
    "SAFE_UNLOCK",
    "is_locked",
    "is_snakemake_process",
    "lock_advice",
    "lock_holders",
    "main",
]

PROC = Path("/proc")
LOCK_DIR = Path(".snakemake") / "locks"
# What to run instead of Snakemake's own advice (`--unlock`), which also removes a live run's lock.
SAFE_UNLOCK = "python -m specbuild.run_lock -- snakemake --unlock"


@dataclass(frozen=True)
class Holder:
    """A live process that may hold the directory's lock."""

    pid: int
    command: str
    why: str  # "works in <dir>" or "working directory unreadable (assumed here)"


def is_locked(workdir: str | os.PathLike) -> bool:
    """Whether Snakemake's lock files exist in `workdir` (left by a live or a dead run)."""
    return any((Path(workdir) / LOCK_DIR).glob("*.lock"))


def is_snakemake_process(argv: Sequence[str]) -> bool:
    """A Snakemake process (`snakemake ...`, `python .../bin/snakemake ...`,
    `python -m snakemake ...`) or a job it runs (a script under `.snakemake/scripts/`)."""
    head = list(argv[:3])
    if any(Path(a).name == "snakemake" for a in head):
        return True
    if "-m" in head and head.index("-m") + 1 < len(argv):
        if argv[head.index("-m") + 1].split(".")[0] == "snakemake":
            return True
    return any("/.snakemake/" in a or a.startswith(".snakemake/") for a in argv)


def _ancestors() -> set[int]:
    """This process and its parents (the make or shell that started it is no lock holder)."""
    pids, pid = set(), os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        try:
            stat = (PROC / str(pid) / "stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4, after "(comm)" and the state
    return pids


def lock_holders(workdir: str | os.PathLike) -> list[Holder]:
    """Live Snakemake processes (and jobs) working in `workdir`, by pid; raises OSError
    where processes cannot be listed (no /proc)."""
    if not (PROC / "self" / "stat").exists():
        raise OSError("no /proc here: cannot tell whether a snakemake run is live")
    here = Path(os.path.realpath(workdir))
    skip = _ancestors()
    holders = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            argv = [a for a in (entry / "cmdline").read_text(errors="replace").split("\0") if a]
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # exited meanwhile
        if not argv or state in ("Z", "X") or not is_snakemake_process(argv):
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except PermissionError:
            why = "working directory unreadable (assumed here)"
        except OSError:
            continue
        else:
            if cwd != here:
                continue
            why = f"works in {here}"
        holders.append(Holder(int(entry.name), " ".join(argv)[:200], why))
    return sorted(holders, key=lambda h: h.pid)


def lock_advice(workdir: str | os.PathLike = ".") -> str | None:
    """What to do about the locks in `workdir`, said before Snakemake's "Directory cannot be
    locked" (whose `--unlock` advice is unsafe under a live run); None when nothing is locked."""
    if not is_locked(workdir):
        return None
    head = f"specbuild: {Path(workdir) / LOCK_DIR} holds a lock."
    try:
        holders = lock_holders(workdir)
    except OSError as err:
        return f"{head} {err}. If no run is live: {SAFE_UNLOCK}"
    if holders:
        pids = ", ".join(str(h.pid) for h in holders)
        return (
            f"{head} A live run holds it (pid {pids}): wait for it, or stop it (kill PID). "
            "Do not run snakemake --unlock now: it removes a live run's lock too."
        )
    return f"{head} No run is live (a killed run left it): {SAFE_UNLOCK}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specbuild.run_lock",
        description="Run UNLOCK_COMMAND only if WORKDIR holds a lock that no live run holds.",
    )
    parser.add_argument("--directory", default=".", help="Snakemake's working directory")
    parser.add_argument("unlock_command", nargs=argparse.REMAINDER, help="after --")
    args = parser.parse_args(argv)
    command = list(args.unlock_command)
    command = (command[1:] if command[:1] == ["--"] else command) or ["snakemake", "--unlock"]
    if not is_locked(args.directory):
        return 0
    lockdir = Path(args.directory) / LOCK_DIR
    try:
        holders = lock_holders(args.directory)
    except OSError as err:
        print(f"specbuild: {lockdir} exists and {err}; if no run is live: {' '.join(command)}")
        return 1
    if holders:
        print(f"specbuild: {lockdir} is held by a live run; not unlocking. Wait for it, or stop")
        print("it (kill PID, then rerun this command):")
        for h in holders:
            print(f"  pid {h.pid} ({h.why}): {h.command}")
        return 1
    print(
        f"specbuild: no snakemake process works here; removing the stale lock: {' '.join(command)}"
    )
    sys.stdout.flush()
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
