"""The small HTTP helpers every client of a server shares (JSON GET and POST, server-sent
events), with the API key in the Authorization header only: generation, the bench, tuning and
the keepers' own health reads go through these, so an error reads the same from each. The key
goes to the origin it was meant for and no further (a redirect elsewhere drops it), and never
into an error: a server that echoes it back has it replaced by ***."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

__all__ = [
    "EngineUnavailable",
    "HTTPError",
    "MASK",
    "get_json",
    "iter_sse",
    "open_url",
    "post_json",
]

MASK = "***"

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


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)


class _KeyStaysHome(urllib.request.HTTPRedirectHandler):
    """Follows redirects as urllib does, but urllib copies every header to wherever a server
    points: the API key goes on only within its own origin (scheme, host and port)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(newurl) != _origin(req.full_url):
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_KeyStaysHome)


def _masked(text: str, req: urllib.request.Request) -> str:
    auth = req.get_header("Authorization") or ""
    key = auth.removeprefix("Bearer ")
    return text.replace(key, MASK) if key else text


def _open(req: urllib.request.Request, timeout: float):
    try:
        return _OPENER.open(req, timeout=timeout)
    except urllib.error.HTTPError as err:
        body = err.read().decode("utf-8", "replace")
        raise HTTPError(err.code, req.full_url, _masked(body, req)) from None


def open_url(url: str, *, api_key: str | None = None, timeout: float = 30.0):
    """GET `url` with the key (a response to use as a context manager); an HTTP error status
    raises HTTPError, a refused connection urllib.error.URLError."""
    return _open(_request(url, None, api_key), timeout)


def post_json(url: str, payload: Any, *, api_key: str | None = None, timeout: float = 600.0) -> Any:
    with _open(_request(url, payload, api_key), timeout) as r:
        return _loads(r.read())


def get_json(url: str, *, api_key: str | None = None, timeout: float = 30.0) -> Any:
    with open_url(url, api_key=api_key, timeout=timeout) as r:
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
