"""Folders only this user may write: the keepers' registry and everything in it.

A kept engine runs the requests it finds in its folder, as the user who started it, and
writes its outputs where a request says; a job trusts the pid and answers it finds there, and
the GPU locks in theirs. A folder another user can write (a shared project folder under
`umask 002`, or a predictable name under /tmp that someone created first) would let them
make the engine run their request or hold a job's GPUs. So each such folder is created 0700,
whatever the umask, and one that exists is used only when it is a real folder (not a link),
this user's, and writable by no one else.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from specbuild.infra.faults import JobFault

__all__ = ["UnsafeFolderError", "check_private_dir", "private_dir"]

PRIVATE_MODE = 0o700


class UnsafeFolderError(JobFault, RuntimeError):
    """A folder that must be this user's alone is not; the message names it and the fix."""


def check_private_dir(path: str | os.PathLike, *, setting: str = "SPECBUILD_KEEPERS") -> Path:
    """`path`, when it is a folder (not a link) owned by this user and writable by no one
    else; raises UnsafeFolderError otherwise, naming `setting`, the variable that moves it."""
    path = Path(path)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a folder"
    elif st.st_uid != os.getuid():
        problem = f"belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"is writable by its group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    else:
        return path
    raise UnsafeFolderError(
        f"{path}: {problem}; specbuild acts as you on what it finds in this folder, so it must "
        f"be a folder of yours that no one else can write. Remove it (rm -r {path}) if it is "
        f"yours to remove, or set {setting} to a folder of your own; specbuild creates it "
        f"with mode 0700"
    )


def private_dir(path: str | os.PathLike, *, setting: str = "SPECBUILD_KEEPERS") -> Path:
    """Folder `path`, created 0700 if absent (its parents as any folder), else checked
    (`check_private_dir`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, PRIVATE_MODE)
    except FileExistsError:
        return check_private_dir(path, setting=setting)
    os.chmod(path, PRIVATE_MODE)  # mkdir's mode passes through the umask
    return path
