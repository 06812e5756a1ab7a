"""What the workflow does with what it cannot trust, through real Snakemake runs: a hidden
shard damaged on disk stops training in a few lines of its job log, without a traceback;
deleting outputs is refused while a live run uses them; a generate job that finished after its
snakemake was killed is recognised by the rerun, not paid for again."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from workflow_helpers import (
    DATASET,
    SNAKEMAKE,
    TARGET_NAME,
    copy_workdir,
    make_workdir,
    planned_jobs,
    snakemake,
)

from specbuild.infra.run_lock import LOCK_DIR, lock_holders, read_lock_files
from specbuild.infra.snakemake_locks import MUTEX

pytestmark = pytest.mark.workflow

BEST = "results/train/base/best.safetensors"


def _flip_bits(path: Path) -> None:
    """Change 4 KB of a shard's features in place, its mtime kept, as a bad disk does."""
    stat, raw = path.stat(), bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    begin = 8 + n + json.loads(raw[8 : 8 + n])["aux"]["data_offsets"][0]
    for i in range(begin, begin + 4096, 2):  # the lowest mantissa bit: every value finite
        raw[i] ^= 1
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_damaged_hidden_shard_stops_training_with_its_message_and_no_traceback(
    built_workflow, tmp_path
):
    wd = copy_workdir(built_workflow.workdir, tmp_path / "wf")
    (shard, *_) = sorted((wd / "results" / "hidden").rglob("*.safetensors"))
    _flip_bits(shard)
    proc = snakemake(wd, "--cores", "1", BEST, "--forcerun", "train", check=False)
    assert proc.returncode == 1
    log = (wd / "logs" / "train" / "base.log").read_text()
    rel = shard.relative_to(wd)
    assert "CRITICAL job failed: 1 of " in log and "failed verification; training did not" in log
    assert f"{rel}:\n    - aux: checksum mismatch" in log
    assert "Fix: delete each listed shard and rerun snakemake" in log
    for text in (log, proc.stdout, proc.stderr):
        assert "Traceback" not in text


def _lock_owner_pids(workdir: Path) -> set[int]:
    return {lk.owner.pid for lk in read_lock_files(workdir) if lk.owner}


def _live_and_stopped(workdir: Path, target: str, out: Path) -> subprocess.Popen:
    """A run of `target`, stopped (SIGSTOP) once it holds its locks and is out of the lock
    check: live, until SIGCONT."""
    with open(out, "w") as fh:
        proc = subprocess.Popen(
            [str(SNAKEMAKE), "--snakefile", "Snakefile", "--cores", "1", target],
            cwd=workdir,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 300
    while proc.pid not in _lock_owner_pids(workdir):
        assert proc.poll() is None, out.read_text()[-3000:]
        assert time.monotonic() < deadline, "the run took no lock within 300 s"
        time.sleep(0.1)
    with open(workdir / LOCK_DIR / MUTEX, "a") as mutex:
        while True:
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                fcntl.flock(mutex, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # stopped inside the check: every other run would wait
                os.kill(proc.pid, signal.SIGCONT)
                time.sleep(0.05)
                continue
            fcntl.flock(mutex, fcntl.LOCK_UN)
            return proc


def test_deleting_outputs_while_a_run_uses_them_is_refused_naming_the_run(tmp_path, target_dir):
    wd = make_workdir(tmp_path / "wf", target_dir)
    shard = f"results/samples/{DATASET}/00000.jsonl"
    fingerprint = wd / "results" / "target" / TARGET_NAME / "fingerprint.json"
    run = _live_and_stopped(wd, shard, tmp_path / "run.out")
    try:
        for command in (["--delete-all-output"], ["--cleanup-metadata", shard]):
            proc = snakemake(wd, "--cores", "1", *command, check=False)
            assert proc.returncode == 1, proc.stderr[-3000:]
            assert (
                f"specbuild: {command[0]} would delete files that a live run writes or reads:\n"
                f"  the live run pid {run.pid} (started "
            ) in proc.stderr
            assert f"Nothing was deleted. Wait for it to end or stop it (kill {run.pid})" in (
                proc.stderr
            )
            assert "Traceback" not in proc.stderr
            assert fingerprint.is_file()  # the run's input, and the target's fingerprint
    finally:
        os.kill(run.pid, signal.SIGCONT)
    assert run.wait(timeout=600) == 0, (tmp_path / "run.out").read_text()[-3000:]
    assert (wd / shard).is_file()
    snakemake(wd, "--cores", "1", "--delete-all-output")  # no run live: it deletes
    assert not (wd / shard).exists()


def _generate_job(workdir: Path) -> list:
    return [h for h in lock_holders(workdir) if h.command.endswith(".generate.py")]


def test_a_generate_job_finished_as_an_orphan_is_published_again_not_generated_again(
    built_workflow, tmp_path
):
    wd = copy_workdir(built_workflow.workdir, tmp_path / "wf")
    out = f"results/generated/{DATASET}/00000.jsonl"
    with open(tmp_path / "killed.out", "w") as fh:
        killed = subprocess.Popen(
            [str(SNAKEMAKE), "--snakefile", "Snakefile", "--cores", "1", out]
            + ["--forcerun", "generate"],
            cwd=wd,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 600
    while not _generate_job(wd):
        assert killed.poll() is None, (tmp_path / "killed.out").read_text()[-3000:]
        assert time.monotonic() < deadline, "no generate job within 600 s"
        time.sleep(0.1)
    killed.kill()  # snakemake alone: its generate job goes on, an orphan
    killed.wait()
    while lock_holders(wd):  # the orphan generates on, publishes its shard, then ends
        assert time.monotonic() < deadline, "the orphaned generate job ran over 600 s"
        time.sleep(0.2)
    log = wd / "logs" / "generate" / DATASET / "00000.log"
    assert "its outputs are kept in" in log.read_text(), log.read_text()
    written = (wd / out).read_bytes()

    rerun = snakemake(wd, "--cores", "1", "--rerun-incomplete", out)
    assert f"removed the locks of a run that is no longer live (pid {killed.pid} " in rerun.stderr
    text = log.read_text()
    assert "are published again, not made again" in text, text
    assert (wd / out).read_bytes() == written
    assert not list((wd / "results" / "generated" / DATASET).glob(".*.orphan"))
    assert planned_jobs(wd, out) == []  # recorded now: nothing left to do
