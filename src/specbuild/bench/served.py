"""Served bench engines: `sglang` (a server the job starts, one per chain: our drafter served
with EAGLE3, or the baseline with identical flags and none) and `openai` (an existing
OpenAI-compatible endpoint such as vLLM or another SGLang deployment, measured as it is
configured). Both are measured by one streaming client, request by request and in the
concurrency sweep (`bench.rows`), so their rows sit side by side in one table.

  sglang   streaming `/generate` with the prompt's token ids; `verify_steps` is the
           request's `spec_verify_ct` (SGLang's own count, null for the baseline server)
  openai   streaming `/v1/completions` with the token ids as the prompt and the usage chunk
           (`stream_options.include_usage`) for the token count; the endpoint does not report
           verify steps, so its rows carry no acceptance length

Why not SGLang's own serving benchmark (`python -m sglang.bench_serving`): it needs SGLang in
the job's environment (the CPU default and its tests have none; the loopback stub stands in),
reads its own dataset formats and re-tokenizes text, where this client sends the exact token
ids of each set's prompt rendered with the target's chat template (multi-turn included), and it
reports acceptance as one server-wide average (`avg_spec_accept_length`, complete windows only)
instead of each request's `spec_verify_ct`. Its TTFT, ITL and output throughput are the ones
defined in `bench.metrics`, computed from these rows instead.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from specbuild.backends.openai import api_key_from_env
from specbuild.bench.rows import Completion, device_label
from specbuild.eagle.chain import BASELINE, NGRAM_DRAFTER, NO_DRAFTER, Chain
from specbuild.engines.http import get_json, iter_sse
from specbuild.engines.kept_server import Endpoint
from specbuild.engines.open import open_engine
from specbuild.engines.runtime import Runtime
from specbuild.engines.server import ServerOptions, SGLangServer

__all__ = [
    "ServedEngine",
    "stream_generate",
    "stream_completions",
    "sglang_engine",
    "open_sglang",
    "open_openai",
]

log = logging.getLogger("specbuild")


def stream_generate(
    base_url: str,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    api_key: str | None,
    timeout: float,
    drafted: bool = False,
) -> Completion:
    """One greedy streaming SGLang `/generate`; TTFT is the first chunk carrying a token.
    `drafted`: the server runs a drafter, so its count of verify steps must be there."""
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0.0}
    payload = {"input_ids": prompt_ids, "sampling_params": sampling, "stream": True}
    t0, ttft, last = time.monotonic(), None, {}
    for t, event in iter_sse(base_url + "/generate", payload, api_key=api_key, timeout=timeout):
        meta = event.get("meta_info") or {}
        if ttft is None and (meta.get("completion_tokens") or event.get("output_ids")):
            ttft = t - t0
        last = event
    wall = time.monotonic() - t0
    meta = last.get("meta_info") or {}
    if meta.get("finish_reason") is None:
        raise RuntimeError(f"{base_url}/generate: stream ended without a finished chunk")
    ids = list(last.get("output_ids") or [])
    verify = meta.get("spec_verify_ct")
    if drafted and verify is None:
        raise RuntimeError(
            f"{base_url} reports no spec_verify_ct: the drafter is not loaded (check "
            "--speculative-algorithm in the job log)"
        )
    return Completion(
        int(meta.get("completion_tokens", len(ids))),
        verify_steps=int(verify) if verify is not None else None,
        wall_s=wall,
        ttft_s=ttft,
        token_ids=ids,
    )


def stream_completions(
    base_url: str,
    model: str,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    api_key: str | None,
    timeout: float,
) -> Completion:
    """One greedy streaming `/v1/completions` of token ids; TTFT is the first chunk with text."""
    payload = {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": max_new_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    url = base_url + "/v1/completions"
    t0, ttft, text, usage, finish = time.monotonic(), None, [], None, None
    for t, event in iter_sse(url, payload, api_key=api_key, timeout=timeout):
        for choice in event.get("choices") or []:
            if choice.get("text"):
                ttft = t - t0 if ttft is None else ttft
                text.append(choice["text"])
            finish = choice.get("finish_reason") or finish
        usage = event.get("usage") or usage
    wall = time.monotonic() - t0
    if finish is None or not usage:
        raise RuntimeError(
            f"{url}: the stream ended without a finish_reason and a usage chunk; the endpoint "
            "must honour stream_options.include_usage (vLLM and SGLang do)"
        )
    return Completion(
        int(usage["completion_tokens"]),
        verify_steps=None,
        wall_s=wall,
        ttft_s=ttft,
        text="".join(text),
    )


@dataclass
class ServedEngine:
    """`bench.rows.BenchEngine` over HTTP: `stream` is one of the requests above, bound to its
    endpoint and key (kept out of repr and logs)."""

    name: str
    device: str
    chain: str
    drafter: str
    stream: Callable[[list[int], int], Completion] = field(repr=False)

    def complete(self, prompt_ids: list[int], max_new_tokens: int) -> Completion:
        return self.stream(prompt_ids, max_new_tokens)


def sglang_engine(
    srv: SGLangServer | Endpoint, *, chain: str, drafter: str, timeout: float
) -> ServedEngine:
    """The engine over a running server of this job (with a drafter at `chain`, or the
    baseline without one); the device is the server's own, with the pinned GPU's name."""
    drafted = chain != BASELINE
    stream = partial(
        stream_generate, srv.base_url, api_key=srv.api_key, timeout=timeout, drafted=drafted
    )
    device = device_label(srv.get_json("/server_info").get("device", "unknown"))
    return ServedEngine("sglang", device, chain, drafter if drafted else NO_DRAFTER, stream)


@contextmanager
def open_sglang(
    *,
    target_dir: str | os.PathLike,
    chain: str,
    drafter_dir: str | None,
    drafter_name: str,
    options: Mapping[str, Any],
) -> Iterator[ServedEngine]:
    """A server of the target at `chain` (drafter flags added) or the baseline: the job's own,
    stopped on exit, or, with `options["share_idle_s"]` > 0, the shared one of these flags
    (generation's, for the baseline), used by this job alone while it measures.
    `options`: {"server": ServerOptions fields} (config `sglang.*`)."""
    server = ServerOptions(**options["server"])
    extra = {}
    if chain != BASELINE and drafter_name == NGRAM_DRAFTER:
        extra = Chain.parse(chain).ngram_args()
    elif chain != BASELINE:
        if not drafter_dir:
            raise ValueError(f"chain {chain!r} needs a drafter folder (stage export)")
        extra = Chain.parse(chain).server_args(
            drafter_dir, draft_attention_backend=server.draft_attention_backend
        )
    spec = server.spec(target_dir, extra_args=extra)
    runtime = Runtime(idle_s=float(options.get("share_idle_s", 0.0)))
    with open_engine(spec, runtime, name=f"sglang-{chain}", exclusive=True) as srv:
        yield sglang_engine(
            srv, chain=chain, drafter=drafter_name, timeout=server.request_timeout_s
        )


@contextmanager
def open_openai(
    *,
    target_dir: str | os.PathLike,
    chain: str,
    drafter_dir: str | None,
    drafter_name: str,
    options: Mapping[str, Any],
) -> Iterator[ServedEngine]:
    """The endpoint of config `bench.openai`: its URL, the name of the variable holding its key,
    its served model (None: the only one it lists), its name in the tables, the timeout."""
    base_url = options["endpoint"].rstrip("/").removesuffix("/v1")
    key = api_key_from_env(options["api_key_env"], config_key="bench.openai.api_key_env")
    model = options["served_model"]
    if not model:
        listed = [m.get("id") for m in get_json(base_url + "/v1/models", api_key=key)["data"]]
        if len(listed) != 1:
            raise ValueError(f"{base_url}/v1/models lists {listed}; set bench.openai.served_model")
        model = listed[0]
    log.info("bench endpoint %s, model %s, serving %s", base_url, model, chain)
    url = urlsplit(base_url)
    timeout = options["request_timeout_s"]
    stream = partial(stream_completions, base_url, model, api_key=key, timeout=timeout)
    drafter = drafter_name if chain != BASELINE else NO_DRAFTER
    yield ServedEngine(
        options["name"], f"endpoint {url.hostname}:{url.port}", chain, drafter, stream
    )
