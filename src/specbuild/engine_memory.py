"""Memory settings of an in-process SGLang engine (stages hidden and align).

They size the engine's KV pool and change no output, so the rules hand them to jobs as
Snakemake resources, not params: a job made to fit beside others on a GPU
(`sglang.hidden.mem_fraction_static` beside a data server on one H200) must not rerun every finished
shard, as a changed param does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MEMORY_SERVER_ARGS", "with_memory", "without_memory"]

# server flags of that kind; the in-process runner takes its own fraction
MEMORY_SERVER_ARGS = ("mem_fraction_static",)


def without_memory(server_args: Mapping[str, Any]) -> dict[str, Any]:
    """The server flags less the memory ones: what goes into a job's params."""
    return {k: v for k, v in server_args.items() if k not in MEMORY_SERVER_ARGS}


def with_memory(backend_options: Mapping[str, Any], mem_fraction_static: str) -> dict[str, Any]:
    """A feature backend's options with the job's memory resource ("" for a backend without
    one, e.g. hf) put back."""
    if not mem_fraction_static:
        return dict(backend_options)
    return {**backend_options, "mem_fraction_static": float(mem_fraction_static)}
