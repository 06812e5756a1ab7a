"""The materialized target as later stages read it: fingerprint.json and the tokenizer.

The `target` stage (specbuild.target) writes the folder and its fingerprint; every later stage
reads them here. Nothing here imports torch, and transformers only inside `load_tokenizer`: a
stage that only checks the target's facts pays for neither.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from specbuild.infra.io import read_json

__all__ = [
    "FINGERPRINT",
    "TargetChangedError",
    "TargetInfo",
    "check_target_files",
    "file_stats",
    "load_tokenizer",
    "read_target_info",
    "recorded_trust_remote_code",
]

FINGERPRINT = "fingerprint.json"


@dataclass(frozen=True)
class TargetInfo:
    """What fingerprint.json records: hashes plus the shape facts later stages need."""

    name: str
    source: str
    fingerprint: str
    weights_sha256: str
    tokenizer_fingerprint: str
    chat_template_sha256: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    model_type: str
    # defaults: what a fingerprint.json written before these fields meant
    weights_hash: str = "full"  # full | sampled (see specbuild.target._weights_digest)
    trust_remote_code: bool = False  # target.trust_remote_code: later loads pass it on
    code_sha256: str = ""  # the folder's *.py (remote code), "" when it has none
    # name -> [bytes, mtime in s] of every file (`check_target_files`): a linked source file
    # rewritten in place, or a symlink pointed elsewhere, changes what later jobs load
    files: dict[str, list[int]] = field(default_factory=dict)


class TargetChangedError(RuntimeError):
    """A file of the materialized target differs from the one its fingerprint describes."""


def file_stats(folder: Path) -> dict[str, list[int]]:
    """name -> [bytes, mtime in s] of the folder's files, through links. Not the inode: a
    results/ moved to another disk keeps sizes and times, not inodes."""
    stats = {}
    for f in sorted(folder.iterdir()):
        if f.name != FINGERPRINT and f.is_file():
            st = f.stat()
            stats[f.name] = [st.st_size, int(st.st_mtime)]
    return stats


def check_target_files(folder: str | os.PathLike, info: TargetInfo) -> None:
    """Stop when a file of the target folder is not the one fingerprinted: a hard-linked source
    file rewritten in place, a symlinked one replaced, a file added or removed."""
    if not info.files:  # written before files were recorded
        return
    folder = Path(folder)
    now = file_stats(folder)
    changed = sorted(
        name for name in now.keys() | info.files.keys() if now.get(name) != info.files.get(name)
    )
    if changed:
        shown = ", ".join(changed[:5]) + (
            f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        )
        raise TargetChangedError(
            f"{folder}: {shown} changed since the target stage fingerprinted it (size, time, or "
            f"a file added or removed; its files are links to {info.source!r}). Rebuild the "
            "target (snakemake --forcerun target); the stages after it rerun on the new "
            "fingerprint."
        )


def read_target_info(fingerprint_json: str | os.PathLike) -> TargetInfo:
    """The fingerprint of a materialized target, after checking its files are the ones hashed."""
    info = TargetInfo(**read_json(fingerprint_json))
    check_target_files(Path(fingerprint_json).parent, info)
    return info


def recorded_trust_remote_code(folder: str | os.PathLike) -> bool:
    """target.trust_remote_code as the folder's fingerprint.json records it (False if none)."""
    path = Path(folder) / FINGERPRINT
    return bool(read_json(path).get("trust_remote_code", False)) if path.is_file() else False


def load_tokenizer(folder: str | os.PathLike, *, trust_remote_code: bool | None = None):
    """The target's tokenizer. `trust_remote_code` None: as fingerprint.json records it; always
    passed to transformers, which otherwise asks on a terminal (and fails without one)."""
    from transformers import AutoTokenizer

    trust = recorded_trust_remote_code(folder) if trust_remote_code is None else trust_remote_code
    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust)
