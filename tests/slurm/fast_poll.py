"""Snakemake with the SLURM executor's status checks at most POLL_S seconds apart.

snakemake-executor-plugin-slurm waits 10 s longer after every check that saw no job end (up
to 180 s; not a setting in 2.8.0): sparing a real cluster's controller, but on the tests'
one-node cluster, whose jobs take seconds, most of each job's wall time was that wait. The
tests run the same plugin through this launcher, so every squeue check, submission and
cancel is the plugin's own; only the pause between checks is capped.

    python tests/slurm/fast_poll.py --profile profiles/slurm-test ...
"""

from __future__ import annotations

import sys

from snakemake.cli import main
from snakemake_executor_plugin_slurm import Executor

POLL_S = 2

_check_active_jobs = Executor.check_active_jobs


async def _check_capped(self, active_jobs):
    async for job in _check_active_jobs(self, active_jobs):
        yield job
    self.next_seconds_between_status_checks = min(self.next_seconds_between_status_checks, POLL_S)


Executor.check_active_jobs = _check_capped

if __name__ == "__main__":
    sys.exit(main())
