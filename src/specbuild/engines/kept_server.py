"""One SGLang server for every job of a run that starts the same one (`sglang.share_idle_s`):
the keeper kind `server` (engines.keepers); a job gets it through engines.open.open_engine.

Why: at Kimi-K2.5's size a server start is the unit of cost (~10 minutes to load its
weights and capture CUDA graphs), and a server per `generate`/`synthesize` shard pays it per
shard. The registry, leases, idle stop, `release_idle` and `stop_all` are the keepers' own
(specbuild.engines.keepers, kind `server`); this module is what a server adds: its spec, its health
wait, its endpoint, and the check that it still runs. A server that dies fails the jobs in
flight with its last output; a finished shard is never touched. The bench and tuning jobs
that start the same server (the baseline's flags are generation's; a tuning point without
flags of its own is its chain's bench server) lease it too, alone while they measure
(`open_engine(..., exclusive=True)`): no other job's requests are in their figures.

    <registry>/server-<hash>/  (specbuild.engines.keepers' layout) plus
                               endpoint.json  {"base_url": ..., "start_s": ...}, once healthy
                               spec.json      the server's ServerSpec, its API key included
                               use.lock       held shared by generation, alone by a measurement
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specbuild.engines import keepers
from specbuild.engines.http import get_json
from specbuild.engines.server import ServerSpec, ServerStartError, SGLangServer
from specbuild.infra.io import write_json
from specbuild.infra.private_dirs import check_private_dir

__all__ = ["Endpoint", "failure", "keep", "kept_server"]

log = logging.getLogger("specbuild")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A running server as a job sees it, its own or a shared one; `start_s`: what its start
    cost (seconds to healthy), whichever job paid it."""

    base_url: str
    api_key: str | None = dataclasses.field(repr=False)
    start_s: float | None = None

    def get_json(self, path: str, timeout: float = 30.0) -> Any:
        return get_json(self.base_url + path, api_key=self.api_key, timeout=timeout)


def _wait_endpoint(folder: Path, name: str, timeout_s: float) -> dict[str, Any]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if (folder / "endpoint.json").exists():
            return json.loads((folder / "endpoint.json").read_text())
        if (folder / "failed.txt").exists():
            raise ServerStartError(f"{name}: {(folder / 'failed.txt').read_text()}")
        if not keepers.keeper_running(folder):
            raise ServerStartError(
                f"{name}: the keeper of the shared server exited before it was healthy; "
                f"see {folder / keepers.KEEPER_LOG}"
            )
        time.sleep(keepers.POLL_S)
    raise ServerStartError(f"{name}: shared server not healthy within {timeout_s:.0f} s")


@contextmanager
def kept_server(
    spec: ServerSpec, *, name: str, idle_s: float, exclusive: bool = False
) -> Iterator[Endpoint]:
    """The running server of `spec`, started by a keeper if none is; a lease on it is held
    until the block ends. `exclusive`: no other job sends it requests meanwhile (it waits
    for those that do, and they for it)."""
    with keepers.lease(
        spec.key(),
        spec=dataclasses.asdict(spec),
        module="specbuild.engines.kept_server",
        idle_s=idle_s,
        name=name,
        stale=("endpoint.json",),
    ) as held:
        endpoint = _wait_endpoint(held.folder, name, spec.startup_timeout_s + 60)
        stored = json.loads((held.folder / "spec.json").read_text())
        fd = os.open(held.folder / "use.lock", os.O_CREAT | os.O_RDWR, 0o600)
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("%s: waiting for the shared server's other jobs", name)
                fcntl.flock(fd, mode)
            yield Endpoint(
                base_url=endpoint["base_url"],
                api_key=stored.get("api_key"),
                start_s=endpoint.get("start_s"),
            )
        finally:
            os.close(fd)  # the lock goes with it


def keep(folder: Path, idle_s: float) -> int:
    """The keeper: run the server of `folder`'s spec until it is idle, asked to stop, or dies."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    check_private_dir(folder)  # its spec says what runs, as this user
    fields = json.loads((folder / "spec.json").read_text())
    fields.pop("gpus", None)
    spec = ServerSpec(**{**fields, "launcher": tuple(fields["launcher"])})
    server = SGLangServer(spec, name=f"sglang-shared-{folder.name}")

    def check() -> None:
        code = server.proc.poll()
        if code is not None:
            server._drain()
            raise ServerStartError(
                f"the shared server exited with code {code} while serving; its last "
                f"output:\n{server.output_tail()}"
            )

    def stop() -> None:
        (folder / "endpoint.json").unlink(missing_ok=True)
        server.stop()

    try:
        with server:
            endpoint = {"base_url": server.base_url, "start_s": server.start_s}
            write_json(folder / "endpoint.json", endpoint)
            keepers.serve_until_idle(folder, idle_s, tick=check, stop=stop)
            return 0
    except ServerStartError as err:
        why = server.mask(str(err))
    except SystemExit:
        why = "the shared server's keeper was stopped by a signal"
    (folder / "endpoint.json").unlink(missing_ok=True)
    keepers.fail(folder, why)
    return 1


def failure(spec: ServerSpec, *, wait_s: float = 4 * keepers.POLL_S + 1) -> str | None:
    """Why the shared server of `spec` stopped serving, if it did: waits `wait_s` for its
    keeper, which notices a dead server within POLL_S."""
    path = keepers.registry() / spec.key() / "failed.txt"
    deadline = time.monotonic() + wait_s
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(keepers.POLL_S / 5)
    return path.read_text() if path.is_file() else None


if __name__ == "__main__":
    sys.exit(keep(Path(sys.argv[1]), float(sys.argv[2])))
