"""Generation with an SGLang server that specbuild starts itself: one for the job, or one
kept for every job that starts the same (`share_idle_s`, engines.kept_server).

The backend is a server from engines.open.open_engine plus the OpenAI-compatible client
(`backends.openai`): nothing else differs from talking to an existing endpoint, so nothing
else is written twice. The server serves the materialized target folder, so the text is
produced by exactly the weights, tokenizer and chat template the fingerprint names.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

from specbuild.backends.base import Generation, GenerationRequest, SamplingParams
from specbuild.backends.openai import OpenAIBackend
from specbuild.engines.kept_server import Endpoint, failure
from specbuild.engines.open import open_engine
from specbuild.engines.runtime import Runtime
from specbuild.engines.server import ServerOptions, ServerStartError

__all__ = ["SGLangBackend"]


class SGLangBackend:
    """GenerationBackend: start a loopback SGLang server on the target, then generate through it."""

    name = "sglang"

    def __init__(
        self,
        *,
        target_dir: str,
        max_concurrency: int = 16,
        share_idle_s: float = 0.0,
        **server: Any,
    ) -> None:
        """`server`: how the server is launched, by ServerOptions' own field names (launcher,
        server_args, env, host, startup_timeout_s, request_timeout_s): the generate rule's
        `backend_args` param holds them flat, and a param must keep its shape."""
        options = ServerOptions(**server)
        self.spec = options.spec(target_dir)
        self._stack = ExitStack()
        try:
            # share_idle_s > 0: one server for every job that starts the same one
            self.server = self._stack.enter_context(
                open_engine(self.spec, Runtime(idle_s=share_idle_s), name="sglang-generate")
            )
            self.client = OpenAIBackend(
                base_url=self.server.base_url,
                api_key=self.server.api_key,
                max_concurrency=max_concurrency,
                request_timeout_s=options.request_timeout_s,
            )
        except BaseException:
            self._stack.close()
            raise
        self.model = str(target_dir)

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams
    ) -> list[Generation]:
        try:
            gens = self.client.generate(requests, sampling)
        except Exception as err:
            why = failure(self.spec) if self.shared else None
            if why:  # the shared server died under this job: say so, not just "refused"
                raise ServerStartError(f"the shared SGLang server stopped: {why}") from err
            raise
        for g in gens:
            g.extra["served_model"] = g.extra.pop("model", None)
        return gens

    @property
    def shared(self) -> bool:
        """Whether this job uses a kept server (open_engine chose it) rather than its own."""
        return isinstance(self.server, Endpoint)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> SGLangBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
