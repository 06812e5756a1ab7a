"""Atomic file writes and reading users' files.

Writes: a killed job never leaves a file that looks finished. Reads (`iter_utf8_lines`,
`read_text_any`): the files users really have, a UTF-8 BOM from a spreadsheet export, UTF-16 or
UTF-32 from a Windows editor (told by their BOM, or by NUL bytes interleaving the text's first
bytes), or gzip by the name's `.gz`, streamed.
"""

from __future__ import annotations

import codecs
import errno
import glob
import gzip
import hashlib
import json
import logging
import os
import secrets
import socket
import stat
import sys
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from specbuild.infra.disk import DiskFullError, disk_full_error

__all__ = [
    "GZIP_SUFFIX",
    "UndecodableLine",
    "detect_encoding",
    "iter_utf8_lines",
    "read_text_any",
    "user_file_mode",
    "atomic_path",
    "atomic_open",
    "write_json",
    "read_json",
    "write_jsonl",
    "read_jsonl",
    "setup_logging",
    "pid_alive",
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
        if not pid.isdigit() or int(pid) == os.getpid() or pid_alive(int(pid)):
            continue
        try:
            size = tmp.stat().st_size
            tmp.unlink()
        except FileNotFoundError:  # another cleaner got there first
            continue
        log.warning("removed %s (%d bytes): the temp file of a writer that died", tmp, size)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host still runs (another user's counts). A zombie does
    not: one whose parent is gone may wait for an init that never reaps it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: the signal said it exists
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


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
    A full disk (ENOSPC, from the block or from the rename) raises DiskFullError naming
    `path`: the message a user can act on, not the temp file's name in a traceback.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path, mode = _create_temp(path.parent, path.name)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise disk_full_error(path, "no space left on device to start writing it") from None
        raise
    try:
        yield tmp_path
        os.chmod(tmp_path, mode)
        os.replace(tmp_path, path)
    except DiskFullError:
        raise
    except Exception as err:
        if _is_disk_full(err):
            tmp_path.unlink(missing_ok=True)  # the room disk_full_error reports as free
            raise disk_full_error(path, "no space left on device while writing it") from None
        raise
    finally:
        tmp_path.unlink(missing_ok=True)


def _is_disk_full(err: BaseException) -> bool:
    """ENOSPC as Python raises it, or as a native writer (safetensors, torch) words it."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(err)
    return "No space left on device" in text or "os error 28" in text


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
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
            except (RecursionError, ValueError) as err:  # nested too deep, a number too long
                raise ValueError(
                    f"{path}:{lineno}: unreadable JSON ({type(err).__name__})"
                ) from None
            yield row


GZIP_SUFFIX = ".gz"

# Byte order marks, longest first: UTF-32-LE's begins with UTF-16-LE's.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


# The bytes `detect_encoding` is given: enough for a JSON text's punctuation to show its layout.
HEAD_BYTES = 256

# Without a BOM, (encoding, unit size, the bytes of a unit that a JSON text's punctuation, and
# for UTF-32 every character of the Basic Multilingual Plane, leaves 0), told by the NULs of the
# first 4 bytes, longest unit first.
_NUL_LAYOUTS = (
    ((False, True, True, True), "utf-32-le", 4, slice(2, 4)),
    ((True, True, True, False), "utf-32-be", 4, slice(0, 2)),
    ((False, True), "utf-16-le", 2, slice(1, 2)),
    ((True, False), "utf-16-be", 2, slice(0, 1)),
)
# Punctuation characters a JSON text's head holds at the least: `{"` and the `":` after a key.
_MIN_PUNCTUATION = 4


def _nul_interleaved(head: bytes, size: int, zeros: slice) -> bool:
    """Whether `head` reads as text in units of `size` bytes that are 0 where `zeros` says:
    its first two units (JSON starts `{"`, `[{` or with white space, all ASCII) and at least
    _MIN_PUNCTUATION of them (all, in a shorter head). A unit of NULs alone counts for none:
    JSON text holds no U+0000."""
    units = [head[i : i + size] for i in range(0, len(head) - size + 1, size)]
    text = [not any(u[zeros]) and any(u) for u in units]
    return all(text[:2]) and sum(text) >= min(_MIN_PUNCTUATION, len(text))


def detect_encoding(head: bytes) -> tuple[str, int]:
    """(encoding, BOM length) of a text file that starts with `head` (its first HEAD_BYTES
    bytes, or all of a shorter file).

    Without a BOM, a JSON text starts with ASCII characters, so NULs beside the first one
    suggest UTF-16/32 and their byte order; the head must bear it out (`_nul_interleaved`).
    Anything else is UTF-8: a UTF-8 file whose first line holds a stray NUL loses that line
    alone (a reject), not every line to the wrong codec.
    """
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            return encoding, len(bom)
    nuls = tuple(b == 0 for b in head[:4])
    for pattern, encoding, size, zeros in _NUL_LAYOUTS:
        if nuls[: len(pattern)] == pattern:
            return (encoding, 0) if _nul_interleaved(head, size, zeros) else ("utf-8", 0)
    return "utf-8", 0


@contextmanager
def _open_binary(path: Path) -> Iterator[IO[bytes]]:
    """The file's bytes, gunzipped as they are read when the name ends in .gz."""
    if path.name.lower().endswith(GZIP_SUFFIX):
        with gzip.open(path, "rb") as fh:
            yield fh
    else:
        with open(path, "rb") as fh:
            yield fh


# A gzip file cut short (EOFError), not gzip at all (BadGzipFile), or with a corrupt deflate
# stream under a valid header (zlib.error, which is neither an OSError nor a ValueError).
_GZIP_FAULTS = (gzip.BadGzipFile, EOFError, zlib.error)


def _not_gzip(path: Path, err: Exception) -> ValueError:
    return ValueError(
        f"{path}: not a readable gzip file ({err}); the name ends in .gz: compress it with "
        "gzip (again, where a copy cut it short or damaged it), or drop the .gz from the name"
    )


class UndecodableLine(bytes):
    """A line of a UTF-16/32 file that its codec cannot decode: its text as UTF-8 bytes, U+FFFD
    where the bad bytes were (for a reject's `raw` and a shard's digest), and `fault`, the
    reason it is rejected for (specbuild.infra.records.parse_record raises it)."""

    fault: str

    def __new__(cls, text: bytes, fault: str) -> UndecodableLine:
        line = super().__new__(cls, text)
        line.fault = fault
        return line


# Bytes of a UTF-16/32 file read at a time while cutting it into lines.
_CHUNK_BYTES = 1 << 16


def _decoded_line(raw: bytes, encoding: str) -> bytes:
    """One line of a UTF-16/32 file (without its \n) as UTF-8 bytes without its \r."""
    try:
        return raw.decode(encoding).rstrip("\r").encode("utf-8")
    except UnicodeDecodeError as err:
        text = raw.decode(encoding, "replace").rstrip("\r").encode("utf-8")
        bad = raw[err.start : err.end]
        return UndecodableLine(
            text, f"not {encoding.upper()} (byte {err.start}: {bad!r}, {err.reason})"
        )


def _wide_lines(fh: IO[bytes], encoding: str) -> Iterator[tuple[int, bytes]]:
    """The lines of a UTF-16/32 stream, cut at its \n code units and decoded one by one: a
    line its codec cannot decode is one UndecodableLine, and the lines after it read on (a
    stream decoder stops at the first bad byte, and its position says no line)."""
    newline = "\n".encode(encoding)
    unit = len(newline)  # a \n is one code unit; U+000A is never part of another character
    buf, lineno, done = b"", 0, False
    while not done:
        chunk = fh.read(_CHUNK_BYTES)
        done = not chunk
        buf += chunk
        start = search = 0
        while (end := buf.find(newline, search)) != -1:
            if end % unit:  # inside a code unit: not a line end (buf starts on a unit boundary)
                search = end + 1
                continue
            lineno += 1
            yield lineno, _decoded_line(buf[start:end], encoding)
            start = search = end + unit
        buf = buf[start:]
    if buf:  # the last line, without a line end (or cut short: then it is the one rejected)
        yield lineno + 1, _decoded_line(buf, encoding)


def iter_utf8_lines(path: str | os.PathLike) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line as UTF-8 bytes without its line end) of every line of a text
    file, blank ones included, in any encoding `detect_encoding` tells, gzipped or not.

    A UTF-8 file's lines are its exact bytes (a BOM dropped), so one line that is not UTF-8 is
    the caller's to reject; lines end at \n only, as JSONL's do. A UTF-16/32 file's lines are
    each decoded and re-encoded; one its codec cannot decode comes as an UndecodableLine, the
    caller's to reject like a UTF-8 file's bad line, and the lines after it are read on.
    """
    path = Path(path)
    try:
        with _open_binary(path) as fh:
            head = fh.peek(HEAD_BYTES)[:HEAD_BYTES] if hasattr(fh, "peek") else b""
            encoding, bom = detect_encoding(head)
            fh.read(bom)
            if encoding == "utf-8":
                for lineno, line in enumerate(fh, 1):
                    yield lineno, line.rstrip(b"\r\n")
                return
            yield from _wide_lines(fh, encoding)
    except _GZIP_FAULTS as err:
        raise _not_gzip(path, err) from None


def read_text_any(path: str | os.PathLike) -> str:
    """The whole text of a file in any encoding `detect_encoding` tells, gzipped or not; bytes
    that are not of that encoding fail naming the file, the offset and the encoding."""
    path = Path(path)
    try:
        with _open_binary(path) as fh:
            data = fh.read()
    except _GZIP_FAULTS as err:
        raise _not_gzip(path, err) from None
    encoding, bom = detect_encoding(data[:HEAD_BYTES])
    try:
        return data[bom:].decode(encoding)
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path}: not {encoding.upper()} (byte {err.start + bom}: "
            f"{data[err.start + bom : err.start + bom + 1]!r}); re-save it as UTF-8"
        ) from None


def _say_log_stops(log: str | os.PathLike) -> None:
    print(
        f"specbuild: {log}: no space left on device; this job logs to stderr only", file=sys.stderr
    )


class _LogFile(logging.FileHandler):
    """A job's log file that a full disk ends quietly: the lines written so far stay, the rest
    goes to stderr only. Python's default prints a `--- Logging error ---` traceback for every
    line after, burying the one message that says which disk is full."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        err = sys.exc_info()[1]
        if err is None or not _is_disk_full(err):
            super().handleError(record)
            return
        stream, self.stream = self.stream, None
        try:
            stream.close()  # its unwritten buffer cannot be written either
        except OSError:
            pass
        self.emit = lambda record: None  # type: ignore[method-assign]
        _say_log_stops(self.baseFilename)


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
        try:
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            handlers.append(_LogFile(log, mode="a" if append else "w", encoding="utf-8"))
        except OSError as err:
            if not _is_disk_full(err):
                raise
            _say_log_stops(log)
    for h in handlers:
        h.setFormatter(fmt)
        logger.addHandler(h)
    logger.propagate = False
    return logger
