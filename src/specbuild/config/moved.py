"""Keys of earlier releases: each names where its value goes now.

Contract: `moved_faults` returns one 'old.key: moved to ...' line per such key a config still
sets; `is_moved` tells the schema's 'unknown key' faults under them apart, so each old key is
reported once, by the line that names its successor.
"""

from __future__ import annotations

from collections.abc import Mapping

from specbuild.config.schema import fault_key, mapping

__all__ = ["MOVED", "is_moved", "moved_faults"]

# The serving bench became the bench stage's sglang engine (one stage for every engine):
# each old key and where its value goes now.
MOVED = {
    "sglang.bench": {
        "enabled": "add sglang to bench.engines",
        "chains": "bench.chains",
        "baseline": "bench.baseline",
        "sets": "bench.sets",
        "max_new_tokens": "bench.max_new_tokens",
        "concurrency": "bench.concurrency",
        "sweep_min_requests": "bench.sweep_min_requests",
    },
    "bench.backend": "bench.engines (a list of hf, sglang, openai)",
    "bench.dtype": "bench.hf.dtype",
    "bench.device": "bench.hf.device",
    "bench.threads": "bench.hf.threads",
    "bench.exclusive": "bench.hf.exclusive",
    # the bench measures every variant: our drafters by name, others' by folder
    "bench.drafter": (
        "bench.variants (which of ours to bench; each variant's results/drafter/<name> by "
        "default) and bench.drafters (name: folder, a drafter built elsewhere)"
    ),
    "bench.drafter_name": (
        "the rows' `drafter` (each variant's name, each bench.drafters key, bench.openai.drafter)"
    ),
}


def moved_faults(config: Mapping) -> list[str]:
    """One line per key of an earlier release, naming the key(s) that replace it."""
    faults = []
    for key, where in MOVED.items():
        section, name = key.split(".")
        value = mapping(config.get(section)).get(name)
        if value is None:
            continue
        if isinstance(where, dict):
            parts = [f"{k} -> {where.get(k, 'gone')}" for k in mapping(value)]
            where = "bench (one stage for every engine): " + ("; ".join(parts) or "nothing set")
        faults.append(f"{key}: moved to {where}")
    return faults


def is_moved(fault: str, moved: list[str]) -> bool:
    """Whether `fault` is about a moved key (or a key below one) of `moved_faults`' lines."""
    key = fault_key(fault)
    return any(key == fault_key(m) or key.startswith(fault_key(m) + ".") for m in moved)
