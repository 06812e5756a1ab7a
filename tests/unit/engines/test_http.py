"""specbuild.engines.http against real loopback HTTP servers: the API key follows a redirect
only within its own origin, and a server that echoes it back in an error never gets it into
the error's text (which goes to job logs and reject reasons)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specbuild.engines.http import MASK, HTTPError, get_json, post_json

KEY = "sk-test-0123456789abcdefSECRET"


@contextmanager
def _server(routes: dict[str, tuple[int, dict[str, str], str]]) -> Iterator[tuple[str, list]]:
    """A loopback server answering each path with (status, headers, body), recording every
    request's (path, Authorization header)."""
    seen: list[tuple[str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            if self.command == "POST":
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
            auth = self.headers.get("Authorization")
            seen.append((self.path, auth))
            status, headers, body = routes[self.path]
            data = body.replace("{auth}", auth or "").encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


OK = (200, {"Content-Type": "application/json"}, json.dumps({"ok": True}))


def test_a_redirect_to_another_origin_drops_the_key_and_one_within_it_keeps_it():
    with _server({"/v1/models": OK}) as (other, other_seen):
        routes = {
            "/away": (302, {"Location": f"{other}/v1/models"}, ""),
            "/here": (302, {"Location": "/v1/models"}, ""),
            "/v1/models": OK,
        }
        with _server(routes) as (home, home_seen):
            assert get_json(f"{home}/away", api_key=KEY) == {"ok": True}
            assert get_json(f"{home}/here", api_key=KEY) == {"ok": True}
    # another port on the same host is another origin
    assert home_seen == [
        ("/away", f"Bearer {KEY}"),
        ("/here", f"Bearer {KEY}"),
        ("/v1/models", f"Bearer {KEY}"),
    ]
    assert other_seen == [("/v1/models", None)]


@pytest.mark.parametrize("call", ["get", "post"])
def test_an_error_body_that_echoes_the_key_reads_masked(call):
    echo = (400, {"Content-Type": "application/json"}, '{"error": "bad request from {auth}"}')
    with _server({"/v1/chat/completions": echo}) as (url, seen):
        with pytest.raises(HTTPError) as err:
            if call == "get":
                get_json(f"{url}/v1/chat/completions", api_key=KEY)
            else:
                post_json(f"{url}/v1/chat/completions", {"messages": []}, api_key=KEY)
    assert seen == [("/v1/chat/completions", f"Bearer {KEY}")]  # the server did get the key
    text = str(err.value)
    assert err.value.status == 400 and KEY not in text
    assert f"bad request from Bearer {MASK}" in text
