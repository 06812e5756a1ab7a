"""Generation through any OpenAI-compatible endpoint (`/v1/chat/completions` for chat
messages, `/v1/completions` for a raw prompt), over the HTTP helpers of specbuild.engines.http.

Contract: one `Generation` per request in order, keeping `finish_reason`, the reasoning text
(`reasoning_content`, as SGLang's reasoning parser and most servers name it) and the usage
counts. The API key is read from the environment variable named in config when the backend is
built (or handed over by the code that started the server, `backends.sglang`); it is sent only
in the Authorization header and never logged, repr'd or returned.
Requests run concurrently (`max_concurrency` threads); a transient failure (connection error,
HTTP 429/5xx) is retried with backoff, a request that still fails comes back with
finish_reason "error" and the message in `extra["error"]`.
"""

from __future__ import annotations

import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from specbuild.backends.base import Generation, GenerationRequest, SamplingParams
from specbuild.engines.http import EngineUnavailable, HTTPError, get_json, post_json
from specbuild.infra.credential_patterns import holds_a_key_not_a_name

__all__ = ["OpenAIBackend", "api_key_from_env"]

log = logging.getLogger("specbuild")

RETRY_STATUS = (408, 429, 500, 502, 503, 504)
RETRY_BACKOFF_S = (1.0, 4.0, 16.0)  # three retries cover a server restart or a short overload


def api_key_from_env(env_name: str | None, *, config_key: str = "sglang.api_key_env") -> str | None:
    """The API key from the variable that `config_key` names; a named but unset variable is an
    error, which names the variable unless what was given looks like a key itself."""
    if not env_name:
        return None
    key = os.environ.get(env_name)
    if not key:
        named = "a variable" if holds_a_key_not_a_name(env_name) else repr(env_name)
        raise OSError(
            f"{config_key} names {named} but that environment variable is unset or empty; "
            f"export it before running snakemake (the key itself never goes into config)"
        )
    return key


def with_retries(fn, *, what: str):
    """Call fn(); retry transient HTTP/connection failures with backoff."""
    for attempt, delay in enumerate((*RETRY_BACKOFF_S, None)):
        try:
            return fn()
        except HTTPError as err:
            if err.status not in RETRY_STATUS or delay is None:
                raise
            log.warning("%s: %s; retry %d in %.0f s", what, err, attempt + 1, delay)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
            if delay is None:
                raise
            log.warning("%s: %s; retry %d in %.0f s", what, err, attempt + 1, delay)
        time.sleep(delay)
    raise AssertionError("unreachable")


def parse_chat_completion(req_id: str, resp: Mapping[str, Any]) -> Generation:
    """A chat.completion or text_completion response as a Generation (finish_reason,
    reasoning and usage kept)."""
    try:
        choice = resp["choices"][0]
        msg = choice["message"] if "message" in choice else {"content": choice["text"]}
    except (KeyError, IndexError, TypeError):
        raise ValueError(
            f"request {req_id}: not a chat.completion or text_completion response: {resp!r:.300}"
        ) from None
    usage = resp.get("usage") or {}
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    finish = choice.get("finish_reason") or "unknown"
    # what a server says is checked like a record: a wrong type is this request's failure,
    # never a training row (a list as the answer, a negative or fractional token count)
    faults = [
        f"{name} is {value!r:.60}, not {want}"
        for name, value, want, ok in (
            ("content", msg.get("content"), "text", _is(msg.get("content"), str)),
            ("reasoning", reasoning, "text", _is(reasoning, str)),
            *(
                (k, usage.get(k, 0), "a count", _is_count(usage.get(k, 0)))
                for k in ("prompt_tokens", "completion_tokens")
            ),
        )
        if not ok
    ]
    if faults:
        raise ValueError(f"request {req_id}: malformed response: {'; '.join(faults)}")
    extra = {"model": resp.get("model")}
    if usage.get("completion_tokens_details"):
        extra["completion_tokens_details"] = usage["completion_tokens_details"]
    return Generation(
        id=req_id,
        content=msg.get("content") or "",
        finish_reason=str(finish),
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        reasoning=reasoning or None,
        extra=extra,
    )


def _is(value: Any, kind: type) -> bool:
    return value is None or isinstance(value, kind)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class OpenAIBackend:
    """GenerationBackend over an OpenAI-compatible endpoint (an SGLang server or any other)."""

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str | None = None,
        api_key_env: str | None = None,
        api_key: str | None = None,
        max_concurrency: int = 16,
        request_timeout_s: float = 600.0,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        # `api_key`: the key itself, only from code that started the server in this process
        # (never from config or params, which Snakemake stores)
        self._api_key = api_key or api_key_from_env(api_key_env)
        self.max_concurrency = max_concurrency
        self.request_timeout_s = request_timeout_s
        self.extra_body = dict(extra_body or {})
        self.model = model or self._served_model()

    def __repr__(self) -> str:  # never shows the key
        return f"{type(self).__name__}(base_url={self.base_url!r}, model={self.model!r})"

    def _served_model(self) -> str:
        data = get_json(self.base_url + "/v1/models", api_key=self._api_key)
        models = [m.get("id") for m in data.get("data", [])]
        if len(models) != 1:
            raise ValueError(
                f"{self.base_url}/v1/models lists {models}; set sglang.served_model to pick one"
            )
        return str(models[0])

    def _payload(self, request: GenerationRequest, sampling: SamplingParams) -> dict:
        prompt = (
            {"messages": request.messages} if request.prompt is None else {"prompt": request.prompt}
        )
        return {
            **self.extra_body,
            "model": self.model,
            **prompt,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed if request.seed is None else request.seed,
        }

    def _one(self, request: GenerationRequest, sampling: SamplingParams) -> Generation:
        route = "/v1/chat/completions" if request.prompt is None else "/v1/completions"
        url = self.base_url + route
        payload = self._payload(request, sampling)
        try:
            resp = with_retries(
                lambda: post_json(
                    url, payload, api_key=self._api_key, timeout=self.request_timeout_s
                ),
                what=f"request {request.id}",
            )
            return parse_chat_completion(request.id, resp)
        except (urllib.error.URLError, ConnectionError) as err:
            if isinstance(getattr(err, "reason", None), TimeoutError):
                raise  # this request's answer took too long: its own failure
            raise EngineUnavailable(
                f"{self.base_url} unreachable after {len(RETRY_BACKOFF_S) + 1} tries: {err}"
            ) from err
        except (HTTPError, ValueError) as err:
            log.error("request %s failed: %s", request.id, err)
            return Generation(
                id=request.id,
                content="",
                finish_reason="error",
                prompt_tokens=0,
                completion_tokens=0,
                extra={"error": str(err)},
            )

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams
    ) -> list[Generation]:
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            return list(pool.map(lambda r: self._one(r, sampling), requests))

    def close(self) -> None:
        pass
