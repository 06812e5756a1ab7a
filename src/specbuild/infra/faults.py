"""Faults that are the user's to fix, not bugs: a job's log says them in their own words.

A `JobFault`'s message names the file (or folder) and the fix; `specbuild.infra.joblog` logs
it alone, without a traceback, which would point at specbuild's code rather than at the file
to fix. A full disk (`specbuild.infra.disk.DiskFullError`), a hidden-state shard that fails
verification (`specbuild.hidden.shards.ShardError`) and a keeper folder another user could
write (`specbuild.infra.private_dirs.UnsafeFolderError`) are such faults.
"""

from __future__ import annotations

__all__ = ["JobFault"]


class JobFault(Exception):
    """A fault of the data, the machine or the setup; its message names what and the fix."""
