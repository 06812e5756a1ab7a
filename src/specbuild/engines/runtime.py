"""Engine settings that change no output: the memory of an in-process SGLang engine (stages
hidden and align), whether generation jobs share one server (generate, synthesize) and
whether hidden jobs share one feature engine.

The rules hand them to jobs as Snakemake resources, not params: a job made to fit beside others
on a GPU (`sglang.hidden.mem_fraction_static` beside a data server on one H200), or sharing a
server, must not rerun every finished shard, as a changed param does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specbuild.engines.keepers import sharing_allowed

__all__ = [
    "MEMORY_SERVER_ARGS",
    "Runtime",
    "sharing_seconds",
    "with_sharing",
    "without_memory",
]

# server flags of that kind; the in-process runner takes its own fraction
MEMORY_SERVER_ARGS = ("mem_fraction_static",)


@dataclass(frozen=True)
class Runtime:
    """How a job's engine runs, beside what it loads (its spec): nothing here changes an
    output byte."""

    idle_s: float = 0.0  # > 0: a kept engine shared with other jobs, stopped that long idle
    mem_fraction_static: float | None = None  # an in-process SGLang runner's memory share

    @classmethod
    def from_resources(cls, *, sharing: str = "", memory: str = "") -> Runtime:
        """From a job's `engine_sharing` and `engine_memory` resources ("" where unset)."""
        return cls(
            idle_s=sharing_seconds(sharing),
            mem_fraction_static=float(memory) if memory else None,
        )

    @property
    def shared(self) -> bool:
        """Whether the job uses a kept engine: asked to, and not inside a SLURM job."""
        return sharing_allowed(self.idle_s)

    def with_memory(self, backend_options: Mapping[str, Any]) -> dict[str, Any]:
        """A feature backend's options with this memory share put back (none for hf)."""
        if self.mem_fraction_static is None:
            return dict(backend_options)
        return {**backend_options, "mem_fraction_static": self.mem_fraction_static}


def without_memory(server_args: Mapping[str, Any]) -> dict[str, Any]:
    """The server flags less the memory ones: what goes into a job's params."""
    return {k: v for k, v in server_args.items() if k not in MEMORY_SERVER_ARGS}


def with_sharing(backend_args: Mapping[str, Any], share_idle_s: str) -> dict[str, Any]:
    """A generation backend's or bench engine's arguments with the job's sharing resource (""
    for an engine that starts no server: hf, openai) put back."""
    if not share_idle_s:
        return dict(backend_args)
    return {**backend_args, "share_idle_s": float(share_idle_s)}


def sharing_seconds(share_idle_s: str) -> float:
    """A job's sharing resource as the idle seconds its shared engine waits (0: not shared)."""
    return float(share_idle_s) if share_idle_s else 0.0
