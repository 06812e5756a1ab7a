"""Per-job costs Snakemake charges our DAG of thousands of shards, cut without changing any
decision it makes (what runs, what reruns, what params it records).

Measured by `make bench-workflow` (benchmarks.workflow, BENCHMARKS.md) on 2,000 shards:
our parse itself (config validation, shard digests, helpers) is a few hundredths of a dry-run;
the gap to a bare Snakefile of the same shape is Snakemake's own work per job for what our rules
declare. Two parts of it are pure repetition, and these helpers remove them:

- `job_function`: for every function a rule calls per job (input and params functions),
  Snakemake reads `inspect.signature` two or three times on every job (2-4% of a run). The
  signature is read once here and handed to Snakemake through its own
  `overwrite_function_params` hook.
- `memoize_source_paths`: for every job that will run, Snakemake resolves the rule's `script:`
  through its source cache three times, and each time smart_open's `parse_uri` builds a new
  namedtuple class for the path (~1/8 of a 2,000-shard dry-run). Parsing a path string is a
  pure function of that string, so a cache of it changes nothing but time.

Both only skip recomputing a value Snakemake would compute identically; neither touches a job's
files, params or code, so the metadata Snakemake records and compares stays the same.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TypeVar

from snakemake.common import overwrite_function_params

__all__ = ["job_function", "memoize_source_paths"]

F = TypeVar("F", bound=Callable)


def job_function(func: F) -> F:
    """Mark an input or params function of a rule: its signature is read once, here.

    Example:
        @job_function
        def shard_digest(wildcards): ...
    """
    overwrite_function_params(func, inspect.signature(func).parameters)
    return func


def memoize_source_paths() -> bool:
    """Cache the URI parse that Snakemake's source cache repeats per job (idempotent).

    Returns True when the cache is in place; False when this Snakemake has no such function
    (the workflow then runs as before, only slower).
    """
    import snakemake.sourcecache as sourcecache

    parse = getattr(sourcecache, "parse_uri", None)
    if parse is None:
        return False
    if not hasattr(parse, "cache_info"):
        # One entry per distinct script, Snakefile or env path: a bound guards a misuse only.
        sourcecache.parse_uri = functools.lru_cache(maxsize=4096)(parse)
    return True
