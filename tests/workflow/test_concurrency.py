"""Independent jobs run at the same time: the built run (`--cores 2`) overlapped two shards.

Evidence comes from two independent clocks:
- Snakemake's own run log, in event order: it prints a job's block ("rule NAME:" ...
  "jobid: N") when it launches the job and "Finished jobid: N" after the job's process has
  exited, so a job launched before another one's finish line ran while that one was running;
- the jobs' own logs (setup_logging timestamps): their [first, last] line intervals intersect.
"""

from __future__ import annotations

import re
from itertools import combinations
from pathlib import Path

import pytest

pytestmark = pytest.mark.workflow

_START = re.compile(r"^(?:local)?rule (\w+):$")
_JOBID = re.compile(r"^\s+jobid: (\d+)$")
_WILDCARDS = re.compile(r"^\s+wildcards: (.*)$")
_FINISHED = re.compile(r"^Finished jobid: (\d+)")
_STAMP = re.compile(r"^(\d\d:\d\d:\d\d) ")


def job_events(log: Path) -> dict[int, dict]:
    """jobid -> {rule, wildcards, start, end}: positions of its launch and finish in the log."""
    jobs: dict[int, dict] = {}
    rule = None
    for pos, line in enumerate(log.read_text().splitlines()):
        if m := _START.match(line):
            rule, wildcards = m.group(1), ""
        elif rule and (m := _WILDCARDS.match(line)):
            wildcards = m.group(1)
        elif rule and (m := _JOBID.match(line)):
            jobs[int(m.group(1))] = {"rule": rule, "wildcards": wildcards, "start": pos}
        elif m := _FINISHED.match(line):
            jobs[int(m.group(1))]["end"] = pos
            rule = None
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


def log_interval(workdir: Path, job: dict) -> tuple[str, str]:
    """First and last HH:MM:SS stamp of the job log logs/<rule>/<dataset>/<shard>.log."""
    fields = dict(kv.split("=") for kv in job["wildcards"].split(", "))
    path = workdir / "logs" / job["rule"] / fields["dataset"] / f"{fields['shard']}.log"
    stamps = [m.group(1) for line in path.read_text().splitlines() if (m := _STAMP.match(line))]
    assert stamps, f"{path} has no timestamped line"
    return min(stamps), max(stamps)


def test_every_job_of_the_run_finished(built_workflow):
    jobs = job_events(built_workflow.log)
    assert len(jobs) == len(built_workflow.jobs) + 1  # + the `all` job
    assert all("end" in j for j in jobs.values())


def test_two_shards_jobs_ran_at_the_same_time_with_two_cores(built_workflow):
    pairs = overlapping_shard_pairs(job_events(built_workflow.log))
    assert pairs, f"no two shard jobs overlapped in {built_workflow.log}"
    for a, b in pairs:
        (a0, a1), (b0, b1) = (log_interval(built_workflow.workdir, j) for j in (a, b))
        # HH:MM:SS strings compare as times (a run crossing midnight would need dates).
        assert a0 <= b1 and b0 <= a1, f"{a} and {b}: job logs {a0}-{a1} and {b0}-{b1}"


def test_overlap_detection_rejects_jobs_that_ran_one_after_the_other(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(
        "rule samples:\n    jobid: 1\n    wildcards: dataset=d, shard=00000\n"
        "Finished jobid: 1 (Rule: samples)\n"
        "rule samples:\n    jobid: 2\n    wildcards: dataset=d, shard=00001\n"
        "Finished jobid: 2 (Rule: samples)\n"
    )
    assert overlapping_shard_pairs(job_events(log)) == []
