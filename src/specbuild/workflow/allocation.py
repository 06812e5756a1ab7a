"""A SLURM allocation's own Snakemake: the one in the batch step of a cluster job of
`profiles/slurm`, which runs that job's Snakemake jobs (a group of one stage's shards, or one
job), each in a job step of its own (docs/clusters.md)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["batch_step", "keep_going"]


def batch_step(workflow: Any) -> bool:
    """Whether this Snakemake is an allocation's own: a remote (cluster job) Snakemake in the
    allocation's batch step, not in a job step (`srun`) of it."""
    return (
        workflow.remote_exec
        and bool(os.environ.get("SLURM_JOB_ID"))
        and not os.environ.get("SLURM_STEP_ID")
    )


def keep_going(workflow: Any) -> None:
    """Run every job of this allocation's group even after one failed: Snakemake passes
    --keep-going on to no cluster job, so one bad shard would leave the group's later shards
    unrun. Its execution settings exist only once the Snakefile is parsed: set just before the
    run starts."""
    execute = workflow.execute

    def execute_keeping_going(*args: Any, **kwargs: Any) -> Any:
        workflow.execution_settings.keep_going = True
        return execute(*args, **kwargs)

    workflow.execute = execute_keeping_going
