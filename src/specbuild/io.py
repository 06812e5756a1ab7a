"""Atomic file writes and JSONL reading: a killed job never leaves a file that looks finished."""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import secrets
import shutil
import socket
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = [
    "user_file_mode",
    "atomic_path",
    "atomic_open",
    "write_json",
    "read_json",
    "write_jsonl",
    "read_jsonl",
    "setup_logging",
    "ensure_free_space",
]

log = logging.getLogger("specbuild")


# This host in temp file names: a writer's pid means something only on the host that ran it.
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _create_temp(folder: Path, name: str) -> tuple[Path, int]:
    """Create an empty `.{name}.<host>-<pid>-<random>.tmp` in `folder` as open() creates any
    file (mode 0666 less the umask, default ACLs applied); return it and the mode the system
    gave it. Temp files of `name` that a dead writer on this host left go first.

    Why not mkstemp: it creates 0600 whatever the umask, and a renamed temp file keeps its mode,
    so every output would be private. Why not read the umask: os.umask can only be read by
    setting it, which races with other threads creating files.
    """
    _remove_dead_writers_temps(folder, name)
    while True:
        tmp = folder / f".{name}.{_HOST}-{os.getpid()}-{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            return tmp, stat.S_IMODE(os.fstat(fd).st_mode)
        finally:
            os.close(fd)


def _remove_dead_writers_temps(folder: Path, name: str) -> None:
    """Delete the temp files of `name` whose writer, a process of this host, is gone: a killed
    job's half-written shard can be gigabytes, and its rerun would otherwise leave it there."""
    for tmp in folder.glob(f".{glob.escape(name)}.{_HOST}-*-*.tmp"):
        pid = tmp.name[len(name) + len(_HOST) + 3 :].split("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            size = tmp.stat().st_size
            tmp.unlink()
        except FileNotFoundError:  # another cleaner got there first
            continue
        log.warning("removed %s (%d bytes): the temp file of a writer that died", tmp, size)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def user_file_mode(folder: str | os.PathLike) -> int:
    """The mode a file the user creates in `folder` gets now (0666 less the umask)."""
    tmp, mode = _create_temp(Path(folder), "mode-probe")
    tmp.unlink()
    return mode


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds.

    The renamed file has the mode any file the user creates gets (0666 less the umask), also
    when the writer replaced the temp file by its own (safetensors' save_file writes 0600).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path, mode = _create_temp(path.parent, path.name)
    try:
        yield tmp_path
        os.chmod(tmp_path, mode)
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file for writing; it becomes `path` only when the block succeeds."""
    with atomic_path(path) as tmp:
        encoding = None if "b" in mode else "utf-8"
        with open(tmp, mode, encoding=encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_open(path) as fh:
        json.dump(obj, fh, indent=2, sort_keys=True)
        fh.write("\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    """Write rows atomically, one compact JSON object a line; return how many were written."""
    n = 0
    with atomic_open(path) as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")))
            fh.write("\n")
            n += 1
    return n


def read_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    """Rows of a JSONL file this project wrote; a bad line raises naming file and line."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err


def ensure_free_space(path: str | os.PathLike, nbytes: int, *, hint: str = "") -> None:
    """Fail before the work when the filesystem of `path` has less than `nbytes` free (with 5%
    to spare): a write that fills the disk after an hour of GPU work loses the hour."""
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < nbytes * 1.05:
        raise OSError(
            f"{path}: needs ~{nbytes / 1e9:.2f} GB, {folder} has {free / 1e9:.2f} GB free"
            + (f"; {hint}" if hint else "")
        )


def setup_logging(
    log: str | os.PathLike | None, name: str = "specbuild", *, append: bool = False
) -> logging.Logger:
    """Log to the job's log file (Snakemake `log:`) and to stderr, with timestamps.

    `append`: a worker process (torchrun) continues the log its launching job started.
    """
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.handlers.clear()
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log, mode="a" if append else "w", encoding="utf-8"))
    for h in handlers:
        h.setFormatter(fmt)
        logger.addHandler(h)
    logger.propagate = False
    return logger
