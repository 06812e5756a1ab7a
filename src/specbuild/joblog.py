"""A job's log file holds what killed the job.

Snakemake points a failed job at its `log:` file, but an exception nobody catches goes to
stderr only, so the log ends mid-story. `start_job_log` sets up the job's logging
(`specbuild.io.setup_logging`) and hooks `sys.excepthook`, so the traceback that ends the job
is written to its log file too (and to stderr, once).
"""

from __future__ import annotations

import logging
import os
import sys
from types import TracebackType

from specbuild.io import setup_logging

__all__ = ["start_job_log"]


def start_job_log(log: str | os.PathLike | None, *, append: bool = False) -> logging.Logger:
    """Log to the job's log file and stderr; an uncaught exception is logged there as well."""
    logger = setup_logging(log, append=append)
    default_hook = sys.excepthook

    def log_uncaught(
        kind: type[BaseException], err: BaseException, tb: TracebackType | None
    ) -> None:
        if issubclass(kind, KeyboardInterrupt):
            default_hook(kind, err, tb)
            return
        logger.critical("job failed: %s: %s", kind.__name__, err, exc_info=(kind, err, tb))

    sys.excepthook = log_uncaught
    return logger
