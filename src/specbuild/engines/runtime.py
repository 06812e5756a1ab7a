"""Engine settings that change no output: the memory of an in-process SGLang engine (stages
hidden and align), whether generation jobs share one server (generate, synthesize) and
whether hidden jobs share one feature engine.

The rules hand them to jobs as Snakemake resources, not params: a job made to fit beside others
on a GPU (`sglang.hidden.mem_fraction_static` beside a data server on one H200), or sharing a
server, must not rerun every finished shard, as a changed param does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "MEMORY_SERVER_ARGS",
    "sharing_seconds",
    "with_memory",
    "with_sharing",
    "without_memory",
]

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


def with_sharing(backend_args: Mapping[str, Any], share_idle_s: str) -> dict[str, Any]:
    """A generation backend's or bench engine's arguments with the job's sharing resource (""
    for an engine that starts no server: hf, openai) put back."""
    if not share_idle_s:
        return dict(backend_args)
    return {**backend_args, "share_idle_s": float(share_idle_s)}


def sharing_seconds(share_idle_s: str) -> float:
    """A job's sharing resource as the idle seconds its shared engine waits (0: not shared)."""
    return float(share_idle_s) if share_idle_s else 0.0
