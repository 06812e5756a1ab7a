"""A SLURM allocation's keeper host: starts the keepers its jobs ask for, and stops them when
the allocation's Snakemake exits.

Under `profiles/slurm` one stage's engine-bound shards go to one cluster job (a Snakemake
group, docs/clusters.md), so that its jobs share one engine, loaded once. Inside the
allocation Snakemake runs each job in a job step of its own (`srun`), and a step's processes
end with it: a keeper the first job started as its child would die with the first shard. The
allocation's own Snakemake (its batch step) starts this host when it parses the Snakefile
(`start_host`); jobs write requests to the host's folder (engines.keepers), the host starts
each keeper as its child, in the batch step, and reaps it when it exits. When the Snakemake it
was started by exits, success or failure, the host asks every keeper to stop, waits for them,
removes the allocation's folder of keepers and exits: no engine outlives the group. SLURM
ends the whole allocation, host and keepers included, at a time limit or a cancel.

    python -m specbuild.engines.keeper_host <pid of the allocation's Snakemake> [<its start time>]

The Snakemake is watched by pid and start time (infra.pidfile): a pid reused after it exited
must not keep the host and its engines up.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from specbuild.engines import keepers
from specbuild.infra.pidfile import ProcessId, write_pid_file
from specbuild.infra.private_dirs import check_private_dir, private_dir

__all__ = ["serve", "start_host"]

log = logging.getLogger("specbuild")


def start_host() -> None:
    """Start this allocation's keeper host unless it runs: a child of this Snakemake in its own
    process group, watching this process."""
    folder = keepers.open_host_folder()
    if keepers.host_running():
        return
    me = ProcessId.of(os.getpid())
    watch = [str(os.getpid())] + ([str(me.start)] if me else [])
    with open(folder / "host.log", "a") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specbuild.engines.keeper_host", *watch],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
    write_pid_file(folder / "host.pid", proc.pid)


def _start(request: Path, children: dict[int, subprocess.Popen]) -> None:
    """Start the keeper `request` asks for and record its pid where the job waits for it."""
    ask = json.loads(request.read_text())
    request.unlink()
    folder = Path(ask["folder"])
    if folder.parent != keepers.registry():  # a keeper runs only in a folder of the registry
        raise ValueError(f"{folder} is not a keeper folder of {keepers.registry()}")
    check_private_dir(folder)
    proc = keepers.spawn_keeper(ask["argv"], folder, cwd=ask["cwd"], env=ask["env"])
    children[proc.pid] = proc
    log.info("started the keeper of %s (pid %d)", folder.name, proc.pid)


def serve(parent: ProcessId) -> None:
    """Start requested keepers until process `parent` exits; then stop them all and return."""
    requests = private_dir(keepers.open_host_folder() / "requests")
    children: dict[int, subprocess.Popen] = {}
    while parent.running():
        for request in sorted(requests.glob("*.json")):
            try:
                _start(request, children)
            except Exception as err:  # one bad request must not end the host
                log.error("could not start the keeper of %s: %s", request.name, err)
                request.unlink(missing_ok=True)
        for pid, proc in list(children.items()):
            if proc.poll() is not None:  # reaped: no zombie looks like a running keeper
                del children[pid]
        time.sleep(keepers.POLL_S / 5)
    log.info("the allocation's Snakemake (pid %d) exited: stopping its keepers", parent.pid)
    keepers.stop_all()
    for proc in children.values():
        proc.wait()


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # SLURM ends a cancelled or timed-out allocation with SIGTERM to every process in it: the
    # keepers get theirs too; the host still removes the node's folder
    signal.signal(signal.SIGTERM, _terminated)
    pid = int(sys.argv[1])
    # without a start time (started by hand): the process that has the pid now
    parent = ProcessId(pid, int(sys.argv[2])) if len(sys.argv) > 2 else ProcessId.of(pid)
    write_pid_file(keepers.open_host_folder() / "host.pid", os.getpid())
    try:
        if parent is not None:
            serve(parent)
    finally:
        # the node's folder of this allocation: its keepers have exited, their jobs too
        shutil.rmtree(keepers.registry(), ignore_errors=True)


if __name__ == "__main__":
    main()
