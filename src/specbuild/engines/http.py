"""The small HTTP helpers every client of a server shares (JSON GET and POST, server-sent
events), with the API key in the Authorization header only: generation, the bench, tuning and
the keepers' own health reads go through these, so an error reads the same from each."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

__all__ = ["EngineUnavailable", "HTTPError", "get_json", "iter_sse", "post_json"]

try:  # hidden states come back as JSON float lists: orjson parses them ~5x faster
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson ships with SGLang, not with the CPU default
    _loads = json.loads


class EngineUnavailable(RuntimeError):
    """The engine itself cannot answer (its server refuses connections after every retry, or
    died): no record's fault, so the job fails and publishes nothing, instead of rejecting
    every record with the outage as its reason."""


class HTTPError(RuntimeError):
    def __init__(self, status: int, url: str, body: str) -> None:
        hint = (
            " (API key missing or wrong: an endpoint's key comes from the variable named by "
            "sglang.api_key_env; a server specbuild starts gets its key from the job)"
            if status == 401
            else ""
        )
        super().__init__(f"HTTP {status} from {url}: {body[:500]}{hint}")
        self.status = status


def _request(url: str, payload: Any | None, api_key: str | None) -> urllib.request.Request:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if payload is None else json.dumps(payload).encode()
    return urllib.request.Request(url, data=data, headers=headers)


def _open(req: urllib.request.Request, timeout: float):
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as err:
        body = err.read().decode("utf-8", "replace")
        raise HTTPError(err.code, req.full_url, body) from None


def post_json(url: str, payload: Any, *, api_key: str | None = None, timeout: float = 600.0) -> Any:
    with _open(_request(url, payload, api_key), timeout) as r:
        return _loads(r.read())


def get_json(url: str, *, api_key: str | None = None, timeout: float = 30.0) -> Any:
    with _open(_request(url, None, api_key), timeout) as r:
        return json.loads(r.read())


def iter_sse(
    url: str, payload: Any, *, api_key: str | None = None, timeout: float = 600.0
) -> Iterator[tuple[float, dict]]:
    """POST with streaming; yield (monotonic arrival time, event JSON) per `data:` event."""
    with _open(_request(url, payload, api_key), timeout) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield time.monotonic(), json.loads(data)
