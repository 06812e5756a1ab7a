"""Snakemake's locks owned by runs: a lock file names its run, a run is live while its
snakemake process or a job it started runs, and `snakemake --unlock` removes only the locks of
runs no longer live. (Runs at once, with real Snakemake processes:
tests/workflow/test_concurrency.py.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from specbuild.infra.run_lock import (
    LOCK_DIR,
    RUN_ENV,
    is_locked,
    is_snakemake_process,
    lock_holders,
    process_start,
    read_lock_files,
    run_state,
    this_run,
    write_lock_file,
)
from specbuild.infra.snakemake_locks import _cleanup_locks, _lock, _lock_warn_only


def _fake_snakemake(tmp_path: Path, cwd: Path, env: dict | None = None) -> subprocess.Popen:
    """A live process that looks like a job of a run, `python .snakemake/scripts/job.py`."""
    script = tmp_path / ".snakemake" / "scripts" / "job.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("import time\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=cwd, env=env)
    time.sleep(0.3)  # its /proc entry shows the final command line
    return proc


def _ended_run() -> tuple[int, int]:
    """(pid, start) of a process that ran and is gone."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    start = process_start(proc.pid)
    proc.kill()
    proc.wait()
    return proc.pid, start


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/w/.venv/bin/python3", "/w/.venv/bin/snakemake", "--cores", "2"], True),
        (["snakemake", "-n"], True),
        (["python", "-m", "snakemake", "--unlock"], True),
        (["/w/.venv/bin/python3", "/w/.snakemake/scripts/tmpa1b2.train.py"], True),
        (["vim", "Snakefile"], False),
        (["/bin/sh", "-c", "if true; then .venv/bin/snakemake --unlock; fi"], False),
        (["python", "-m", "specbuild.engines.keepers", "serve"], False),
    ],
)
def test_snakemake_processes_and_their_jobs_are_recognised(argv, expected):
    assert is_snakemake_process(argv) is expected


def test_a_lock_file_names_its_run_and_snakemake_reads_only_paths_from_it(tmp_path):
    owner = this_run(["results/a.jsonl"])
    first = write_lock_file(tmp_path, "output", ["results/a.jsonl", "results/b.jsonl"], owner)
    second = write_lock_file(tmp_path, "output", ["results/c.jsonl"], owner)
    assert [first.name, second.name] == ["0.output.lock", "1.output.lock"]  # never overwritten
    (lock, _) = read_lock_files(tmp_path)
    assert lock.owner == owner and lock.kind == "output"
    assert lock.files == {"results/a.jsonl", "results/b.jsonl"}
    assert is_locked(tmp_path) and not list((tmp_path / LOCK_DIR).glob(".*.tmp"))
    # Snakemake reads every line as a locked path: the owner line matches no file
    (owner_line, *paths) = first.read_text().splitlines()
    assert owner_line.startswith("# specbuild run {") and paths == sorted(lock.files)


def test_a_run_is_live_while_its_process_or_a_job_it_started_runs(tmp_path):
    assert run_state(this_run()) == "live"
    pid, start = _ended_run()
    ended = replace(this_run(), pid=pid, start=start)
    assert run_state(ended) == "ended"
    reused = replace(this_run(), start=this_run().start + 1)  # this pid, another process
    assert run_state(reused) == "ended"
    orphan = _fake_snakemake(tmp_path, tmp_path, env=os.environ | {RUN_ENV: ended.run_id})
    try:
        assert run_state(ended) == "live"  # its job still runs after snakemake was killed
    finally:
        orphan.kill()
        orphan.wait()
    assert run_state(ended) == "ended"
    # a process the job started (a training's torchrun worker, no snakemake in its command
    # line) outlives a killed job script and still writes the job's outputs
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env=os.environ | {RUN_ENV: ended.run_id},
    )
    try:
        assert run_state(ended) == "live"
    finally:
        worker.kill()
        worker.wait()
    assert run_state(ended) == "ended"
    assert run_state(replace(ended, jobs_elsewhere=True)) == "unseen"  # a cluster's jobs
    assert run_state(replace(this_run(), host=f"not-{socket.gethostname()}")) == "unseen"


def test_unlock_removes_the_locks_of_ended_runs_and_keeps_a_live_runs(tmp_path, capsys):
    pid, start = _ended_run()
    live = this_run(["results/a.jsonl"])
    write_lock_file(tmp_path, "output", ["results/a.jsonl"], live)
    write_lock_file(tmp_path, "output", ["results/b.jsonl"], replace(live, pid=pid, start=start))
    (tmp_path / LOCK_DIR / "2.input.lock").write_text("raw/x.jsonl\n")  # names no run
    _cleanup_locks(SimpleNamespace(_lockdir=str(tmp_path / LOCK_DIR)))
    assert [lk.owner for lk in read_lock_files(tmp_path)] == [live]
    assert f"kept the locks of the live run pid {os.getpid()} " in capsys.readouterr().err


def test_a_lock_naming_no_run_is_live_while_a_snakemake_process_works_here(tmp_path):
    work = tmp_path / "work"
    (work / LOCK_DIR).mkdir(parents=True)
    (work / LOCK_DIR / "0.output.lock").write_text("results/b.jsonl\n")
    other = tmp_path / "elsewhere"
    other.mkdir()
    proc = _fake_snakemake(tmp_path, cwd=other)  # a run in another directory does not count
    try:
        assert lock_holders(work) == []
    finally:
        proc.kill()
        proc.wait()
    proc = _fake_snakemake(tmp_path, cwd=work)
    try:
        assert [h.pid for h in lock_holders(work)] == [proc.pid]
        _cleanup_locks(SimpleNamespace(_lockdir=str(work / LOCK_DIR)))
        assert is_locked(work)  # kept while it works here
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    _cleanup_locks(SimpleNamespace(_lockdir=str(work / LOCK_DIR)))
    assert not is_locked(work)


def _persistence(workdir: Path, outputs: list[str]) -> SimpleNamespace:
    """What the lock reads of Snakemake's persistence: the run's files and targets."""
    return SimpleNamespace(
        _lockdir=str(workdir / LOCK_DIR),
        all_inputfiles=lambda: [],
        all_outputfiles=lambda: outputs,
        dag=SimpleNamespace(
            targetfiles=outputs, targetrules=[], workflow=SimpleNamespace(local_exec=True)
        ),
        unlock=lambda: None,
    )


def test_a_run_on_the_files_of_a_killed_runs_live_job_is_refused_naming_that_job(tmp_path, capsys):
    best = "results/train/base/best.safetensors"
    pid, start = _ended_run()
    killed = replace(this_run([best]), pid=pid, start=start)
    write_lock_file(tmp_path, "output", [best], killed)
    orphan = _fake_snakemake(tmp_path, tmp_path, env=os.environ | {RUN_ENV: killed.run_id})
    try:
        with pytest.raises(SystemExit) as refused, _lock(_persistence(tmp_path, [best])):
            pass
    finally:
        orphan.kill()
        orphan.wait()
    message = str(refused.value)
    assert f"the run pid {pid} " in message
    assert f"its snakemake killed, its jobs live (pid {orphan.pid}) locks {best}" in message
    assert f"or stop it (kill {orphan.pid})" in message  # never the dead snakemake's pid
    with _lock(_persistence(tmp_path, [best])):  # the job ended: its run's locks go
        assert [lk.owner.pid for lk in read_lock_files(tmp_path)] == [os.getpid()]
    assert f"removed the locks of a run that is no longer live (pid {pid} " in (
        capsys.readouterr().err
    )


def test_a_dry_run_says_what_a_run_would_meet_and_removes_nothing(tmp_path, capsys):
    pid, start = _ended_run()
    write_lock_file(
        tmp_path, "output", ["results/a.jsonl"], replace(this_run(), pid=pid, start=start)
    )
    write_lock_file(tmp_path, "output", ["results/b.jsonl"], this_run(["results/b.jsonl"]))
    with _lock_warn_only(_persistence(tmp_path, ["results/a.jsonl", "results/b.jsonl"])):
        pass
    err = capsys.readouterr().err
    assert f"the locks of a run that is no longer live (pid {pid} " in err
    assert "a run of these targets now would be refused (a dry-run goes on):" in err
    assert f"the live run pid {os.getpid()} " in err and "locks results/b.jsonl" in err
    assert len(read_lock_files(tmp_path)) == 2  # nothing removed, nothing written
