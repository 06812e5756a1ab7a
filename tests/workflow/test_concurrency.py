"""Independent jobs run at the same time: two shards' jobs overlap with `--cores 2`.

The evidence is Snakemake's own run log, in event order: it prints a job's block
("rule NAME:" ... "jobid: N") when it launches the job and "Finished jobid: N" only after the
job's process has exited, so a job launched before another one's finish line ran while the
other was still running. The same two jobs with `--cores 1` must not overlap (the control).
"""

from __future__ import annotations

import re
from itertools import combinations
from pathlib import Path

import pytest
from workflow_helpers import DATASET, copy_workdir, snakemake

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
