"""The one interface every generation backend implements (hf, sglang, openai-compatible).

A stage never asks which backend it has: it builds one from config with `make_backend`
and calls `generate`. Batching, retries and writing rows live in the stage, written once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["GenerationRequest", "Generation", "SamplingParams", "GenerationBackend"]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt: chat `messages` (the backend applies the target's chat template) or a raw
    `prompt` continued as is: text, or better token ids, which no server re-tokenizes (a
    server tokenizing rendered text adds its BOS in front of the template's own)."""

    id: str
    messages: list[dict] = field(default_factory=list)  # OpenAI-style, ending with a user turn
    prompt: str | list[int] | None = None
    seed: int | None = None  # overrides SamplingParams.seed where the backend seeds per request

    def __post_init__(self) -> None:
        if bool(self.messages) == (self.prompt is not None):
            raise ValueError(f"request {self.id}: give exactly one of `messages` and `prompt`")


@dataclass
class Generation:
    id: str
    content: str
    finish_reason: str  # "stop" (end of turn) or "length" (max_new_tokens reached)
    prompt_tokens: int
    completion_tokens: int
    reasoning: str | None = None
    extra: dict = field(default_factory=dict)  # backend-specific facts worth keeping


@runtime_checkable
class GenerationBackend(Protocol):
    name: str  # "hf", "sglang", "openai"
    model: str  # what produced the text (path, served model name)

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams
    ) -> list[Generation]:
        """One Generation per request, same order. Raise only for failures of the backend
        itself; a request the backend cannot serve comes back with finish_reason "error"."""
        ...

    def close(self) -> None: ...
