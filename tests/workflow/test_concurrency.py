"""Independent jobs run at the same time: two shards' jobs overlap with `--cores 2`. Runs at
the same time keep one writer per output: a run frees only its own locks, and a run on a live
run's files is refused, naming it.

The evidence is Snakemake's own run log, in event order: it prints a job's block
("rule NAME:" ... "jobid: N") when it launches the job and "Finished jobid: N" only after the
job's process has exited, so a job launched before another one's finish line ran while the
other was still running. The same two jobs with `--cores 1` must not overlap (the control).
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import time
from itertools import combinations
from pathlib import Path

import pytest
from workflow_helpers import DATASET, SNAKEMAKE, copy_workdir, make_workdir, snakemake

from specbuild.infra.run_lock import LOCK_DIR, is_locked, read_lock_files
from specbuild.infra.snakemake_locks import MUTEX

pytestmark = pytest.mark.workflow

_START = re.compile(r"^(?:local)?rule (\w+):$")
_JOBID = re.compile(r"^\s+jobid: (\d+)$")
_WILDCARDS = re.compile(r"^\s+wildcards: (.*)$")
_FINISHED = re.compile(r"^Finished jobid: (\d+)")


def job_events(log: Path) -> dict[int, dict]:
    """jobid -> {rule, wildcards, start, end}: positions of its launch and finish in the log.

    A job block is "rule NAME:" then indented "key: value" lines (jobid, wildcards, ... in any
    order), so a block is recorded once it ends."""
    jobs: dict[int, dict] = {}
    block: dict | None = None
    for pos, line in enumerate([*log.read_text().splitlines(), ""]):
        if block is not None and not line.startswith("    "):
            jobs[block.pop("jobid")] = block
            block = None
        if m := _START.match(line):
            block = {"rule": m.group(1), "wildcards": "", "start": pos}
        elif block is not None and (m := _WILDCARDS.match(line)):
            block["wildcards"] = m.group(1)
        elif block is not None and (m := _JOBID.match(line)):
            block["jobid"] = int(m.group(1))
        elif m := _FINISHED.match(line):
            jobs[int(m.group(1))]["end"] = pos
    return jobs


def overlapping_shard_pairs(jobs: dict[int, dict]) -> list[tuple[dict, dict]]:
    """Pairs of jobs of one rule on different shards whose [launch, finish] overlap."""
    pairs = []
    for a, b in combinations(jobs.values(), 2):
        if a["rule"] != b["rule"] or "shard=" not in a["wildcards"]:
            continue
        if a["start"] < b["end"] and b["start"] < a["end"]:
            pairs.append((a, b))
    return pairs


def forced_tokenize_run(built, workdir: Path, cores: int) -> Path:
    """Rerun only the two shards' tokenize jobs (their inputs exist) on a copy; the run's log."""
    copy_workdir(built.workdir, workdir)
    targets = [f"results/tokenized/{DATASET}/{s}.jsonl" for s in ("00000", "00001")]
    before = set((workdir / ".snakemake" / "log").glob("*.snakemake.log"))
    # Targets first: --forcerun takes every word after it as a rule or file to force.
    snakemake(workdir, *targets, "--cores", str(cores), "--forcerun", "tokenize")
    (log,) = set((workdir / ".snakemake" / "log").glob("*.snakemake.log")) - before
    return log


def tokenize_jobs(log: Path) -> list[dict]:
    jobs = list(job_events(log).values())
    assert sorted(j["rule"] for j in jobs) == ["tokenize", "tokenize"], jobs
    return jobs


def test_every_job_of_the_built_run_finished(built_workflow):
    jobs = job_events(built_workflow.log)
    assert len(jobs) == len(built_workflow.jobs) + 1  # + the `all` job
    assert all("end" in j for j in jobs.values())


def test_two_shards_jobs_run_at_the_same_time_with_two_cores(built_workflow, tmp_path):
    log = forced_tokenize_run(built_workflow, tmp_path / "wf", cores=2)
    a, b = tokenize_jobs(log)
    assert a["start"] < b["end"] and b["start"] < a["end"], (a, b)
    assert overlapping_shard_pairs(job_events(log)) == [(a, b)]


def test_the_same_jobs_run_one_after_the_other_with_one_core(built_workflow, tmp_path):
    log = forced_tokenize_run(built_workflow, tmp_path / "wf", cores=1)
    tokenize_jobs(log)
    assert overlapping_shard_pairs(job_events(log)) == []


def test_overlap_detection_rejects_jobs_that_ran_one_after_the_other(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(
        "rule samples:\n    jobid: 1\n    wildcards: dataset=d, shard=00000\n"
        "Finished jobid: 1 (Rule: samples)\n"
        "rule samples:\n    jobid: 2\n    wildcards: dataset=d, shard=00001\n"
        "Finished jobid: 2 (Rule: samples)\n"
    )
    assert overlapping_shard_pairs(job_events(log)) == []


def _lock_owner_pids(workdir: Path) -> set[int]:
    return {lk.owner.pid for lk in read_lock_files(workdir) if lk.owner}


def _stop_while_holding_its_locks(proc: subprocess.Popen, workdir: Path) -> None:
    """SIGSTOP a run once it holds its locks and is not inside the lock check (a run stopped
    there would keep every other run waiting for the check)."""
    deadline = time.monotonic() + 300
    while proc.pid not in _lock_owner_pids(workdir):
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before it locked"
        assert time.monotonic() < deadline, "the run took no lock within 300 s"
        time.sleep(0.1)
    with open(workdir / LOCK_DIR / MUTEX, "a") as mutex:
        while True:
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                fcntl.flock(mutex, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.kill(proc.pid, signal.SIGCONT)
                time.sleep(0.05)
                continue
            fcntl.flock(mutex, fcntl.LOCK_UN)
            return


def _job_blocks(workdir: Path, rule: str, wildcards: str) -> int:
    """How many times any run launched the job, over every run's Snakemake log."""
    return sum(
        1
        for log in (workdir / ".snakemake" / "log").glob("*.snakemake.log")
        for job in job_events(log).values()
        if job["rule"] == rule and job["wildcards"] == wildcards
    )


def test_a_run_frees_only_its_own_locks_and_one_on_a_live_runs_files_is_refused(
    tmp_path, target_dir
):
    wd = make_workdir(tmp_path / "wf", target_dir)
    shard_a, shard_b = (f"results/samples/{DATASET}/{s}.jsonl" for s in ("00000", "00001"))
    with open(tmp_path / "a.out", "w") as out:
        run_a = subprocess.Popen(
            [str(SNAKEMAKE), "--snakefile", "Snakefile", "--cores", "1", shard_a],
            cwd=wd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _stop_while_holding_its_locks(run_a, wd)  # A: live, holding its locks, until resumed
        run_b = snakemake(wd, "--cores", "1", shard_b)  # B: other files, while A is live
        assert f"a live run works here too (pid {run_a.pid} " in run_b.stderr
        assert "so both go on" in run_b.stderr
        assert _lock_owner_pids(wd) == {run_a.pid}  # B ended and freed its own locks only
        before = sorted(p.name for p in (wd / "results" / "samples" / DATASET).iterdir())
        dry = snakemake(wd, "-n", "--cores", "1", shard_a)  # C's dry-run says what C will meet
        assert "a run of these targets now would be refused (a dry-run goes on):" in dry.stderr
        assert "Another Snakemake instance is running" not in dry.stdout + dry.stderr
        run_c = snakemake(wd, "--cores", "1", shard_a, check=False)  # C: A's target
        assert run_c.returncode == 1
        refusal = (
            "specbuild: this run would write files that a live run writes or reads:\n"
            f"  the live run pid {run_a.pid} (started "
        )
        assert refusal in run_c.stderr
        assert f"; targets: {shard_a}) locks " in run_c.stderr and shard_a in run_c.stderr
        assert f"Nothing was started. Wait for it to end or stop it (kill {run_a.pid})" in (
            run_c.stderr
        )
        assert "--unlock" not in run_c.stderr  # the advice is what is safe now
        assert sorted(p.name for p in (wd / "results" / "samples" / DATASET).iterdir()) == before
    finally:
        if run_a.poll() is None:
            os.kill(run_a.pid, signal.SIGCONT)
    assert run_a.wait(timeout=600) == 0, (tmp_path / "a.out").read_text()[-3000:]
    assert (wd / shard_a).exists() and (wd / shard_b).exists()
    for shard in ("00000", "00001"):  # each job ran once, by one run
        assert _job_blocks(wd, "samples", f"dataset={DATASET}, shard={shard}") == 1
    assert not is_locked(wd)
