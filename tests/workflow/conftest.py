"""Workflow fixtures (helpers in workflow_helpers.py): one tiny workflow, built once."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from workflow_helpers import copy_workdir, make_workdir, planned_jobs, snakemake


@dataclass(frozen=True)
class Built:
    """A tiny workflow run to completion: its folder, the jobs that run scheduled, its log."""

    workdir: Path
    jobs: list[tuple[str, str]]  # (rule, wildcards), sorted, from the dry-run before the run
    log: Path  # Snakemake's own log of the run (.snakemake/log/*.snakemake.log)


def build(workdir: Path, target_dir: Path) -> Built:
    make_workdir(workdir, target_dir)
    jobs = planned_jobs(workdir)
    snakemake(workdir, "--cores", "2")
    (log,) = sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log"))
    return Built(workdir=workdir, jobs=jobs, log=log)


@pytest.fixture(scope="session")
def built_workflow(tmp_path_factory, target_dir, file_lock) -> Built:
    """The tiny workflow run once, locally, with `--cores 2`. Read-only: a test that changes
    files works on `copy_workdir(built.workdir, ...)`."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return build(tmp_path_factory.mktemp("built") / "wf", target_dir)
    # Under pytest-xdist each worker has a session of its own: the first to get here builds the
    # workflow once for the run (in the temp folder the workers share), and every worker tests
    # on a copy of its own, since tests dry-run Snakemake in it and two Snakemakes in one folder
    # would meet at its locks. A copy keeps mtimes and metadata: nothing in it is out of date.
    shared = tmp_path_factory.getbasetemp().parent / "built"
    record = shared / "built.json"
    with file_lock(shared.with_suffix(".lock")):
        if not record.exists():
            built = build(shared / "wf", target_dir)
            rows = {"jobs": built.jobs, "log": str(built.log.relative_to(built.workdir))}
            record.write_text(json.dumps(rows))
        rows = json.loads(record.read_text())
        workdir = copy_workdir(shared / "wf", tmp_path_factory.mktemp("built") / "wf")
    jobs = [tuple(job) for job in rows["jobs"]]
    return Built(workdir=workdir, jobs=jobs, log=workdir / rows["log"])
