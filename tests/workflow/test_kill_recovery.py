"""kill -9 in the middle of `make run`, then `make run` again, as README "When things go wrong"
says: the rerun removes the locks the killed run left (nothing of that run is left), reruns
the jobs the kill interrupted, and ends with the results of an uninterrupted run
(`built_workflow`), file for file. And a training whose snakemake alone was killed finishes as
an orphan: the next run waits for it, then writes its outputs again from its last checkpoint
instead of training from scratch.

The run is the Makefile's own `run` target in a copy of the workflow, with the test's venv
(`-o` keeps make from reinstalling it), so the test exercises the commands users type.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from workflow_helpers import (
    REPO,
    SNAKEMAKE,
    copy_workdir,
    make_workdir,
    planned_jobs,
    results_files,
    same_result,
    snakemake,
)

from specbuild.infra.run_lock import is_locked, lock_holders

pytestmark = pytest.mark.workflow

VENV = Path(sys.executable).parent.parent
# Killed once a hidden shard exists and a later job is running: mid-pipeline, with finished
# outputs to keep and an interrupted one to redo.
KILL_WHEN = "results/hidden/tiny/00000.safetensors"


def make_run_command() -> list[str]:
    setup_done = VENV / ".setup-done"
    return ["make", "run", f"VENV={VENV}", "CORES=2", "-o", str(setup_done)]


def running_jobs(workdir: Path) -> list[Path]:
    """Snakemake's markers of jobs started and not finished (.snakemake/incomplete/)."""
    marks = workdir / ".snakemake" / "incomplete"
    return [p for p in marks.rglob("*") if p.is_file()] if marks.exists() else []


def kill_mid_run(workdir: Path, timeout: float = 900) -> None:
    """Start `make run`; SIGKILL its whole process tree once KILL_WHEN exists and a job runs."""
    proc = subprocess.Popen(
        make_run_command(),
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # one process group: make, snakemake and every job
    )
    deadline = time.monotonic() + timeout
    try:
        while not ((workdir / KILL_WHEN).exists() and running_jobs(workdir)):
            if proc.poll() is not None:
                pytest.fail(f"make run ended (rc {proc.returncode}) before the kill point")
            if time.monotonic() > deadline:
                pytest.fail(f"no {KILL_WHEN} with a running job within {timeout} s")
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def test_make_run_after_kill_9_finishes_with_the_results_of_an_uninterrupted_run(
    built_workflow, tmp_path, target_dir
):
    workdir = make_workdir(tmp_path / "wf", target_dir)
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(REPO / name, workdir / name)

    kill_mid_run(workdir)
    assert is_locked(workdir) and running_jobs(workdir), "the kill left no lock or marker"

    rerun = subprocess.run(
        make_run_command(), cwd=workdir, capture_output=True, text=True, timeout=1500
    )
    assert rerun.returncode == 0, rerun.stdout[-5000:] + rerun.stderr[-5000:]
    assert "specbuild: removed the locks of a run that is no longer live (pid " in rerun.stderr
    assert not is_locked(workdir) and running_jobs(workdir) == []
    assert planned_jobs(workdir) == []
    assert (workdir / "results" / "report.html").is_file()

    local = results_files(built_workflow.workdir)
    ours = [f for f in results_files(workdir) if f != "results/report.html"]
    assert sorted(ours) == sorted(local)
    differ = [rel for rel in local if not same_result(built_workflow.workdir / rel, workdir / rel)]
    assert differ == []


def _train_job(workdir: Path) -> list:
    return [h for h in lock_holders(workdir) if h.command.endswith(".train.py")]


def test_a_training_that_finished_as_an_orphan_is_not_trained_again(built_workflow, tmp_path):
    wd = copy_workdir(built_workflow.workdir, tmp_path / "wf")
    best = wd / "results" / "train" / "base" / "best.safetensors"
    with open(tmp_path / "killed.out", "w") as out:
        killed = subprocess.Popen(
            [str(SNAKEMAKE), "--snakefile", "Snakefile", "--cores", "1", str(best.relative_to(wd))]
            + ["--forcerun", "train"],
            cwd=wd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 600
    while not _train_job(wd):
        assert killed.poll() is None, (tmp_path / "killed.out").read_text()[-3000:]
        assert time.monotonic() < deadline, "no train job within 600 s"
        time.sleep(0.1)
    killed.kill()  # snakemake alone: its train job goes on, an orphan
    killed.wait()
    while lock_holders(wd):  # the orphan trains on, then ends
        assert time.monotonic() < deadline, "the orphaned train job ran over 600 s"
        time.sleep(0.2)
    first = (wd / "logs" / "train" / "base.log").read_text()
    assert "starting fresh" in first and " trained 0 tokens" not in first, first  # it trained
    written = best.read_bytes()

    rerun = snakemake(wd, "--cores", "1", "--rerun-incomplete", str(best.relative_to(wd)))
    assert f"removed the locks of a run that is no longer live (pid {killed.pid} " in (rerun.stderr)
    log = (wd / "logs" / "train" / "base.log").read_text()
    assert "finished after its snakemake ended" in log and "starting fresh" not in log, log
    assert " trained 0 tokens" in log
    assert best.read_bytes() == written and not is_locked(wd)
