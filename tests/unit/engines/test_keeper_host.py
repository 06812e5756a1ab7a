"""An allocation's keeper host (specbuild.engines.keeper_host), as in a SLURM allocation but
without SLURM: a job in a job step asks it for a keeper, which it starts as its own child (so
the keeper outlives the step), and when the Snakemake it watches exits it stops the keeper,
removes the allocation's folder and exits."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from specbuild.engines.keepers import (
    REGISTRY_ENV,
    host_running,
    keeper_key,
    keeper_running,
    lease,
    sharing_allowed,
)

REPO = Path(__file__).resolve().parents[3]


def _wait(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_job_steps_keeper_is_the_hosts_child_and_ends_with_the_allocations_snakemake(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(REPO)  # `python -m tests.stubs.idle_keeper` finds the stub from here
    monkeypatch.setenv(REGISTRY_ENV, str(tmp_path / "keepers"))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    assert not sharing_allowed(30)  # an allocation with no host: nothing is shared

    snakemake = subprocess.Popen(["sleep", "600"])  # stands in for the allocation's Snakemake
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    host = subprocess.Popen(
        [sys.executable, "-m", "specbuild.engines.keeper_host", str(snakemake.pid)], env=env
    )
    try:
        assert _wait(host_running)
        assert sharing_allowed(30)
        monkeypatch.setenv("SLURM_STEP_ID", "0")  # this test is now a job in a step
        key = keeper_key("features", {"model": "a"})
        with lease(key, spec={}, module="tests.stubs.idle_keeper", idle_s=600, name="t") as held:
            pid = int((held.folder / "keeper.pid").read_text().split()[0])
            assert keeper_running(held.folder)
            assert _parent(pid) == host.pid  # not this job's child: outlives its step
        requests = tmp_path / "keepers" / "host" / "requests"
        assert not list(requests.iterdir())  # read and removed: it held the environment
        assert keeper_running(held.folder)  # kept past the lease (idle_s 600)

        snakemake.kill()
        snakemake.wait()
        assert host.wait(timeout=60) == 0
        assert not Path(f"/proc/{pid}").exists()
        assert not (tmp_path / "keepers").exists()
    finally:
        snakemake.kill()
        host.kill()


def test_a_cancelled_allocations_host_still_removes_the_nodes_folder(tmp_path, monkeypatch):
    # SLURM's cancel or time limit: SIGTERM to every process of the allocation
    import signal

    monkeypatch.setenv(REGISTRY_ENV, str(tmp_path / "keepers"))
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    snakemake = subprocess.Popen(["sleep", "600"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    host = subprocess.Popen(
        [sys.executable, "-m", "specbuild.engines.keeper_host", str(snakemake.pid)], env=env
    )
    try:
        assert _wait(host_running)
        host.send_signal(signal.SIGTERM)
        assert host.wait(timeout=30) == 128 + signal.SIGTERM
        assert not (tmp_path / "keepers").exists()
    finally:
        snakemake.kill()
        host.kill()
