"""Generation backends behind one interface; a stage picks one by name at construction only."""

from __future__ import annotations

from specbuild.backends.base import (
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)
from specbuild.engines.registry import lazy_class

__all__ = [
    "BACKENDS",
    "Generation",
    "GenerationBackend",
    "GenerationRequest",
    "SamplingParams",
    "make_backend",
]

# name -> "module:Class" (specbuild.engines.registry)
BACKENDS = {
    "hf": "specbuild.backends.hf:HFBackend",
    "sglang": "specbuild.backends.sglang:SGLangBackend",
    "openai": "specbuild.backends.openai:OpenAIBackend",
}


def make_backend(name: str, **kwargs) -> GenerationBackend:
    """Construct the backend `name` with its own keyword arguments."""
    return lazy_class(BACKENDS, name, key="backend")(**kwargs)
