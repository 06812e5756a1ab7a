"""A job's log file holds what killed the job.

Snakemake points a failed job at its `log:` file, but an exception nobody catches goes to
stderr only, so the log ends mid-story. `start_job_log` sets up the job's logging
(`specbuild.infra.io.setup_logging`) and hooks `sys.excepthook`, so the traceback that ends the job
is written to its log file too (and to stderr, once).

Some endings are the user's, not bugs, and get their message without a traceback: Ctrl-C (the
job stops; atomic writes leave nothing that looks finished) and any `JobFault`
(`specbuild.infra.faults`: a full disk, a hidden-state shard that fails verification, ...),
whose message names the file and the fix; a traceback would point at specbuild's code instead.
"""

from __future__ import annotations

import logging
import os
import sys
from types import TracebackType

from specbuild.infra.faults import JobFault
from specbuild.infra.io import setup_logging

__all__ = ["start_job_log"]


def start_job_log(log: str | os.PathLike | None, *, append: bool = False) -> logging.Logger:
    """Log to the job's log file and stderr; an uncaught exception is logged there as well."""
    logger = setup_logging(log, append=append)

    def log_uncaught(
        kind: type[BaseException], err: BaseException, tb: TracebackType | None
    ) -> None:
        if issubclass(kind, KeyboardInterrupt):
            # the interpreter still exits as killed by SIGINT, which Snakemake reads as such
            logger.error("job interrupted (Ctrl-C): nothing it was writing kept its name")
            return
        if issubclass(kind, JobFault):
            logger.critical("job failed: %s", err)
            return
        logger.critical("job failed: %s: %s", kind.__name__, err, exc_info=(kind, err, tb))

    sys.excepthook = log_uncaught
    return logger
