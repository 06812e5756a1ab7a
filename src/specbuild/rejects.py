"""Publishing a JSONL shard with its rejects: the rule every row-level stage follows.

Nothing is lost: each rejected input row goes to the `.rejected.jsonl` beside the output with
its reason (and to the log), in = kept + rejected is checked and logged, and a job whose
rejected share exceeds `max_rejected_fraction` fails, naming the limit.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from specbuild.io import write_jsonl

__all__ = ["check_rejected_share", "publish_shard"]

log = logging.getLogger("specbuild")


def check_rejected_share(*, n_in: int, n_rejected: int, limit: float, what: str) -> None:
    """Fail the job when too much of its input was rejected (the rejects are listed in the log)."""
    share = n_rejected / n_in if n_in else 0.0
    if share > limit:
        raise RuntimeError(
            f"{what}: {n_rejected} of {n_in} rows rejected ({share:.1%} > max_rejected_fraction "
            f"{limit:.1%}); see the rejected file/log for reasons, fix the input or raise the limit"
        )


def publish_shard(
    *,
    out: str | os.PathLike,
    rows: Iterable[dict],
    rejected: str | os.PathLike,
    bad: list[dict],
    n_in: int,
    max_rejected_fraction: float,
    label: str,
    detail: str = "",
    log_rejects: bool = True,
) -> int:
    """Write `bad` (rows with a "reason") to `rejected`, then `rows` to `out`; log and check
    in = kept + rejected and the rejected share. Returns the rows written.

    `log_rejects=False` where the caller already logged each reject with more context.
    """
    if log_rejects:
        for r in bad:
            log.warning("rejected %s: %s", r.get("id"), r["reason"])
    write_jsonl(rejected, bad)
    n = write_jsonl(out, rows)
    if n + len(bad) != n_in:  # a row dropped without a reason is a bug, never a silent loss
        raise RuntimeError(f"{out}: in={n_in} but kept {n} + rejected {len(bad)}")
    log.info("%s: in=%d = kept %d + rejected %d%s", label, n_in, n, len(bad), detail)
    check_rejected_share(n_in=n_in, n_rejected=len(bad), limit=max_rejected_fraction, what=str(out))
    return n
