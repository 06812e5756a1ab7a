"""Free disk space: checked before a stage's work, and a full disk said in a few lines.

Contract: every stage that writes calls `ensure_free_space(out, need, what)` before its work,
with `need` from one of the estimates below (each says what it counts); too little room raises
`DiskFullError`, naming the path, the need and what is free. A write that still fills the disk
(the estimate is an estimate; other jobs write too) is turned into the same error by
`specbuild.infra.io.atomic_path`, naming the file it was to become: nothing keeps a final name, and
the rerun after freeing space writes the same bytes. `specbuild.infra.joblog` prints a DiskFullError
as its message alone, no traceback: a full disk is the user's to fix, not a bug.

Why check first: a write that fills the disk after an hour of GPU work loses the hour.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from specbuild.infra.faults import JobFault

# `io` imports this module (atomic writes report a full disk through it): nothing from io here
__all__ = [
    "DiskFullError",
    "ensure_free_space",
    "free_bytes",
    "disk_full_error",
    "generate_need",
    "tokenize_need",
    "train_need",
    "export_need",
]

# Asked on top of an estimate: logs, metadata, and the estimate being one.
MARGIN = 1.05
# A generated token as stored in the output JSONL: a BPE token averages ~4 characters of
# English, written as UTF-8 (up to 4 bytes for a non-Latin character) inside a JSON string
# (escapes): 16 bytes covers the worst realistic mix without refusing a run that fits.
BYTES_PER_GENERATED_TOKEN = 16
# A tokenized row per byte of its generated JSONL: at least ~1 byte of text per token, each
# written as an id of up to 6 digits and a comma, a loss-mask digit and a comma (~10 bytes),
# so at most ~10x; real text (~4 bytes a token) needs ~2.5x. 4x: real text with room.
TOKENIZE_EXPANSION = 4
# Training state per parameter: fp32 weights (4 bytes) and AdamW's two fp32 moments (8 bytes)
# of the trainable ones; the checkpoint kept (state.save_checkpoint keep=1) plus the one being
# written before it goes.
CHECKPOINTS_AT_ONCE = 2


class DiskFullError(JobFault, OSError):
    """Too little free space for a write; the message names the path, the need and the free."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _existing_folder(path: Path) -> Path:
    """The nearest folder of `path` that exists (its filesystem is the one written to)."""
    folder = path if path.is_dir() else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def free_bytes(path: str | os.PathLike) -> int:
    """Free bytes, for this user, on the filesystem `path` (or its nearest folder) is on."""
    return shutil.disk_usage(_existing_folder(Path(path))).free


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e7 else f"{n / 1e6:.2f} MB"


def disk_full_error(
    path: str | os.PathLike, reason: str, *, need: int | None = None
) -> DiskFullError:
    """The DiskFullError for `path`: the reason, the need if known, what is free, the fix."""
    path = Path(path)
    folder = _existing_folder(path)
    try:
        free = f"{_gb(free_bytes(folder))} free"
    except OSError:
        free = "free space unknown"
    needs = f"needs ~{_gb(need)}, " if need is not None else ""
    real = folder.resolve()
    on = f"{folder} (on {real})" if real != folder.absolute() else f"{folder}"
    return DiskFullError(
        f"{path}: {reason}\n"
        f"  {needs}{on} has {free}\n"
        "  free space there, or move results/ to a larger disk (a symlink to it works); "
        "then rerun: nothing half-written kept its name"
    )


def ensure_free_space(
    path: str | os.PathLike, need_bytes: int, what: str, *, hint: str = ""
) -> None:
    """Fail before the work when the filesystem `path` will be on has less than `need_bytes`
    free (with 5% to spare). `what` names the output in the message; `hint` adds a fix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if free_bytes(path.parent) >= need_bytes * MARGIN:
        return
    err = disk_full_error(
        path, f"not enough free disk space for {what}", need=int(need_bytes * MARGIN)
    )
    if hint:
        err = DiskFullError(f"{err.message}\n  or {hint}")
    raise err


def generate_need(*, samples: str | os.PathLike, new_tokens: int, copies: int = 1) -> int:
    """Bytes of a generated shard: `copies` times (answers per prompt) the samples file it
    repeats (prompts and all) and the `new_tokens` its records can gain (every answer and
    written turn at its max_new_tokens), BYTES_PER_GENERATED_TOKEN each."""
    return copies * (os.path.getsize(samples) + new_tokens * BYTES_PER_GENERATED_TOKEN)


def tokenize_need(*, generated: str | os.PathLike) -> int:
    """Bytes of a tokenized shard: its generated JSONL's size * TOKENIZE_EXPANSION."""
    return os.path.getsize(generated) * TOKENIZE_EXPANSION


def train_need(*, parameters: int, trainable: int) -> int:
    """Bytes of a training run's state: CHECKPOINTS_AT_ONCE checkpoints of fp32 weights and
    AdamW moments, and the best drafter (fp32 weights). `parameters` counts the tensors a
    checkpoint holds (`Eagle3Drafter.export_state`: the target's embedding is not one)."""
    checkpoint = parameters * 4 + trainable * 8
    return CHECKPOINTS_AT_ONCE * checkpoint + parameters * 4


# safetensors dtype names of floating tensors, the ones an export casts to its dtype
_FLOAT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
_OTHER_BYTES = {"I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2, "I8": 1, "U8": 1}


def export_need(*, checkpoint: str | os.PathLike, dtype: str) -> int:
    """Bytes of an exported drafter: the checkpoint's parameter count (its safetensors header,
    no tensor read), floating tensors at the export `dtype` (specbuild.infra.dtypes), others (the
    vocabulary maps) at their own width."""
    from safetensors import safe_open  # torch: not at workflow parse time

    from specbuild.infra.dtypes import DTYPES

    dtype_bytes = DTYPES[dtype].itemsize if dtype in DTYPES else 4  # export names a bad one

    total = 0
    with safe_open(str(checkpoint), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            part = f.get_slice(name)
            numel = 1
            for d in part.get_shape():
                numel *= d
            kind = part.get_dtype()
            total += numel * (dtype_bytes if kind in _FLOAT_BYTES else _OTHER_BYTES.get(kind, 8))
    return total
