"""specbuild.backends against the loopback stub (tests/stubs/sglang_stub.py) started as a real
subprocess on 127.0.0.1: the OpenAI-compatible client and make_backend (the server itself:
tests/unit/engines/test_server.py). These complement the GPU run; they never replace it.
(Hidden states with SGLang run in process: tests/unit/hidden/test_sglang.py.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from specbuild.backends import make_backend
from specbuild.backends.base import GenerationRequest, SamplingParams
from specbuild.backends.openai import OpenAIBackend, api_key_from_env, parse_chat_completion
from specbuild.engines.server import SGLangServer
from tests.unit.engines.test_server import LAUNCHER, _status, spec_for, stub_model


@pytest.fixture
def model_dir(tmp_path) -> Path:
    return stub_model(tmp_path)


# --- OpenAI-compatible client ----------------------------------------------------------------


def test_parse_chat_completion_keeps_finish_reason_reasoning_and_usage():
    resp = {
        "model": "m",
        "choices": [
            {"message": {"content": "4", "reasoning_content": "2+2"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1},
    }
    g = parse_chat_completion("q1", resp)
    assert (g.content, g.reasoning, g.finish_reason) == ("4", "2+2", "stop")
    assert (g.prompt_tokens, g.completion_tokens) == (7, 1)


def test_parse_chat_completion_rejects_a_response_without_choices():
    with pytest.raises(ValueError, match="request q1: not a chat.completion"):
        parse_chat_completion("q1", {"error": "x"})


@pytest.mark.parametrize(
    ("message", "usage", "fault"),
    [
        ({"content": ["a", "list"]}, {}, "content is ['a', 'list'], not text"),
        ({"content": 7}, {}, "content is 7, not text"),
        ({"content": "ok"}, {"completion_tokens": -3}, "completion_tokens is -3, not a count"),
        ({"content": "ok"}, {"prompt_tokens": 3.9}, "prompt_tokens is 3.9, not a count"),
        ({"content": "ok"}, {"completion_tokens": True}, "completion_tokens is True, not a count"),
        ({"content": "ok", "reasoning_content": {"x": 1}}, {}, "reasoning is {'x': 1}, not text"),
    ],
)
def test_a_malformed_answer_is_the_requests_failure_not_a_training_row(message, usage, fault):
    resp = {"choices": [{"message": message, "finish_reason": "stop"}], "usage": usage}
    with pytest.raises(ValueError, match="request q1: malformed response: ") as err:
        parse_chat_completion("q1", resp)
    assert fault in str(err.value)


def test_openai_backend_sends_key_from_env_and_never_shows_it(model_dir, monkeypatch, caplog):
    secret = "sk-test-123456"
    monkeypatch.setenv("SPECBUILD_TEST_KEY", secret)
    spec = spec_for(
        model_dir,
        env={"SGLANG_STUB_REASONING": "1"},
        launcher=(*LAUNCHER, "--api-key", secret),
    )
    with caplog.at_level(logging.INFO, logger="specbuild"), SGLangServer(spec) as srv:
        client = OpenAIBackend(base_url=srv.base_url + "/v1", api_key_env="SPECBUILD_TEST_KEY")
        reqs = [
            GenerationRequest(id=f"r{i}", messages=[{"role": "user", "content": "a b c"}])
            for i in range(3)
        ]
        gens = client.generate(reqs, SamplingParams(max_new_tokens=4))
    assert [g.id for g in gens] == ["r0", "r1", "r2"]
    assert all(g.finish_reason == "length" and g.completion_tokens == 4 for g in gens)
    assert gens[0].reasoning == "thinking about 3 tokens"
    assert secret not in repr(client)
    # the launcher line is logged; the client's own logging must not add the key elsewhere
    assert not any(
        secret in r.getMessage() for r in caplog.records if "starting" not in r.getMessage()
    )


def test_the_sglang_generate_backend_keys_its_server_and_sends_the_key(model_dir):
    backend = make_backend("sglang", target_dir=str(model_dir), launcher=LAUNCHER)
    try:
        assert backend.server.api_key and backend.server.api_key not in backend.server.command()
        assert _status(backend.server.base_url + "/v1/models") == 401
        [g] = backend.generate(
            [GenerationRequest(id="a", messages=[{"role": "user", "content": "hi there"}])],
            SamplingParams(max_new_tokens=3),
        )
    finally:
        backend.close()
    assert g.finish_reason in ("stop", "length") and g.content


def test_openai_backend_refuses_a_named_but_unset_key_variable(monkeypatch):
    monkeypatch.delenv("SPECBUILD_NO_SUCH_KEY", raising=False)
    with pytest.raises(OSError, match="sglang.api_key_env names 'SPECBUILD_NO_SUCH_KEY' but"):
        OpenAIBackend(base_url="http://127.0.0.1:9", api_key_env="SPECBUILD_NO_SUCH_KEY")


def test_an_unset_key_variable_is_named_by_its_config_key_and_a_pasted_key_never_shown():
    pasted = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"  # a key where its variable's name goes
    with pytest.raises(OSError) as err:
        api_key_from_env(pasted, config_key="bench.openai.api_key_env")
    assert str(err.value).startswith("bench.openai.api_key_env names a variable but")
    assert pasted not in str(err.value) and pasted[:12] not in str(err.value)


def test_openai_backend_returns_error_rows_when_the_key_is_wrong(model_dir, monkeypatch):
    monkeypatch.setenv("SPECBUILD_TEST_KEY", "wrong")
    spec = spec_for(model_dir, launcher=(*LAUNCHER, "--api-key", "right"))
    with SGLangServer(spec) as srv:
        client = OpenAIBackend(base_url=srv.base_url, model="m", api_key_env="SPECBUILD_TEST_KEY")
        [g] = client.generate(
            [GenerationRequest(id="r", messages=[{"role": "user", "content": "x"}])],
            SamplingParams(max_new_tokens=2),
        )
    assert g.finish_reason == "error" and "401" in g.extra["error"]
    assert "API key missing or wrong" in g.extra["error"]


def test_make_backend_sglang_launches_generates_and_stops_its_server(model_dir):
    backend = make_backend(
        "sglang",
        target_dir=str(model_dir),
        launcher=LAUNCHER,
        server_args={"disable_radix_cache": True},
        startup_timeout_s=20,
    )
    try:
        [g] = backend.generate(
            [GenerationRequest(id="a", messages=[{"role": "user", "content": "hello there"}])],
            SamplingParams(max_new_tokens=3),
        )
        assert backend.name == "sglang" and g.finish_reason == "length"
        assert g.completion_tokens == 3 and g.content.count("w") == 3
    finally:
        backend.close()
    assert backend.server.proc.poll() is not None
