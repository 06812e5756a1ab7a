"""Generation with an SGLang server that specbuild starts itself for the job.

The backend is a launched server (`backends.server`) plus the OpenAI-compatible client
(`backends.openai`): nothing else differs from talking to an existing endpoint, so nothing
else is written twice. The server serves the materialized target folder, so the text is
produced by exactly the weights, tokenizer and chat template the fingerprint names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specbuild.backends.base import Generation, GenerationRequest, SamplingParams
from specbuild.backends.openai import OpenAIBackend
from specbuild.backends.server import DEFAULT_LAUNCHER, ServerOptions, SGLangServer

__all__ = ["SGLangBackend"]


class SGLangBackend:
    """GenerationBackend: start a loopback SGLang server on the target, then generate through it."""

    name = "sglang"

    def __init__(
        self,
        *,
        target_dir: str,
        launcher: Sequence[str] = DEFAULT_LAUNCHER,
        server_args: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 900.0,
        max_concurrency: int = 16,
        request_timeout_s: float = 600.0,
    ) -> None:
        options = ServerOptions(
            launcher=tuple(launcher),
            server_args=dict(server_args or {}),
            env=dict(env or {}),
            host=host,
            startup_timeout_s=startup_timeout_s,
            request_timeout_s=request_timeout_s,
        )
        self.server = SGLangServer(options.spec(target_dir), name="sglang-generate").start()
        try:
            self.client = OpenAIBackend(
                base_url=self.server.base_url,
                api_key=self.server.api_key,
                max_concurrency=max_concurrency,
                request_timeout_s=request_timeout_s,
            )
        except BaseException:
            self.server.stop()
            raise
        self.model = str(target_dir)

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams
    ) -> list[Generation]:
        gens = self.client.generate(requests, sampling)
        for g in gens:
            g.extra["served_model"] = g.extra.pop("model", None)
        return gens

    def close(self) -> None:
        self.server.stop()

    def __enter__(self) -> SGLangBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
