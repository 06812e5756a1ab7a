"""An output folder that is a symlink (results/ -> a larger disk) works with Snakemake.

After a run in which some outputs are missing (a job failed), Snakemake removes the folders of
those outputs that are empty (`DAG.cleanup_workdir`, with `os.removedirs`). When such a folder
is itself a symlink, `rmdir` refuses it with NotADirectoryError, and Snakemake 9 ends the run
with that traceback instead of the job's error. `keep_linked_output_folders` makes the cleanup
stop at a symlink: the link and the folder it points to are the user's, and an empty folder
left behind changes nothing Snakemake decides.
"""

from __future__ import annotations

import functools
import logging
import os

__all__ = ["keep_linked_output_folders"]

log = logging.getLogger("specbuild")


def keep_linked_output_folders() -> bool:
    """Let Snakemake's empty-folder cleanup end at a symlinked folder (idempotent).

    Returns True when in place; False, with a warning, when this Snakemake has no such cleanup.
    """
    from snakemake.dag import DAG

    cleanup = getattr(DAG, "cleanup_workdir", None)
    if cleanup is None:
        log.warning(
            "this Snakemake has no DAG.cleanup_workdir to guard: with results/ a symlink, a run "
            "with a failed job may end with NotADirectoryError instead of the job's error"
        )
        return False
    if getattr(cleanup, "keeps_linked_folders", False):
        return True

    @functools.wraps(cleanup)
    def cleanup_workdir(self) -> None:
        try:
            cleanup(self)
        except NotADirectoryError as err:
            if not (err.filename and os.path.islink(err.filename)):
                raise

    cleanup_workdir.keeps_linked_folders = True  # type: ignore[attr-defined]
    DAG.cleanup_workdir = cleanup_workdir
    return True
