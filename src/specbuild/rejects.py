"""Rejected rows: published with every shard, and checked against the limit by a job of its own.

Nothing is lost: each rejected input row goes to the `.rejected.jsonl` beside the output with
its reason (and to the log), in = kept + rejected is checked and logged, and the counts go to a
small `.counts.json` beside them. The job that publishes a shard never judges its rejected
share: its outputs are the same whatever `max_rejected_fraction` says, so the limit is no input
of it. `check_rejected_share` (one light job per shard, which the next stage waits for) and
`check_reject_table` (one job over every shard, the only one a changed limit reruns) compare the
counts with the limit; a failing check keeps a copy of the rejects beside its log.
"""

from __future__ import annotations

import csv
import logging
import os
import shutil
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from specbuild.infra.io import atomic_open, read_json, write_json, write_jsonl

__all__ = [
    "COUNTS_KEYS",
    "ShardFiles",
    "error_text",
    "log_rejected",
    "publish_shard",
    "read_counts",
    "rejected_share_fault",
    "check_rejected_share",
    "check_reject_table",
]

ERROR_CHARS = 500  # of an exception's text kept as a reject reason


def error_text(err: Exception) -> str:
    """An exception as a reject reason: its type and text, cut at ERROR_CHARS."""
    text = str(err)
    text = text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + "..."
    return f"{type(err).__name__}: {text}"


COUNTS_KEYS = ("label", "in", "kept", "rejected", "output", "rejected_file")
TABLE_COLUMNS = ("stage", "dataset", "shard", "in", "kept", "rejected", "share", "limit", "ok")

log = logging.getLogger("specbuild")


LOGGED_REJECTS = 10  # rows named in the log one by one; the rest are counted by reason


def log_rejected(bad: Sequence[Mapping], rejected: str | os.PathLike) -> None:
    """The first rejects one line each, then the rest by reason: a self-written shard can
    reject thousands of rows for one reason, and every row is in the rejects file anyway."""
    for r in bad[:LOGGED_REJECTS]:
        log.warning("rejected %s: %s", r.get("id"), r["reason"])
    if len(bad) > LOGGED_REJECTS:
        reasons = Counter(r["reason"] for r in bad).most_common(3)
        top = "; ".join(f"{n} x {reason}" for reason, n in reasons)
        log.warning("rejected %d rows in all, each in %s; most often: %s", len(bad), rejected, top)


@dataclass(frozen=True)
class ShardFiles:
    """The three files a shard's job publishes: its rows, its rejected rows (each with a
    "reason") and its counts."""

    out: str | os.PathLike
    rejected: str | os.PathLike
    counts: str | os.PathLike


def publish_shard(
    files: ShardFiles,
    *,
    rows: Iterable[dict],
    bad: list[dict],
    n_in: int,
    label: str,
    detail: str = "",
    log_rejects: bool = True,
    n_kept: int | None = None,
) -> int:
    """Write `bad` (rows with a "reason") to `files.rejected`, then `rows` to `files.out`, then
    the counts to `files.counts`; check and log in = kept + rejected. Returns the rows written.

    `log_rejects=False` where the caller already logged each reject with more context.
    `n_kept`: the input records kept, where one record may make several output rows (the
    counts then count records; None: every row is one record).
    """
    out, rejected = files.out, files.rejected
    if log_rejects:
        log_rejected(bad, rejected)
    write_jsonl(rejected, bad)
    n = write_jsonl(out, rows)
    kept = n if n_kept is None else n_kept
    if kept + len(bad) != n_in or n < kept:  # a row dropped without a reason is a bug
        raise RuntimeError(f"{out}: in={n_in} but kept {kept} + rejected {len(bad)}")
    log.info("%s: in=%d = kept %d + rejected %d%s", label, n_in, kept, len(bad), detail)
    write_json(
        files.counts,
        {
            "label": label,
            "in": n_in,
            "kept": kept,
            "rejected": len(bad),
            "output": str(out),
            "rejected_file": str(rejected),
        },
    )
    return n


def read_counts(path: str | os.PathLike) -> dict:
    """A `.counts.json` written by `publish_shard`; a missing key or a bad sum raises."""
    counts = read_json(path)
    missing = [k for k in COUNTS_KEYS if k not in counts]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)}; rerun the job that wrote it")
    if counts["kept"] + counts["rejected"] != counts["in"]:
        raise ValueError(
            f"{path}: in={counts['in']} != kept {counts['kept']} + rejected "
            f"{counts['rejected']}; rerun the job that wrote it"
        )
    return counts


def _share(counts: dict) -> float:
    return counts["rejected"] / counts["in"] if counts["in"] else 0.0


def rejected_share_fault(counts: dict, *, limit: float, setting: str) -> str | None:
    """Why the shard of `counts` fails the limit, or None when it passes."""
    share = _share(counts)
    if share <= limit:
        return None
    return (
        f"{counts['output']}: {counts['rejected']} of {counts['in']} rows rejected "
        f"({share:.1%} > {setting} {limit:.1%}); reasons in {counts['rejected_file']}"
    )


def check_rejected_share(
    *,
    counts: str | os.PathLike,
    out: str | os.PathLike,
    limit: float,
    setting: str,
    log_path: str | os.PathLike | None = None,
) -> dict:
    """Pass: write the verdict (counts, limit) to `out` and return it. Fail: copy the rejects
    beside `log_path` (the check's outputs go with a failed job; the copy stays) and raise
    naming the rejected file, the copy, the setting and the two ways out.
    """
    c = read_counts(counts)
    fault = rejected_share_fault(c, limit=limit, setting=setting)
    verdict = {**c, "share": _share(c), "limit": limit, "setting": setting, "ok": fault is None}
    note = f"{c['label']}: rejected {c['rejected']} of {c['in']}, limit {limit:.1%} ({setting})"
    if fault is None:
        if log_path:
            _append(log_path, f"ok: {note}")
        write_json(out, verdict)
        return verdict
    if log_path:
        copy = Path(log_path).with_suffix(".rejected.jsonl")
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(c["rejected_file"], copy)
        fault += f" (a copy: {copy})"
        _append(log_path, f"FAILED: {fault}")
    raise RuntimeError(f"{fault}; fix those rows in the input or raise {setting}")


def _append(path: str | os.PathLike, line: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def _where(counts_path: Path) -> tuple[str, str, str]:
    """(stage, dataset, shard) from results/{stage}/{dataset}/{shard}.counts.json."""
    return counts_path.parent.parent.name, counts_path.parent.name, counts_path.name.split(".")[0]


def check_reject_table(
    *,
    counts: Iterable[str | os.PathLike],
    limits: Mapping[str, Mapping[str, object]],
    csv_path: str | os.PathLike,
    md_path: str | os.PathLike,
) -> list[dict]:
    """Every shard's rejected share against its limit, as CSV and Markdown; raises once listing
    every shard over its limit (the tables are written first, and the rejected files are
    outputs of other jobs, so nothing the message names goes away).

    `limits` maps "{stage}/{dataset}" to {"limit": float, "setting": config key}; the counts
    files follow the results/{stage}/{dataset}/{shard}.counts.json path scheme.
    """
    rows, faults = [], []
    for path in map(Path, counts):
        stage, dataset, shard = _where(path)
        key = f"{stage}/{dataset}"
        if key not in limits:
            raise ValueError(f"{path}: no limit for {key}; known: {', '.join(sorted(limits))}")
        limit, setting = float(limits[key]["limit"]), str(limits[key]["setting"])
        c = read_counts(path)
        fault = rejected_share_fault(c, limit=limit, setting=setting)
        if fault:
            faults.append(fault)
        rows.append(
            {
                "stage": stage,
                "dataset": dataset,
                "shard": shard,
                "in": c["in"],
                "kept": c["kept"],
                "rejected": c["rejected"],
                "share": round(_share(c), 4),
                "limit": limit,
                "ok": fault is None,
            }
        )
    _write_table(rows, csv_path, md_path)
    log.info("reject table: %d shards, %d over their limit", len(rows), len(faults))
    if faults:
        raise RuntimeError(
            f"{len(faults)} shard(s) over their rejected-row limit:\n  "
            + "\n  ".join(faults)
            + "\nfix those rows in the input or raise the limit named"
        )
    return rows


def _write_table(rows: list[dict], csv_path: str | os.PathLike, md_path: str | os.PathLike) -> None:
    with atomic_open(csv_path) as fh:
        w = csv.DictWriter(fh, fieldnames=TABLE_COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in TABLE_COLUMNS) + " |" for r in rows]
    with atomic_open(md_path) as fh:
        fh.write("\n".join(lines) + "\n")
