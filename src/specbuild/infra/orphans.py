"""Outputs an orphaned job finished: recognised by the rerun of the same job, not made again.

A job whose snakemake was killed runs on, an orphan (its `$SPECBUILD_RUN` names a run that has
ended), and publishes its outputs, each atomically; but no run records them, and Snakemake's
incomplete marker stays, so the next run (`--rerun-incomplete`, as `make run` passes it)
deletes them and runs the job again: a `generate` shard paid for twice.

Here a job that finishes as an orphan (`keep_if_orphan`) leaves hard links of its outputs and a
receipt in a folder beside its first output that no rule names (`.<name>.orphan/`): the job's
key (its params, specbuild's version and the sha256 of each input file) and the sha256 of each
output. Snakemake deletes the outputs before it reruns the job, not the links. The rerun
(`reuse_orphan`) publishes them again, each atomically, only when the key is its own and
every output's checksum verifies; a stash of another key or that does not verify is removed,
and the job runs. A stash is used once. A job of a live run leaves none: its run records its
outputs.

Why this is safe: the outputs are those the same job (the same params, the same input bytes,
the same specbuild) published whole, checked byte for byte against what it published; a run
that was not killed would have kept exactly them. What it does not cover: a change to the
workflow's own code between the two runs that leaves specbuild's version as it was (Snakemake
reruns a job whose rule's code changed; this key does not see it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from specbuild.infra.io import atomic_path, read_json, write_json
from specbuild.infra.run_lock import run_ended

__all__ = ["job_key", "keep_if_orphan", "reuse_orphan"]

log = logging.getLogger("specbuild")

STASH_SUFFIX = ".orphan"
RECEIPT = "receipt.json"


def _sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def job_key(params: Mapping[str, Any], inputs: Iterable[str | os.PathLike]) -> str:
    """The identity of one job's work: its params (the caller adds specbuild's version), each
    input by path and content."""
    files = [(str(p), _sha256(p)) for p in inputs]
    blob = json.dumps({"params": params, "inputs": files}, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


def _stash(outputs: Sequence[str | os.PathLike]) -> Path:
    first = Path(outputs[0])
    return first.parent / f".{first.name}{STASH_SUFFIX}"


def _linked(stash: Path, i: int, out: str | os.PathLike) -> Path:
    return stash / f"{i}-{Path(out).name}"


def keep_if_orphan(outputs: Sequence[str | os.PathLike], key: str) -> bool:
    """At the end of a job, its outputs published: when its run has ended (an orphan), keep
    them for the rerun of the same job (module docstring); True if kept."""
    if not run_ended():
        return False
    stash = _stash(outputs)
    tmp = stash.with_name(f"{stash.name}.{os.getpid()}.tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        shas = []
        for i, out in enumerate(outputs):
            os.link(out, _linked(tmp, i, out))
            shas.append({"path": str(out), "sha256": _sha256(out)})
        write_json(tmp / RECEIPT, {"key": key, "outputs": shas})
        shutil.rmtree(stash, ignore_errors=True)
        os.replace(tmp, stash)  # whole or absent: the rerun reads it only once renamed
    except OSError as err:  # no hard links there, say: the rerun does the work again
        shutil.rmtree(tmp, ignore_errors=True)
        log.warning("could not keep this orphaned job's outputs for the rerun: %s", err)
        return False
    log.info(
        "this job's snakemake has ended (killed?): its outputs are kept in %s, and the rerun "
        "of the same job publishes them again instead of doing the work",
        stash,
    )
    return True


def _verified(stash: Path, outputs: Sequence[str | os.PathLike], key: str) -> bool:
    try:
        receipt = read_json(stash / RECEIPT)
        recorded = receipt["outputs"]
        if receipt["key"] != key or [o["path"] for o in recorded] != [str(o) for o in outputs]:
            return False
        return all(
            _sha256(_linked(stash, i, out)) == o["sha256"]
            for i, (out, o) in enumerate(zip(outputs, recorded, strict=True))
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def reuse_orphan(outputs: Sequence[str | os.PathLike], key: str) -> bool:
    """At the start of a job: publish again the outputs an orphan of this very job finished
    (the same key, every checksum verified) and return True; else remove any stash there and
    return False (the job does its work)."""
    stash = _stash(outputs)
    if not stash.is_dir():
        return False
    reused = _verified(stash, outputs, key)
    if reused:
        for i, out in enumerate(outputs):
            with atomic_path(out) as tmp:
                tmp.unlink()
                os.link(_linked(stash, i, out), tmp)
            os.utime(out)  # made now, as far as the rerun's decisions go
        log.info(
            "%s: finished by this very job (the same params and inputs) after its snakemake "
            "was killed; its outputs, every checksum verified, are published again, not made "
            "again",
            outputs[0],
        )
    else:
        log.info("%s: the outputs a killed run's job left are of another job; removed", stash)
    shutil.rmtree(stash, ignore_errors=True)
    return reused
