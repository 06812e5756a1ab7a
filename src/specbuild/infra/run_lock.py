"""Snakemake's locks, owned by runs: one writer per output, whatever runs at once.

Contract: Snakemake locks the files a run will write (and read) in `.snakemake/locks/`, and a
second run whose files overlap them stops. It allows runs whose files do not overlap, but the
pinned Snakemake ends every run by deleting the whole lock folder, a live run's locks too; a
third run on that live run's files then starts beside it, two writers on one shard or one
checkpoint folder. And a lock left by a killed run blocks every later run until
`snakemake --unlock`, which deletes live runs' locks as well.

Here every lock file names the run that wrote it (`RunOwner`: host, pid and the process's start
time, which a reused pid does not share; the run's targets), on a first line Snakemake reads
as a file name no job has. A run is live while its snakemake process is, or while a job it
started still runs (an orphan of a killed snakemake: jobs inherit the run's id in
`$SPECBUILD_RUN`). `specbuild.infra.snakemake_locks` makes Snakemake write, check and delete its
locks through this module, so a run deletes only its own locks; a run that would write a live
run's files is refused, naming that run; the locks of a run that is no longer live are
removed, said in one line; those of a run this machine cannot see (another host, or a cluster
running its jobs) only by `snakemake --unlock`, after checking. A lock file without an owner
(written by a Snakemake without specbuild's Snakefile) counts as live while any snakemake
process (or job of one) works in the directory (`lock_holders`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "LOCK_DIR",
    "RUN_ENV",
    "Holder",
    "LockFile",
    "RunOwner",
    "is_locked",
    "is_snakemake_process",
    "lock_holders",
    "process_start",
    "read_lock_files",
    "run_ended",
    "run_state",
    "runs_with_live_jobs",
    "same_process",
    "this_run",
    "write_lock_file",
]

PROC = Path("/proc")
LOCK_DIR = Path(".snakemake") / "locks"
# A run's id, inherited by every job it starts: an orphaned job still counts as its run.
RUN_ENV = "SPECBUILD_RUN"
# The owner line of a lock file; Snakemake reads it as one more locked path, which no job has.
_OWNER = "# specbuild run "


@dataclass(frozen=True)
class Holder:
    """A live snakemake process (or job of one) working in a directory."""

    pid: int
    command: str
    why: str  # "works in <dir>" or "working directory unreadable (assumed here)"


@dataclass(frozen=True)
class RunOwner:
    """The snakemake run that wrote a lock file."""

    host: str
    pid: int
    start: int  # clock ticks after boot the process started at (/proc/PID/stat, field 22)
    started: str = ""  # wall-clock time, for messages
    targets: tuple[str, ...] = field(default=())
    jobs_elsewhere: bool = False  # its jobs run where this machine cannot see them (a cluster)

    @property
    def run_id(self) -> str:
        return f"{self.host}:{self.pid}:{self.start}"

    def describe(self) -> str:
        where = "" if self.host == socket.gethostname() else f" on host {self.host}"
        shown = ", ".join(self.targets[:4]) + (" ..." if len(self.targets) > 4 else "")
        return f"pid {self.pid}{where} (started {self.started}; targets: {shown or 'all'})"


@dataclass(frozen=True)
class LockFile:
    """One of Snakemake's lock files: the paths it locks, for input or output, and its run."""

    path: Path
    kind: str  # "input" | "output"
    files: frozenset[str]
    owner: RunOwner | None


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


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (the state) on; None when the process is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def process_start(pid: int) -> int | None:
    """The start time of a live process, in clock ticks after boot; None if gone or a zombie."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22


def same_process(pid: int, start: int) -> bool:
    """Whether process `pid` is still the one that started at `start`: every pid specbuild
    records (a run's locks, keeper.pid, host.pid) is checked this way, never by the pid
    alone, which a new process gets once the old one exits."""
    return process_start(pid) == start


def this_run(targets: Iterable[str] = (), *, jobs_elsewhere: bool = False) -> RunOwner:
    """The owner record of this process's run."""
    start = process_start(os.getpid())
    if start is None:
        raise OSError("no /proc here: a run cannot record itself as the owner of its locks")
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    here = socket.gethostname()
    return RunOwner(here, os.getpid(), start, started, tuple(targets), jobs_elsewhere)


def _ancestors() -> set[int]:
    """This process and its parents (the make or shell that started it is no lock holder)."""
    pids, pid = set(), os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        fields = _stat_fields(pid)
        if fields is None:
            break
        pid = int(fields[1])  # field 4
    return pids


def _processes() -> Iterable[tuple[int, list[str], Path]]:
    """(pid, argv, /proc entry) of every live process but this one's ancestors; raises
    OSError where processes cannot be listed (no /proc)."""
    if not (PROC / "self" / "stat").exists():
        raise OSError("no /proc here: cannot tell whether a snakemake run is live")
    skip = _ancestors()
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            argv = [a for a in (entry / "cmdline").read_text(errors="replace").split("\0") if a]
        except OSError:
            continue  # exited meanwhile
        fields = _stat_fields(int(entry.name))
        if argv and fields and fields[0] not in ("Z", "X"):
            yield int(entry.name), argv, entry


def _snakemake_processes() -> Iterable[tuple[int, list[str], Path]]:
    """_processes() that are a snakemake process or job."""
    return ((p, a, e) for p, a, e in _processes() if is_snakemake_process(a))


def lock_holders(workdir: str | os.PathLike) -> list[Holder]:
    """Live snakemake processes (and jobs) working in `workdir`, by pid; raises OSError
    where processes cannot be listed (no /proc)."""
    here = Path(os.path.realpath(workdir))
    holders = []
    for pid, argv, entry in _snakemake_processes():
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
        holders.append(Holder(pid, " ".join(argv)[:200], why))
    return sorted(holders, key=lambda h: h.pid)


def runs_with_live_jobs() -> dict[str, list[int]]:
    """{run id: pids of its live jobs}, from the id each job carries in its environment
    ($SPECBUILD_RUN), and so does every process a job starts: a training's torchrun workers
    outlive a killed job script, and still write its outputs (kept engines are started
    without it: they outlive runs by design)."""
    runs: dict[str, list[int]] = {}
    prefix = f"{RUN_ENV}=".encode()
    for pid, _argv, entry in _processes():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for run in {e[len(prefix) :].decode() for e in environ if e.startswith(prefix)}:
            runs.setdefault(run, []).append(pid)
    return runs


def run_state(owner: RunOwner, jobs: dict[str, list[int]] | None = None) -> str:
    """ "live": its snakemake process (the same one: pid and start time) or a job it started
    runs here; "unseen": it ran on another host, or its snakemake ended while its jobs ran on
    a cluster, where this machine cannot look; "ended" otherwise. `jobs`:
    `runs_with_live_jobs()` when already read."""
    if owner.host != socket.gethostname():
        return "unseen"
    if same_process(owner.pid, owner.start):
        return "live"
    if owner.run_id in (runs_with_live_jobs() if jobs is None else jobs):
        return "live"
    return "unseen" if owner.jobs_elsewhere else "ended"


def run_ended(run_id: str | None = None) -> bool:
    """Whether the snakemake run that started this job (`run_id`, default $SPECBUILD_RUN) has
    ended: the job finishes as an orphan, and no run records its outputs. False where that
    cannot be told (not started by a run, another host)."""
    run_id = os.environ.get(RUN_ENV, "") if run_id is None else run_id
    host, pid, start = (run_id.rsplit(":", 2) + ["", ""])[:3]
    if host != socket.gethostname() or not pid.isdigit() or not start.isdigit():
        return False
    return not same_process(int(pid), int(start))


def _owner_of(first_line: str) -> RunOwner | None:
    if not first_line.startswith(_OWNER):
        return None
    try:
        record = json.loads(first_line[len(_OWNER) :])
        record["targets"] = tuple(record.get("targets", ()))
        return RunOwner(**record)
    except (ValueError, TypeError):
        return None  # not ours after all: treated as a lock without an owner


def read_lock_files(workdir: str | os.PathLike) -> list[LockFile]:
    """The lock files of `workdir` (Snakemake's names: N.input.lock, N.output.lock)."""
    locks = []
    for path in sorted((Path(workdir) / LOCK_DIR).glob("*.lock")):
        number, _, kind = path.name[: -len(".lock")].partition(".")
        if not number.isdigit() or kind not in ("input", "output"):
            continue
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue  # removed meanwhile
        owner = _owner_of(lines[0]) if lines else None
        files = frozenset(line.strip() for line in lines[1 if owner else 0 :] if line.strip())
        locks.append(LockFile(path, kind, files, owner))
    return locks


def write_lock_file(
    workdir: str | os.PathLike, kind: str, files: Iterable[str], owner: RunOwner
) -> Path:
    """A new lock file of `kind` for `files`, its owner on the first line, under the first
    free number; written whole before it gets its name (a reader never sees half of it)."""
    lockdir = Path(workdir) / LOCK_DIR
    lockdir.mkdir(parents=True, exist_ok=True)
    tmp = lockdir / f".{kind}.{os.getpid()}.tmp"
    tmp.write_text(_OWNER + json.dumps(asdict(owner)) + "\n" + "".join(f"{f}\n" for f in files))
    try:
        for n in range(10_000):
            path = lockdir / f"{n}.{kind}.lock"
            try:
                os.link(tmp, path)  # fails where the name is taken: never another run's file
            except FileExistsError:
                continue
            return path
        raise OSError(f"{lockdir}: no free lock file name")
    finally:
        tmp.unlink(missing_ok=True)
