"""Snakemake's locks taken, checked and freed per run (`specbuild.infra.run_lock` says why).

`one_writer_per_output` replaces four methods of Snakemake's file persistence (the default
backend; `--nolock` takes no lock at all):

- `lock`: under a mutex (flock), removes the locks of runs no longer live, refuses a run whose
  files overlap a live run's (naming its pid and targets; nothing starts), notes a live run it
  goes on beside, then writes this run's lock files with their owner.
- `lock_warn_only`, a dry-run's: says what a run would meet (Snakemake's says "Another
  Snakemake instance is running" for a killed run's lock too).
- `_delete_locks`, at a run's end: its own lock files only (Snakemake deleted the folder, live
  runs' locks included).
- `cleanup_locks`, `snakemake --unlock`: every lock but live runs' (those of a run this
  machine cannot see too: the user checked, `squeue`).

And two commands that delete without taking any lock: `--delete-all-output` and
`--delete-temp-output` (the DAG's `clean`) and `--cleanup-metadata` (the persistence's
`cleanup_metadata`) are refused, naming the run, when what they would delete is a file a live
run writes or reads (its inputs, the target's fingerprint, the shards it trains on); the
deletion holds the mutex, so no run starts on those files meanwhile.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specbuild.infra.run_lock import (
    LOCK_DIR,
    RUN_ENV,
    LockFile,
    RunOwner,
    lock_holders,
    read_lock_files,
    run_state,
    runs_with_live_jobs,
    same_process,
    this_run,
    write_lock_file,
)

__all__ = ["one_writer_per_output"]

MUTEX = "owners.mutex"  # not *.lock: Snakemake reads only N.input.lock, N.output.lock
MAX_LISTED = 3


def _say(message: str) -> None:
    print(f"specbuild: {message}", file=sys.stderr, flush=True)


@contextmanager
def _mutex(workdir: Path) -> Iterator[None]:
    """One run at a time checks and writes locks: two runs starting together cannot both
    find the other's files unlocked."""
    lockdir = workdir / LOCK_DIR
    lockdir.mkdir(parents=True, exist_ok=True)
    with open(lockdir / MUTEX, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _states(workdir: Path, locks: list[LockFile]) -> dict[Path, str]:
    """Each lock file's run: "live", "ended" or "unseen" (`run_state`); a lock naming no run
    is live while a snakemake process works here, unseen where processes cannot be listed."""
    if not locks:
        return {}
    try:
        jobs = runs_with_live_jobs()
        holders = lock_holders(workdir) if any(not lk.owner for lk in locks) else []
    except OSError:
        return {lk.path: "unseen" for lk in locks}
    unowned = "live" if holders else "ended"
    return {lk.path: run_state(lk.owner, jobs) if lk.owner else unowned for lk in locks}


def _who(lock: LockFile, state: str, workdir: Path) -> str:
    if lock.owner and state == "live" and not same_process(lock.owner.pid, lock.owner.start):
        jobs = ", ".join(str(p) for p in _pids_to_stop(lock.owner))
        return f"the run {lock.owner.describe()}, its snakemake killed, its jobs live (pid {jobs})"
    if lock.owner and state == "live":
        return f"the live run {lock.owner.describe()}"
    if lock.owner:
        return (
            f"the run {lock.owner.describe()}, whose jobs this machine cannot see (another "
            "host, or a cluster)"
        )
    if state == "live":
        pids = ", ".join(str(h.pid) for h in lock_holders(workdir))
        return f"a lock that names no run, while snakemake processes work here (pid {pids})"
    return "a lock that names no run, and no /proc here to tell whether a run is live"


def _files(files: set[str]) -> str:
    shown = sorted(files)[:MAX_LISTED]
    more = f" and {len(files) - len(shown)} more" if len(files) > len(shown) else ""
    return ", ".join(shown) + more


def _remove(locks: list[LockFile]) -> None:
    for lock in locks:
        lock.path.unlink(missing_ok=True)


def _describe_dead(lock: LockFile) -> str:
    return lock.owner.describe() if lock.owner else "a lock that names no run"


def _run_targets(dag) -> list[str]:
    files = sorted(str(f) for f in getattr(dag, "targetfiles", ()) or ())
    rules = sorted(getattr(r, "name", str(r)) for r in getattr(dag, "targetrules", ()) or ())
    return files + rules


def _overlap(lock: LockFile, inputs: set[str], outputs: set[str]) -> set[str]:
    """Snakemake's rule: an input lock conflicts with our outputs, an output lock with our
    outputs and inputs."""
    return lock.files & (outputs if lock.kind == "input" else outputs | inputs)


def _pids_to_stop(owner: RunOwner) -> list[int]:
    """A live run's snakemake, or where it was killed, the jobs of it that still run."""
    if same_process(owner.pid, owner.start):
        return [owner.pid]
    return sorted(runs_with_live_jobs().get(owner.run_id, []))


def _refusal(
    conflicts: list[tuple[LockFile, set[str]]],
    states: dict,
    workdir: Path,
    *,
    doing: str = "this run would write",
    nothing: str = "Nothing was started",
) -> str:
    lines = [f"specbuild: {doing} files that a live run writes or reads:"]
    pids: set[str] = set()
    unseen = False
    for lock, files in conflicts:
        state = states[lock.path]
        lines.append(f"  {_who(lock, state, workdir)} locks {_files(files)}")
        if lock.owner and state == "live":
            pids |= {str(p) for p in _pids_to_stop(lock.owner)}
        unseen |= state == "unseen"
    stop = f" or stop it (kill {' '.join(sorted(pids))})" if pids else ""
    lines.append(
        f"  {nothing}. Wait for it to end{stop}, then run the same command again; "
        "runs on other files go on side by side."
    )
    if unseen:
        lines.append(
            "  A run this machine cannot see: once none of its jobs runs (squeue -u $USER), "
            "snakemake --unlock removes its locks."
        )
    return "\n".join(lines)


def _check(self, workdir: Path, *, dry_run: bool) -> tuple[set[str], set[str]]:
    """This run's (inputs, outputs), checked against the locks here: those of runs no longer
    live removed (a dry-run only says it would), a live run's overlap refused (a dry-run only
    says it would be), a live run beside this one noted."""
    inputs = {str(f) for f in self.all_inputfiles()}
    outputs = {str(f) for f in self.all_outputfiles()}
    locks = read_lock_files(workdir)
    states = _states(workdir, locks)
    dead = [lk for lk in locks if states[lk.path] == "ended"]
    if dead:
        runs = "; ".join(sorted({_describe_dead(lk) for lk in dead}))
        if dry_run:
            _say(f"the locks of a run that is no longer live ({runs}) go when a run starts")
        else:
            _remove(dead)
            _say(
                f"removed the locks of a run that is no longer live ({runs}): it was killed; "
                "the jobs it left unfinished rerun with --rerun-incomplete"
            )
    others = [lk for lk in locks if states[lk.path] != "ended"]
    conflicts = [(lk, f) for lk in others if (f := _overlap(lk, inputs, outputs))]
    if conflicts and dry_run:
        _say("a run of these targets now would be refused (a dry-run goes on):")
        print(_refusal(conflicts, states, workdir), file=sys.stderr, flush=True)
    elif conflicts:  # the message alone: Snakemake's errors carry frames and --unlock advice
        raise SystemExit(_refusal(conflicts, states, workdir))
    beside = sorted({lk.owner.describe() for lk in others if lk.owner})
    if beside and not conflicts:
        _say(
            f"a live run works here too ({'; '.join(beside)}); this run writes none of its "
            "files and reads none it writes, so both go on"
        )
    return inputs, outputs


@contextmanager
def _lock(self) -> Iterator[None]:
    workdir = Path(self._lockdir).parents[1]
    elsewhere = not self.dag.workflow.local_exec
    owner = this_run(_run_targets(self.dag), jobs_elsewhere=elsewhere)
    with _mutex(workdir):
        inputs, outputs = _check(self, workdir, dry_run=False)
        self._lockfile = {}
        for kind, files in (("input", inputs), ("output", outputs)):
            if files:
                self._lockfile[kind] = str(write_lock_file(workdir, kind, sorted(files), owner))
    try:
        yield
    finally:
        self.unlock()


@contextmanager
def _lock_warn_only(self) -> Iterator[None]:
    """A dry-run's check: what a run would meet, said, nothing removed or written."""
    _check(self, Path(self._lockdir).parents[1], dry_run=True)
    yield


def _delete_own_locks(self) -> None:
    for path in self._lockfile.values():
        Path(path).unlink(missing_ok=True)
    self._lockfile.clear()


def _cleanup_locks(self) -> None:
    workdir = Path(self._lockdir).parents[1]
    with _mutex(workdir):
        locks = read_lock_files(workdir)
        states = _states(workdir, locks)
        _remove([lk for lk in locks if states[lk.path] != "live"])
        kept = [lk for lk in locks if states[lk.path] == "live"]
    for who in sorted({_who(lk, "live", workdir) for lk in kept}):
        _say(f"kept the locks of {who}: unlock removes only the locks of runs no longer live")


def _refuse_deleting_live_files(workdir: Path, files: set[str], command: str) -> None:
    """Exit with the refusal when `files` (what `command` would delete) overlap the files a
    live (or unseen) run locks, for input or output."""
    locks = read_lock_files(workdir)
    states = _states(workdir, locks)
    conflicts = [(lk, f) for lk in locks if states[lk.path] != "ended" and (f := lk.files & files)]
    if conflicts:  # the message alone, as a refused run's
        raise SystemExit(
            _refusal(
                conflicts,
                states,
                workdir,
                doing=f"{command} would delete",
                nothing="Nothing was deleted",
            )
        )


def _guard_clean(clean):
    """DAG.clean (`--delete-all-output`, `--delete-temp-output`), checked against live runs
    first and run under the mutex; a dry-run only lists."""

    def guarded(self, only_temp: bool = False, dryrun: bool = False):
        if dryrun:
            return clean(self, only_temp=only_temp, dryrun=dryrun)
        from snakemake.io import is_flagged

        workdir = Path(self.workflow.persistence._lockdir).parents[1]
        files = {
            str(f)
            for job in self.jobs
            for f in job.output
            if not only_temp or is_flagged(f, "temp")
        }
        command = "--delete-temp-output" if only_temp else "--delete-all-output"

        async def run() -> None:
            with _mutex(workdir):
                _refuse_deleting_live_files(workdir, files, command)
                await clean(self, only_temp=only_temp, dryrun=dryrun)

        return run()

    return guarded


def _guard_cleanup_metadata(cleanup_metadata):
    """`--cleanup-metadata`, checked against live runs first."""

    def guarded(self, path):
        workdir = Path(self._lockdir).parents[1]
        with _mutex(workdir):
            _refuse_deleting_live_files(workdir, {str(path)}, "--cleanup-metadata")
            return cleanup_metadata(self, path)

    return guarded


def one_writer_per_output() -> bool:
    """Put the per-run locks in place in this Snakemake (idempotent), guard its deleting
    commands, and give the jobs this run starts its id. Returns False, with a warning, where
    Snakemake's persistence differs."""
    from snakemake.persistence.file import FilePersistence as Persistence

    if getattr(Persistence, "owns_locks", False):
        return True
    methods = ("lock", "lock_warn_only", "_delete_locks", "cleanup_locks")
    if not all(hasattr(Persistence, m) for m in methods):
        _say(
            "this Snakemake's persistence has no lock methods to guard: a run ending may free "
            "another live run's locks"
        )
        return False
    try:
        os.environ[RUN_ENV] = this_run().run_id
    except OSError as err:  # no /proc (macOS): Snakemake's own locks, which a run's end frees
        _say(f"{err}; runs at once are guarded by Snakemake's own locks only")
        return False
    from snakemake.dag import DAG

    Persistence.lock = _lock
    Persistence.lock_warn_only = _lock_warn_only
    Persistence._delete_locks = _delete_own_locks
    Persistence.cleanup_locks = _cleanup_locks
    Persistence.cleanup_metadata = _guard_cleanup_metadata(Persistence.cleanup_metadata)
    DAG.clean = _guard_clean(DAG.clean)
    Persistence.owns_locks = True
    return True
