"""GPU pinning: jobs on one host take disjoint device ids, all or nothing, freed on death.

Real processes and real flocks; the ids are CUDA_VISIBLE_DEVICES tokens, so no GPU is needed.
"""

import os
import subprocess
import sys

import pytest

from specbuild.engines import gpus

HOLDER = """
import sys, time
from specbuild.engines.gpus import pin_gpus
print(",".join(pin_gpus(int(sys.argv[1]), slots_each=int(sys.argv[2]))), flush=True)
time.sleep(600)
"""


@pytest.fixture
def host(tmp_path, monkeypatch):
    """Three visible GPUs (ids 3,5,7) and a private lock folder; our own locks released after."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("SPECBUILD_GPU_LOCK_DIR", str(tmp_path / "locks"))
    yield
    while gpus._held:
        os.close(gpus._held.pop())


@pytest.fixture
def holder():
    """Start a job process that pins N GPUs and keeps them; returns (process, ids)."""
    procs = []

    def start(count: int, each: int = 1) -> tuple[subprocess.Popen, list[str]]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(count), str(each)], stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        return proc, proc.stdout.readline().strip().split(",")

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_zero_gpus_changes_nothing(host):
    assert gpus.pin_gpus(0) == []
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,5,7"


def test_jobs_take_disjoint_ids_and_see_only_theirs(host, holder):
    _, first = holder(2)
    assert first == ["3", "5"]
    assert gpus.pin_gpus(1, wait_s=0) == ["7"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"


def test_slots_share_a_gpu_after_every_gpu_has_a_job(host, holder, monkeypatch):
    monkeypatch.setenv("SPECBUILD_GPU_SLOTS", "2")
    _, first = holder(2)
    assert first == ["3", "5"]
    _, second = holder(1)
    assert second == ["7"]
    # every GPU holds a job: the next ones share, a multi-GPU job on distinct GPUs
    _, third = holder(2)
    assert third == ["3", "5"]
    assert gpus.pin_gpus(1, wait_s=0) == ["7"]
    with pytest.raises(TimeoutError, match="no 1 free GPU"):
        gpus.pin_gpus(1, wait_s=0.2, poll_s=0.05)


def test_a_training_takes_a_majority_of_slots(monkeypatch):
    for slots, each in [("1", 1), ("2", 2), ("3", 2), ("4", 3)]:
        monkeypatch.setenv("SPECBUILD_GPU_SLOTS", slots)
        assert gpus.train_slots() == each


def test_a_two_slot_job_takes_a_gpu_nobody_uses(host, holder, monkeypatch):
    monkeypatch.setenv("SPECBUILD_GPU_SLOTS", "2")
    holder(1)  # GPU 3, first slot
    _, second = holder(1)  # GPU 5, first slot
    assert second == ["5"]
    # two slots of two: a GPU with no job on it, 7 (3 and 5 each hold one)
    assert gpus.pin_gpus(1, slots_each=2, wait_s=0) == ["7"]


def test_a_training_keeps_other_trainings_off_its_gpu_but_not_a_bench(host, holder, monkeypatch):
    monkeypatch.setenv("SPECBUILD_GPU_SLOTS", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    _, trainer = holder(1, each=gpus.train_slots())
    assert trainer == ["3"]
    _, bench = holder(1)
    assert bench == ["5"]
    # a second training: 5 has two slots free, 3 only one
    _, trainer2 = holder(1, each=gpus.train_slots())
    assert trainer2 == ["5"]
    # the one slot left is on 3, beside the first training; then none
    assert gpus.pin_gpus(1, wait_s=0) == ["3"]
    with pytest.raises(TimeoutError, match="no 1 free GPU"):
        gpus.pin_gpus(1, slots_each=1, wait_s=0.2, poll_s=0.05)


def test_more_slots_than_a_gpu_has_is_named(host, monkeypatch):
    monkeypatch.setenv("SPECBUILD_GPU_SLOTS", "2")
    with pytest.raises(ValueError, match="slots_each=3: want 1 to SPECBUILD_GPU_SLOTS=2"):
        gpus.pin_gpus(1, slots_each=3, wait_s=0)


def test_bad_slot_count_is_named(host, monkeypatch):
    monkeypatch.setenv("SPECBUILD_GPU_SLOTS", "two")
    with pytest.raises(ValueError, match="SPECBUILD_GPU_SLOTS='two'"):
        gpus.pin_gpus(1, wait_s=0)


def test_all_or_nothing_then_timeout(host, holder):
    holder(2)
    with pytest.raises(TimeoutError, match="no 2 free GPU"):
        gpus.pin_gpus(2, wait_s=0.2, poll_s=0.05)
    # the failed attempt held nothing: the free id is still free
    assert gpus.pin_gpus(1, wait_s=0) == ["7"]


def test_killed_job_frees_its_gpus(host, holder):
    proc, ids = holder(3)
    assert ids == ["3", "5", "7"]
    proc.kill()
    proc.wait()
    assert gpus.pin_gpus(3, wait_s=5, poll_s=0.05) == ["3", "5", "7"]


def test_asking_for_more_than_the_host_has(host):
    with pytest.raises(RuntimeError, match="asks for 4 GPU.*shows 3"):
        gpus.pin_gpus(4)


def test_no_visible_gpu_leaves_the_job_alone(host, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpus.pin_gpus(1) == []
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_a_slurm_job_keeps_its_allocation(host, holder, monkeypatch):
    # with device cgroups every job on a node sees its GPU as id 0: locks would serialize them
    holder(3)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert gpus.pin_gpus(1, wait_s=0) == []
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,5,7"


STARTER = """
import sys, time
from specbuild.engines.gpus import startup_lock
with startup_lock("test runner"):
    print("started", flush=True)
    time.sleep(600)
"""


def test_one_start_at_a_time_per_gpu(host, monkeypatch):
    # two runners sizing their KV pool from free memory at once each count the other's pool
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    proc = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        with pytest.raises(TimeoutError, match="GPU 5's start-up lock"):
            with gpus.startup_lock("second", wait_s=0.2, poll_s=0.05):
                pass
        # another GPU starts freely
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
        with gpus.startup_lock("other gpu", wait_s=0):
            pass
    finally:
        proc.kill()
        proc.wait()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    with gpus.startup_lock("after the first ended", wait_s=5, poll_s=0.05):
        pass
