"""Generation backends behind one interface; a stage picks one by name at construction only.
Backends generate; the servers and models they generate with are loaded and kept by
specbuild.engines."""

from __future__ import annotations

from specbuild.backends.base import (
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)
from specbuild.engines.registry import lazy_class

__all__ = [
    "Generation",
    "GenerationBackend",
    "GenerationRequest",
    "SamplingParams",
    "make_backend",
]


def make_backend(name: str, **kwargs) -> GenerationBackend:
    """Construct the backend `name` (engines.registry) with its own keyword arguments."""
    return lazy_class("generate.backend", name)(**kwargs)
