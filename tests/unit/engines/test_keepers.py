"""The keepers of shared engines (specbuild.engines.keepers), with a keeper that holds no engine:
jobs share one while they hold leases, it stops once idle, when released or at the run's end,
a dead job's lease does not keep it, and no exited keeper lingers as a zombie."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specbuild.engines.keepers import (
    REGISTRY_ENV,
    host_running,
    keeper_key,
    keeper_running,
    lease,
    process_running,
    release_idle,
    stop_all,
)
from specbuild.infra.private_dirs import UnsafeFolderError
from specbuild.infra.run_lock import RUN_ENV, process_start

REPO = Path(__file__).resolve().parents[3]
MODULE = "tests.stubs.idle_keeper"


@pytest.fixture
def registry(registry, monkeypatch) -> Path:
    monkeypatch.chdir(REPO)  # `python -m tests.stubs.idle_keeper` finds the stub from here
    return registry


def _lease(key: str, idle_s: float = 30.0):
    return lease(key, spec={"what": key}, module=MODULE, idle_s=idle_s, name="test")


def _pid(folder: Path) -> int:
    return int((folder / "keeper.pid").read_text().split()[0])


def _stops(folder: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while keeper_running(folder):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_jobs_asking_for_the_same_engine_share_one_keeper_which_stops_once_idle(registry):
    key = keeper_key("features", {"model": "a"})
    with _lease(key, idle_s=1.0) as one, _lease(key, idle_s=1.0) as two:
        assert one.folder == two.folder and one.tag != two.tag
        pid = _pid(one.folder)
        time.sleep(1.5)  # leases held: longer than idle_s, still running
        assert keeper_running(one.folder)
    assert _stops(one.folder, timeout_s=10)
    # keeper.pid goes first, then the keeper stops its engine (here: says so) and exits
    deadline = time.monotonic() + 10
    while process_running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()  # exited and reaped, no zombie
    assert "stopped" in (one.folder / "keeper.log").read_text()
    assert key.startswith("features-") and key != keeper_key("server", {"model": "a"})


def test_stop_all_stops_every_kind_and_returns_once_they_have_exited(registry):
    folders = []
    for kind in ("server", "features"):
        with _lease(keeper_key(kind, {"model": "a"}), idle_s=600) as held:
            folders.append(held.folder)
    pids = [_pid(f) for f in folders]
    start = time.monotonic()
    stop_all()
    assert time.monotonic() - start < 10
    assert not any(keeper_running(f) for f in folders)
    assert not any(process_running(p) for p in pids)


def test_one_runs_end_leaves_running_an_engine_another_live_run_uses(registry, monkeypatch):
    live = f"{socket.gethostname()}:{os.getpid()}:{process_start(os.getpid())}"  # this process
    monkeypatch.setenv(RUN_ENV, live)
    with _lease(keeper_key("server", {"model": "a"}), idle_s=600) as held:
        folder = held.folder
    # the keeper carries no run id: shared across runs, it keeps none of them looking live
    environ = Path(f"/proc/{_pid(folder)}/environ").read_bytes().split(b"\0")
    assert not [e for e in environ if e.startswith(f"{RUN_ENV}=".encode())]
    monkeypatch.setenv(RUN_ENV, f"{socket.gethostname()}:1:1")  # another run, ending now
    stop_all()
    assert keeper_running(folder)  # the live run's next job finds its engine loaded
    monkeypatch.setenv(RUN_ENV, live)  # now the run that used it ends
    stop_all()
    assert not keeper_running(folder) and not list((folder / "runs").iterdir())


def test_a_dead_keepers_pid_reused_by_another_process_is_not_taken_for_the_keeper(tmp_path):
    me = os.getpid()  # a live process, standing for whatever got the dead keeper's pid
    (tmp_path / "keeper.pid").write_text(f"{me} {process_start(me) + 1}")
    assert not keeper_running(tmp_path)
    (tmp_path / "keeper.pid").write_text(f"{me} {process_start(me)}")
    assert keeper_running(tmp_path)


def test_a_dead_jobs_lease_does_not_keep_the_keeper(registry):
    key = keeper_key("features", {"model": "a"})
    # a job that takes a lease and is killed holding it
    job = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom specbuild.engines.keepers import lease\n"
            f"with lease({key!r}, spec={{}}, module={MODULE!r}, idle_s=1.0, name='job'):\n"
            "    print('held', flush=True); time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, REGISTRY_ENV: str(registry)},
    )
    assert job.stdout.readline().strip() == "held"
    folder = registry / key
    time.sleep(1.5)
    assert keeper_running(folder)  # the job's lease holds it past idle_s
    job.send_signal(signal.SIGKILL)
    job.wait()
    assert list((folder / "leases").iterdir())  # left behind by the killed job
    assert _stops(folder, timeout_s=10)
    assert not list((folder / "leases").iterdir())  # removed as a dead holder's


def test_release_idle_stops_idle_keepers_on_these_gpus_but_not_a_busy_or_kept_one(
    registry, monkeypatch
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    idle, kept, other = (keeper_key("features", {"model": m}) for m in "abc")
    for key in (idle, kept):
        with _lease(key, idle_s=600):
            pass
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with _lease(other, idle_s=600):
        pass
    with _lease(keeper_key("server", {"model": "d"}), idle_s=600) as busy:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
        release_idle("0", keep=kept)
        assert keeper_running(busy.folder)  # a lease is held (it runs on GPU 1)
    assert not keeper_running(registry / idle)
    assert keeper_running(registry / kept) and keeper_running(registry / other)


def test_an_exited_process_is_not_running_whether_or_not_its_parent_reaps_it():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while process_running(child.pid):  # our child: reaped by the check itself
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not Path(f"/proc/{child.pid}").exists()
    # a grandchild whose parent never reaps it: a zombie, which does not count as running
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, time\npid = os.fork()\nif pid == 0:\n    os._exit(0)\n"
            "print(pid, flush=True)\ntime.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        zombie = int(parent.stdout.readline())
        time.sleep(0.5)
        assert Path(f"/proc/{zombie}").exists() and not process_running(zombie)
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.slow  # loads the real SmolLM2
def test_a_target_model_loaded_on_cuda_stops_the_idle_keepers_on_its_gpus_first(
    registry, monkeypatch, target_dir
):
    from specbuild.target import load_target_model

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    key = keeper_key("server", {"model": "idle"})
    with _lease(key, idle_s=600):
        pass
    load_target_model(target_dir, device="cpu")
    assert keeper_running(registry / key)  # a CPU model takes no GPU memory
    try:
        load_target_model(target_dir, device="cuda")
    except (AssertionError, RuntimeError):
        pass  # no CUDA here: the load fails after the release, as it would without it
    assert _stops(registry / key, timeout_s=10)


def test_a_keeper_pid_without_its_start_time_is_stale_and_the_runs_end_does_not_wait_on_it(
    registry,
):
    # the older keeper.pid held a pid alone; the keeper died and its pid went to another process
    unrelated = subprocess.Popen(["sleep", "600"])
    try:
        folder = registry / keeper_key("features", {"model": "old"})
        folder.mkdir(parents=True, mode=0o700)
        registry.chmod(0o700)
        (folder / "keeper.pid").write_text(f"{unrelated.pid}\n")
        (folder / "spec.json").write_text("{}")
        (registry / "host").mkdir(mode=0o700)
        (registry / "host" / "host.pid").write_text(f"{unrelated.pid}\n")
        assert not keeper_running(folder)  # a job starts its own keeper, never waits on it
        assert not host_running()
        start = time.monotonic()
        stop_all()
        assert time.monotonic() - start < 5  # not STOP_WAIT_S on a process that is no keeper
        assert unrelated.poll() is None and not (folder / "stop").exists()
    finally:
        unrelated.kill()
        unrelated.wait()


def _modes(*paths: Path) -> list[str]:
    return [f"{p.name} {p.stat().st_mode & 0o777:04o}" for p in paths]


def test_the_registry_and_every_keeper_folder_are_private_under_a_group_writable_umask(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the default registry: .specbuild/keepers below the cwd
    monkeypatch.delenv(REGISTRY_ENV, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the keeper stub, from another cwd
    monkeypatch.setenv(RUN_ENV, f"{socket.gethostname()}:1:1")
    old = os.umask(0o002)  # a shared project folder's umask
    try:
        with _lease(keeper_key("features", {"model": "a"})) as held:
            folder = held.folder
            root = tmp_path / ".specbuild"
            assert _modes(root, root / "keepers", folder, folder / "leases", folder / "runs") == [
                ".specbuild 0700",
                "keepers 0700",
                f"{folder.name} 0700",
                "leases 0700",
                "runs 0700",
            ]
    finally:
        os.umask(old)
        stop_all()


def test_a_registry_someone_else_could_write_is_refused_before_any_keeper_starts(registry):
    registry.mkdir()
    registry.chmod(0o775)  # made under umask 002 in a shared project folder
    with pytest.raises(UnsafeFolderError, match="is writable by its group or others"):
        with _lease(keeper_key("features", {"model": "a"})):
            pass
    assert list(registry.iterdir()) == []  # no request, no keeper
    stop_all()  # ends the run: says so, touches nothing there
    assert list(registry.iterdir()) == []


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_slurm_nodes_keeper_folder_made_first_by_someone_else_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(REGISTRY_ENV, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    theirs = tmp_path / f"specbuild-keepers-{os.getuid()}-4242"  # a name anyone can predict
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UnsafeFolderError, match="belongs to uid 65534, not to you"):
        with _lease(keeper_key("features", {"model": "a"})):
            pass
    with pytest.raises(UnsafeFolderError):
        host_running()
    assert list(theirs.iterdir()) == []
