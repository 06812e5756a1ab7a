"""Keepers: one engine for every job of a run that asks for the same one.

Why: at Kimi-K2.5's size loading an engine is the unit of cost (~10 minutes to load its
weights), and an engine per shard pays it per shard. Here the first job that needs an engine
starts a keeper process that loads it; each job that asks for the same engine while it runs
takes a lease and uses it. Every shard stays its own job, file and rerun decision. Two kinds
build on this module: `server` (an SGLang server for generation, engines.kept_server) and
`features` (a feature engine for the hidden stage, engines.kept_model).

A keeper stops its engine when no lease has been held for `idle_s`, when another engine is
about to start on its GPUs or a training claims them (`release_idle`: the memory is theirs
now), and at the end of the run (`stop_all`, from the Snakefile's onsuccess/onerror) unless
another live run in the directory has used it (runs/): two runs at once in one directory
share engines, and one ending must not take the other's away.

Inside a SLURM allocation (a cluster job of `profiles/slurm`, often a group of one stage's
shards) the keepers live in a folder on the node's own disk, and the allocation's keeper host
(engines.keeper_host, started by the allocation's Snakemake) starts them: Snakemake runs each
job in a job step of its own, whose processes end with it, while the host and its keepers
live until the allocation's Snakemake exits. Without a host (an allocation not started by
Snakemake) a job shares nothing (`sharing_allowed`).

A keeper runs the requests it finds in its folder, as the user who started it, and a job trusts
the pid and answers it finds there: the registry (`.specbuild/` included) and every folder in
it is created 0700 whatever the umask, and used only while it is this user's and no one else
can write it (specbuild.infra.private_dirs); a pid is trusted only with its process's start time
(specbuild.infra.pidfile).

Why not Snakemake's service jobs: a service runs in one group with all its consumers at once,
so every shard of the stage would be in flight together in one cluster job, and the per-shard
resource accounting and rerun decisions would be lost.

    <registry>/<kind>-<hash>/  lock        flock: leases and the keeper's stop exclude each other
                               spec.json   what the keeper runs, and on which GPUs (0600)
                               keeper.pid  the keeper process; absent once it has stopped
                               failed.txt  why the engine did not start, or died
                               stop        asks the keeper to stop once no lease is held
                               leases/<pid>-<hex>  one per job using it, flock'ed meanwhile
                               runs/<run id>  each run whose jobs used it ($SPECBUILD_RUN)
                               keeper.log  the keeper's and its engine's output
    <registry>/host/            host.pid    an allocation's keeper host
                                requests/   keepers the host is asked to start (0600)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.infra.io import atomic_open, pid_alive
from specbuild.infra.pidfile import live_pid, read_pid_file, write_pid_file
from specbuild.infra.private_dirs import UnsafeFolderError, check_private_dir, private_dir
from specbuild.infra.run_lock import RUN_ENV, run_ended

__all__ = [
    "KEEPER_LOG",
    "POLL_S",
    "REGISTRY_ENV",
    "Lease",
    "keeper_running",
    "fail",
    "host_folder",
    "host_running",
    "keeper_key",
    "lease",
    "lease_held",
    "log_tail",
    "open_registry",
    "process_running",
    "registry",
    "release_idle",
    "serve_until_idle",
    "spawn_keeper",
    "sharing_allowed",
    "stop_all",
    "keeper_env",
    "keeper_pid",
    "write_text",
]

log = logging.getLogger("specbuild")

REGISTRY_ENV = "SPECBUILD_KEEPERS"  # where the keepers live; default below the cwd
DEFAULT_REGISTRY = ".specbuild/keepers"
KEEPER_LOG = "keeper.log"
POLL_S = 0.5
STOP_WAIT_S = 120.0  # stop_all/release_idle: how long to wait for keepers to exit
HOST_WAIT_S = 60.0  # a job's wait for the allocation's keeper host to start a keeper


def registry() -> Path:
    """Where the keepers live: SPECBUILD_KEEPERS, else inside a SLURM allocation a folder of
    the node's (the shared filesystem is seen by other nodes, whose pids mean nothing here),
    else below the working directory."""
    given = os.environ.get(REGISTRY_ENV)
    if given:
        return Path(given).resolve()
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        node = Path(os.environ.get("TMPDIR") or "/tmp")
        return (node / f"specbuild-keepers-{os.getuid()}-{job}").resolve()
    return Path(DEFAULT_REGISTRY).resolve()


def open_registry() -> Path:
    """The registry, created 0700 (with `.specbuild/` where it is the default one) or checked
    to be this user's alone; raises UnsafeFolderError otherwise."""
    root = registry()
    if root == Path(DEFAULT_REGISTRY).resolve():
        private_dir(root.parent)
    return private_dir(root)


def _existing_registry() -> Path | None:
    """The registry if it exists and is this user's alone; None if absent, or unsafe (said):
    stopping keepers must not act on files someone else could have put there."""
    root = registry()
    if not root.is_dir():
        return None
    try:
        return check_private_dir(root)
    except UnsafeFolderError as err:
        log.warning("%s", err)
        return None


def host_folder() -> Path:
    """The allocation's keeper host's folder (engines.keeper_host)."""
    return registry() / "host"


def open_host_folder() -> Path:
    """The host's folder, created 0700 or checked (`open_registry`)."""
    return private_dir(open_registry() / "host")


def host_running() -> bool:
    """Whether this SLURM allocation has a running keeper host."""
    root, folder = registry(), host_folder()
    if not root.is_dir():
        return False
    check_private_dir(root)  # a host.pid someone else wrote must not route requests there
    if not folder.is_dir():
        return False
    return live_pid(check_private_dir(folder) / "host.pid") is not None


def sharing_allowed(idle_s: float) -> bool:
    """Whether a job shares an engine: asked to (idle_s > 0), and outside a SLURM allocation or
    inside one whose keeper host runs (a job step's own children end with the step)."""
    return idle_s > 0 and (not os.environ.get("SLURM_JOB_ID") or host_running())


def keeper_key(kind: str, ident: Mapping[str, Any]) -> str:
    """`<kind>-<hash>`: the folder of the keeper whose engine `ident` determines, on this
    process's GPUs."""
    whole = {**ident, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    digest = hashlib.sha256(json.dumps(whole, sort_keys=True).encode()).hexdigest()[:16]
    return f"{kind}-{digest}"


def process_running(pid: int) -> bool:
    """Whether process `pid` still runs; an exited child of ours (a keeper this process
    started) is reaped here, so it does not linger as a zombie."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False  # our child, exited, reaped now
    except ChildProcessError:
        pass  # not our child
    return pid_alive(pid)


def keeper_pid(folder: Path) -> int | None:
    """The pid of the keeper of `folder` while that very process runs; None once it has
    stopped or never started. keeper.pid holds the pid and the process's start time
    (infra.pidfile): a dead keeper's pid reused by another process, or a pid recorded
    without its start time, is not taken for the keeper."""
    return live_pid(folder / "keeper.pid")


def keeper_running(folder: Path) -> bool:
    """Whether the keeper of `folder` runs (False: it has stopped, or never started)."""
    return keeper_pid(folder) is not None


def write_text(path: Path, text: str) -> None:
    # whole or absent: jobs poll for these files and read them at once
    with atomic_open(path) as fh:
        fh.write(text)


def log_tail(folder: Path, lines: int = 20) -> str:
    """The last lines of the keeper's log, for an error message."""
    try:
        text = (folder / KEEPER_LOG).read_text(errors="replace")
    except OSError:
        return "(no keeper.log)"
    return "\n".join(text.splitlines()[-lines:])


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder / "lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def lease_held(path: Path) -> bool:
    """Whether the holder of lease file `path` still holds it (False: no file, or a dead
    holder's, which is removed)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        path.unlink(missing_ok=True)  # its holder died without removing it
        return False
    finally:
        os.close(fd)


def _live_leases(folder: Path) -> int:
    """Leases whose holder still runs; those of dead holders are removed."""
    return sum(lease_held(path) for path in (folder / "leases").glob("*"))


def _start_keeper(
    folder: Path, spec: Mapping[str, Any], module: str, idle_s: float, stale: tuple[str, ...]
) -> None:
    for stale_file in ("failed.txt", "stop", *stale):
        (folder / stale_file).unlink(missing_ok=True)
    # whole or absent: release_idle reads it without the lock
    spec = {**spec, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    _write_private_json(folder / "spec.json", spec)
    argv = [sys.executable, "-m", module, str(folder), str(idle_s)]
    if os.environ.get("SLURM_STEP_ID"):
        _ask_host(argv, folder)
        return
    spawn_keeper(argv, folder, env=keeper_env())


def _write_private_json(path: Path, data: Mapping[str, Any]) -> None:
    """`data` as `path`, whole or absent (written beside it, then renamed), and 0600 from its
    first byte: specs and requests may hold keys (infra.io's atomic writers give the user's
    default mode)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def keeper_env() -> dict[str, str]:
    """This job's environment but its run's id: a keeper is shared across runs and outlives
    them, so it must not make the run that started it look live (run_lock)."""
    return {k: v for k, v in os.environ.items() if k != RUN_ENV}


def spawn_keeper(
    argv: list[str], folder: Path, *, cwd: str | None = None, env: Mapping[str, str] | None = None
) -> subprocess.Popen:
    """Start `argv` as the keeper of `folder`, its output in keeper.log, and record its pid."""
    with open(folder / KEEPER_LOG, "a") as out:
        # its own process group: it outlives the job that started it (Snakemake ends a job's
        # group), and stays in the run's session, which a terminal or batch system cleans up
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
    write_pid_file(folder / "keeper.pid", proc.pid)
    return proc


def _ask_host(argv: list[str], folder: Path) -> None:
    """Have the allocation's keeper host start `argv` as the keeper of `folder`, with this job's
    environment (its GPUs, its Python's), and wait until it has. The request is 0600 and
    removed once read: the environment may hold keys."""
    (folder / "keeper.pid").unlink(missing_ok=True)  # a dead keeper's
    requests = private_dir(open_host_folder() / "requests")
    request = {"argv": argv, "cwd": os.getcwd(), "env": keeper_env(), "folder": str(folder)}
    _write_private_json(requests / f"{folder.name}.json", request)
    deadline = time.monotonic() + HOST_WAIT_S
    while not (folder / "keeper.pid").exists():
        if not host_running() or time.monotonic() > deadline:
            raise RuntimeError(
                f"the allocation's keeper host ({host_folder()}) did not start the keeper of "
                f"{folder} within {HOST_WAIT_S:.0f} s"
            )
        time.sleep(POLL_S / 5)


@dataclass(frozen=True)
class Lease:
    folder: Path  # the keeper's
    tag: str  # this lease's name under leases/, unique to the job


@contextmanager
def lease(
    key: str,
    *,
    spec: Mapping[str, Any],
    module: str,
    idle_s: float,
    name: str,
    stale: tuple[str, ...] = (),
) -> Iterator[Lease]:
    """A lease on the keeper `key`, started as `python -m module <folder> <idle_s>` over
    `spec` (spec.json) if none runs; held until the block ends. `stale`: files of the kind's
    own that a dead keeper may have left, removed before a new one starts."""
    folder = private_dir(open_registry() / key)
    private_dir(folder / "leases")
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    path = folder / "leases" / tag
    # locked before it is in leases/: a lease seen there unlocked is a dead holder's
    fd = os.open(folder / f".lease-{tag}", os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(folder / f".lease-{tag}", path)
    run = os.environ.get(RUN_ENV)
    if run:  # this run uses it: another run's end leaves it running (stop_all)
        private_dir(folder / "runs")
        (folder / "runs" / run).touch()
    try:
        with _locked(folder):
            if keeper_running(folder) and not (folder / "failed.txt").exists():
                log.info("%s: sharing the engine kept in %s", name, folder)
            else:
                log.info("%s: starting a shared engine, kept in %s", name, folder)
                _start_keeper(folder, spec, module, idle_s, stale)
        yield Lease(folder, tag)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def serve_until_idle(
    folder: Path, idle_s: float, *, tick: Callable[[], None], stop: Callable[[], None]
) -> None:
    """The keeper's loop: call `tick` every POLL_S (serve, check the engine; it raises if the
    engine died) until no lease has been held for `idle_s` or a stop was asked, then call
    `stop`, under the lock: a job arriving meanwhile waits, then starts a new keeper."""
    idle_since = None
    while True:
        tick()
        with _locked(folder):
            if _live_leases(folder):
                idle_since = None
            else:
                idle_since = idle_since or time.monotonic()
                if (folder / "stop").exists() or time.monotonic() - idle_since >= idle_s:
                    (folder / "keeper.pid").unlink(missing_ok=True)
                    stop()
                    return
        time.sleep(POLL_S)


def fail(folder: Path, why: str) -> None:
    """Record why the keeper's engine stopped serving; jobs read it (failed.txt)."""
    write_text(folder / "failed.txt", why)
    log.error("%s", why)


def _ask_stop(folders: list[Path], why: str) -> None:
    """Ask these keepers to stop once no lease is held, and wait until they have."""
    waiting = []
    for folder in folders:
        found = read_pid_file(folder / "keeper.pid")
        if found is not None and found.running():  # else stopped, or never started
            write_text(folder / "stop", why)
            waiting.append(found)
    # by process, not keeper.pid: the keeper removes that before it stops its engine and exits
    deadline = time.monotonic() + STOP_WAIT_S
    for found in waiting:
        while found.running() and time.monotonic() < deadline:
            time.sleep(POLL_S / 5)


def _own(folder: Path) -> bool:
    """Whether `folder` is kept by this process (a keeper starting its engine)."""
    return keeper_pid(folder) == os.getpid()


def release_idle(gpus: str | None = None, *, keep: str | None = None) -> None:
    """Stop the keepers, of every kind, on GPUs `gpus` (CUDA_VISIBLE_DEVICES ids; None: this
    process's) that no job is using, except the one of key `keep`: another engine or a
    training is about to need their memory."""
    root = _existing_registry()
    if root is None:
        return
    mine = set(filter(None, (gpus or os.environ.get("CUDA_VISIBLE_DEVICES", "")).split(",")))
    idle = []
    for folder in root.iterdir():
        spec = folder / "spec.json"
        if folder.name == keep or _own(folder) or not spec.is_file():
            continue
        if not keeper_running(folder):
            continue
        try:
            gpus = json.loads(spec.read_text()).get("gpus", "")
        except (OSError, ValueError):
            continue  # replaced or removed meanwhile: not an idle keeper to stop now
        theirs = set(filter(None, str(gpus).split(",")))
        if (not mine or not theirs or mine & theirs) and _live_leases(folder) == 0:
            idle.append(folder)
    if idle:
        log.info("stopping %d idle shared engine(s) on these GPUs", len(idle))
        _ask_stop(idle, "released for another job's engine")


def stop_all() -> None:
    """Stop every keeper of this working directory, of every kind (the end of a run), but
    those another live run has used, and wait until they have exited."""
    root = _existing_registry()
    if root is None:
        return
    stopping, kept = [], {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        others = _other_live_runs(folder, os.environ.get(RUN_ENV, ""))
        if others:
            kept[folder.name] = others
        else:
            stopping.append(folder)
    for name, others in kept.items():
        log.info("leaving the shared engine %s running: run(s) %s use it", name, ", ".join(others))
    _ask_stop(stopping, "the run ended")


def _other_live_runs(folder: Path, run: str) -> list[str]:
    """The runs but `run` that used the keeper of `folder` and have not ended (a run on
    another host counts as live: it cannot be told here); ended runs' marks are removed."""
    marks = folder / "runs"
    if run:
        (marks / run).unlink(missing_ok=True)
    live = []
    for mark in sorted(marks.glob("*")) if marks.is_dir() else []:
        if run_ended(mark.name):
            mark.unlink(missing_ok=True)
        else:
            live.append(mark.name)
    return live
