"""Generation backends behind one interface; a stage picks one by name at construction only."""

from __future__ import annotations

from importlib import import_module

from specbuild.backends.base import (
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)

__all__ = [
    "BACKENDS",
    "Generation",
    "GenerationBackend",
    "GenerationRequest",
    "SamplingParams",
    "make_backend",
]

# name -> "module:Class"; imported lazily so CPU-only installs never import server code.
BACKENDS = {
    "hf": "specbuild.backends.hf:HFBackend",
    "sglang": "specbuild.backends.sglang:SGLangBackend",
    "openai": "specbuild.backends.openai:OpenAIBackend",
}


def make_backend(name: str, **kwargs) -> GenerationBackend:
    """Construct the backend `name` with its own keyword arguments."""
    try:
        module, cls = BACKENDS[name].split(":")
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(BACKENDS)}") from None
    return getattr(import_module(module), cls)(**kwargs)
