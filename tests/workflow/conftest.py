"""Workflow fixtures (helpers in workflow_helpers.py): one tiny workflow, built once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from workflow_helpers import make_workdir, planned_jobs, snakemake


@dataclass(frozen=True)
class Built:
    """A tiny workflow run to completion: its folder, the jobs that run scheduled, its log."""

    workdir: Path
    jobs: list[tuple[str, str]]  # (rule, wildcards), sorted, from the dry-run before the run
    log: Path  # Snakemake's own log of the run (.snakemake/log/*.snakemake.log)


@pytest.fixture(scope="session")
def built_workflow(tmp_path_factory, target_dir) -> Built:
    """The tiny workflow run once, locally, with `--cores 2`. Read-only: a test that changes
    files works on `copy_workdir(built.workdir, ...)`."""
    workdir = make_workdir(tmp_path_factory.mktemp("built") / "wf", target_dir)
    jobs = planned_jobs(workdir)
    snakemake(workdir, "--cores", "2")
    (log,) = sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log"))
    return Built(workdir=workdir, jobs=jobs, log=log)
