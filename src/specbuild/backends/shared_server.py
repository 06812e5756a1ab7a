"""One SGLang server for every job of a run that starts the same one (`sglang.share_server`).

Why: at Kimi-K2.5's size a server start is the unit of cost (~10 minutes to load its
weights and capture CUDA graphs), and a server per `generate`/`synthesize` shard pays it per
shard. Here the first job that needs a server starts a keeper process that runs it; each job
that asks for the same server (launcher, model, flags, environment, host and GPUs) while it runs
takes a lease and talks to it. Every shard stays its own job, file and rerun decision.

The keeper stops the server when no lease has been held for `idle_s`, when another engine is
about to start on its GPUs or a training claims them (`release_idle`: the memory is theirs
now), and at the end of the run (`stop_all`, from the Snakefile's onsuccess/onerror). A server
that dies fails the jobs in flight with its last output; a finished shard is never touched.
Inside a SLURM job nothing is shared: the allocation, and every process in it, ends with the
job, so each job starts its own server as before.

Why not Snakemake's service jobs: a service runs in one group with all its consumers at once,
so every shard of the stage would be in flight together in one cluster job, and the per-shard
resource accounting would be lost.

    <registry>/<key>/  lock           flock: leases and the keeper's stop exclude each other
                       spec.json      the server's ServerSpec, its API key included (0600)
                       keeper.pid     the keeper process
                       endpoint.json  {"base_url": ...}, once the server is healthy
                       failed.txt     why the server did not start, or died
                       stop           asks the keeper to stop once no lease is held
                       leases/<pid>-<hex>  one per job using the server, flock'ed meanwhile
                       server.log     the keeper's and the server's output
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specbuild.backends.server import ServerSpec, ServerStartError, SGLangServer, model_path_arg
from specbuild.io import atomic_open, pid_alive, write_json

__all__ = [
    "REGISTRY_ENV",
    "Endpoint",
    "failure",
    "release_idle",
    "server_key",
    "shared_server",
    "stop_all",
]

log = logging.getLogger("specbuild")

REGISTRY_ENV = "SPECBUILD_SHARED_SERVERS"  # where the keepers live; default below the cwd
DEFAULT_REGISTRY = ".specbuild/shared-servers"
POLL_S = 0.5
STOP_WAIT_S = 120.0  # stop_all/release_idle: how long to wait for keepers to exit


@dataclasses.dataclass(frozen=True)
class Endpoint:
    base_url: str
    api_key: str | None = dataclasses.field(repr=False)


def registry() -> Path:
    return Path(os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY).resolve()


def server_key(spec: ServerSpec) -> str:
    """What makes two jobs' servers the same one (the API key and port do not)."""
    ident = {
        "model_path": model_path_arg(spec.model_path),
        "launcher": list(spec.launcher),
        "server_args": list(spec.server_args),
        "env": dict(sorted(spec.env.items())),
        "host": spec.host,
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder / "lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _pid_alive(path: Path) -> bool:
    """Whether the process whose pid `path` holds still runs (False: no file)."""
    try:
        return pid_alive(int(path.read_text()))
    except (OSError, ValueError):
        return False


def _write_text(path: Path, text: str) -> None:
    # whole or absent: jobs poll for these files and read them at once
    with atomic_open(path) as fh:
        fh.write(text)


def _live_leases(folder: Path) -> int:
    """Leases whose holder still runs; those of dead holders are removed."""
    live = 0
    for lease in (folder / "leases").glob("*"):
        try:
            fd = os.open(lease, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            live += 1
        else:
            lease.unlink(missing_ok=True)  # its holder died without removing it
        finally:
            os.close(fd)
    return live


def _start_keeper(folder: Path, spec: ServerSpec, idle_s: float) -> None:
    for stale in ("endpoint.json", "failed.txt", "stop"):
        (folder / stale).unlink(missing_ok=True)
    fd = os.open(folder / "spec.json", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        json.dump({**dataclasses.asdict(spec), "gpus": gpus}, fh)
    with open(folder / "server.log", "a") as out:
        # its own process group: it outlives the job that started it (Snakemake ends a job's
        # group), and stays in the run's session, which a terminal or batch system cleans up
        proc = subprocess.Popen(
            [sys.executable, "-m", "specbuild.backends.shared_server", str(folder), str(idle_s)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
    _write_text(folder / "keeper.pid", str(proc.pid))


def _wait_endpoint(folder: Path, name: str, timeout_s: float) -> str:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if (folder / "endpoint.json").exists():
            return json.loads((folder / "endpoint.json").read_text())["base_url"]
        if (folder / "failed.txt").exists():
            raise ServerStartError(f"{name}: {(folder / 'failed.txt').read_text()}")
        if not _pid_alive(folder / "keeper.pid"):
            raise ServerStartError(
                f"{name}: the keeper of the shared server exited before it was healthy; "
                f"see {folder / 'server.log'}"
            )
        time.sleep(POLL_S)
    raise ServerStartError(f"{name}: shared server not healthy within {timeout_s:.0f} s")


@contextmanager
def shared_server(spec: ServerSpec, *, name: str, idle_s: float) -> Iterator[Endpoint]:
    """The running server of `spec`, started by a keeper if none is; a lease on it is held
    until the block ends."""
    folder = registry() / server_key(spec)
    (folder / "leases").mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    lease = folder / "leases" / tag
    # locked before it is in leases/: a lease seen there unlocked is a dead holder's
    fd = os.open(folder / f".lease-{tag}", os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(folder / f".lease-{tag}", lease)
    try:
        with _locked(folder):
            if _pid_alive(folder / "keeper.pid") and not (folder / "failed.txt").exists():
                log.info("%s: sharing the server kept in %s", name, folder)
            else:
                log.info("%s: starting a shared server, kept in %s", name, folder)
                _start_keeper(folder, spec, idle_s)
        base_url = _wait_endpoint(folder, name, spec.startup_timeout_s + 60)
        stored = json.loads((folder / "spec.json").read_text())
        yield Endpoint(base_url=base_url, api_key=stored.get("api_key"))
    finally:
        os.close(fd)
        lease.unlink(missing_ok=True)


def _ask_stop(folders: list[Path], why: str) -> None:
    """Ask these keepers to stop once no lease is held, and wait until they have."""
    waiting = []
    for folder in folders:
        if _pid_alive(folder / "keeper.pid"):
            _write_text(folder / "stop", why)
            waiting.append(folder)
    deadline = time.monotonic() + STOP_WAIT_S
    for folder in waiting:
        while _pid_alive(folder / "keeper.pid") and time.monotonic() < deadline:
            time.sleep(POLL_S)


def release_idle(gpus: str | None = None, *, keep: str | None = None) -> None:
    """Stop the shared servers on GPUs `gpus` (CUDA_VISIBLE_DEVICES ids; None: this process's)
    that no job is using, except the one of key `keep`: another engine or a training is about
    to need their memory."""
    root = registry()
    if not root.is_dir():
        return
    mine = set(filter(None, (gpus or os.environ.get("CUDA_VISIBLE_DEVICES", "")).split(",")))
    idle = []
    for folder in root.iterdir():
        spec = folder / "spec.json"
        if folder.name == keep or not spec.is_file() or not _pid_alive(folder / "keeper.pid"):
            continue
        theirs = set(filter(None, json.loads(spec.read_text()).get("gpus", "").split(",")))
        if (not mine or not theirs or mine & theirs) and _live_leases(folder) == 0:
            idle.append(folder)
    if idle:
        log.info("stopping %d idle shared server(s) on these GPUs", len(idle))
        _ask_stop(idle, "released for another job's engine")


def stop_all() -> None:
    """Stop every shared server of this working directory (the end of a run)."""
    root = registry()
    if root.is_dir():
        _ask_stop(sorted(root.iterdir()), "the run ended")


def keep(folder: Path, idle_s: float) -> int:
    """The keeper: run the server of `folder`'s spec until it is idle, asked to stop, or dies."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    fields = json.loads((folder / "spec.json").read_text())
    fields.pop("gpus", None)
    spec = ServerSpec(**{**fields, "launcher": tuple(fields["launcher"])})
    server = SGLangServer(spec, name=f"sglang-shared-{folder.name}")
    try:
        with server:
            write_json(folder / "endpoint.json", {"base_url": server.base_url})
            idle_since = None
            while True:
                time.sleep(POLL_S)
                code = server.proc.poll()
                if code is not None:
                    server._drain()
                    raise ServerStartError(
                        f"the shared server exited with code {code} while serving; its last "
                        f"output:\n{server.output_tail()}"
                    )
                with _locked(folder):
                    if _live_leases(folder):
                        idle_since = None
                        continue
                    idle_since = idle_since or time.monotonic()
                    if (folder / "stop").exists() or time.monotonic() - idle_since >= idle_s:
                        # under the lock: a job arriving now waits, then starts a new keeper
                        (folder / "endpoint.json").unlink(missing_ok=True)
                        (folder / "keeper.pid").unlink(missing_ok=True)
                        server.stop()
                        return 0
    except ServerStartError as err:
        why = server.mask(str(err))
    except SystemExit:
        why = "the shared server's keeper was stopped by a signal"
    _write_text(folder / "failed.txt", why)
    (folder / "endpoint.json").unlink(missing_ok=True)
    log.error("%s", why)
    return 1


def failure(spec: ServerSpec, *, wait_s: float = 4 * POLL_S + 1) -> str | None:
    """Why the shared server of `spec` stopped serving, if it did: waits `wait_s` for its
    keeper, which notices a dead server within POLL_S."""
    path = registry() / server_key(spec) / "failed.txt"
    deadline = time.monotonic() + wait_s
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(POLL_S / 5)
    return path.read_text() if path.is_file() else None


if __name__ == "__main__":
    sys.exit(keep(Path(sys.argv[1]), float(sys.argv[2])))
