"""Benchmarks through an SGLang server: our exported drafter served with EAGLE3, against a
baseline server with identical flags and no drafter.

Two measurements per server (one job per chain or baseline, so one server start each):

* per-request rows, single stream, streaming `/generate`: the row schema of
  `bench.specdec` (written once there) with `backend: "sglang"`, TTFT and ITL filled in.
  `verify_steps` is SGLang's per-request `spec_verify_ct` (the baseline: one step per token
  after the first), so `accept_length` = (completion_tokens - 1) / spec_verify_ct, the bonus
  token included and the prefill token not. SGLang's own convention
  Σ completion_tokens / Σ spec_verify_ct (counts the prefill token too) is computed from the
  same rows by `summarize_rows` as `accept_length_sglang`. Per-position acceptance is not
  reported per request by SGLang, so `accepted_per_position` is [].
* a concurrency sweep (1..64 streams): output throughput = Σ completion tokens / wall time of
  the level, plus mean TTFT and ITL, one row per level (`SWEEP_KEYS`).

The server is started by `backends.server` (loopback, free port, stopped on exit/failure).
"""

from __future__ import annotations

import csv
import logging
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from specbuild.backends.openai import iter_sse
from specbuild.backends.server import (
    DEFAULT_LAUNCHER,
    ServerSpec,
    SGLangServer,
    build_server_args,
    new_api_key,
)
from specbuild.bench.sets import read_bench_set, render_prompt
from specbuild.bench.specdec import (
    BASELINE,
    ChainSpec,
    Completion,
    check_rows,
    run_requests,
)
from specbuild.io import atomic_open, read_json, read_jsonl, write_json, write_jsonl

__all__ = [
    "SWEEP_KEYS",
    "SGLangBenchBackend",
    "spec_server_args",
    "stream_completion",
    "sweep_concurrency",
    "summarize_rows",
    "run_server_bench",
    "write_table",
    "write_server_bench_outputs",
]

log = logging.getLogger("specbuild")

SWEEP_KEYS = (
    "config",
    "concurrency",
    "requests",
    "completion_tokens",
    "wall_s",
    "output_tokens_per_s",
    "ttft_s_mean",
    "itl_s_mean",
    "accept_length",
)
WARMUP_TOKENS = 16  # one short request before timing: CUDA graphs and kernels warm up


def spec_server_args(config: str, drafter_dir: str | None) -> dict[str, Any]:
    """The speculative flags for a chain name ("3-1-4") or {} for the baseline."""
    if config == BASELINE:
        return {}
    if not drafter_dir:
        raise ValueError(f"chain {config!r} needs a drafter folder (stage export)")
    parts = config.split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"chain {config!r}: expected 'steps-topk-draft_tokens', e.g. '3-1-4'")
    steps, topk, draft = (int(p) for p in parts)
    if topk == 1:
        ChainSpec.parse(config)  # chain drafting: draft tokens must be steps + 1
    return {
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": str(drafter_dir),
        "speculative_num_steps": steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": draft,
    }


@dataclass
class StreamResult:
    token_ids: list[int]
    completion_tokens: int
    verify_steps: int | None  # spec_verify_ct; None when the server runs no drafter
    wall_s: float
    ttft_s: float | None
    finish_reason: Any


def stream_completion(
    base_url: str,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    timeout: float = 600.0,
    ignore_eos: bool = False,
    api_key: str | None = None,
) -> StreamResult:
    """One greedy streaming `/generate`; TTFT is the first chunk carrying a token."""
    payload = {
        "input_ids": prompt_ids,
        "sampling_params": {
            "max_new_tokens": max_new_tokens,
            "temperature": 0.0,
            "ignore_eos": ignore_eos,
        },
        "stream": True,
    }
    t0 = time.monotonic()
    ttft = None
    last: Mapping[str, Any] = {}
    for t, event in iter_sse(base_url + "/generate", payload, api_key=api_key, timeout=timeout):
        meta = event.get("meta_info") or {}
        if ttft is None and (meta.get("completion_tokens") or event.get("output_ids")):
            ttft = t - t0
        last = event
    wall = time.monotonic() - t0
    meta = last.get("meta_info") or {}
    if not last or meta.get("finish_reason") is None:
        raise RuntimeError(f"{base_url}/generate: stream ended without a finished chunk")
    n = int(meta.get("completion_tokens", len(last.get("output_ids") or [])))
    verify = meta.get("spec_verify_ct")
    return StreamResult(
        token_ids=list(last.get("output_ids") or []),
        completion_tokens=n,
        verify_steps=int(verify) if verify is not None else None,
        wall_s=wall,
        ttft_s=ttft,
        finish_reason=meta.get("finish_reason"),
    )


class SGLangBenchBackend:
    """`bench.specdec.BenchBackend` over a running server (drafter or baseline)."""

    name = "sglang"

    def __init__(
        self,
        *,
        base_url: str,
        config: str,
        drafter: str,
        request_timeout_s: float = 600.0,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url
        self._api_key = api_key
        self.config = config
        self.drafter = drafter if config != BASELINE else "none"
        self.request_timeout_s = request_timeout_s

    def complete(self, prompt_ids: list[int], max_new_tokens: int) -> Completion:
        r = stream_completion(
            self.base_url,
            prompt_ids,
            max_new_tokens,
            timeout=self.request_timeout_s,
            api_key=self._api_key,
        )
        if self.config != BASELINE and r.verify_steps is None:
            raise RuntimeError(
                f"server for chain {self.config} reports no spec_verify_ct: the drafter is not "
                f"loaded (check --speculative-algorithm in the job log)"
            )
        verify = r.verify_steps if r.verify_steps is not None else max(r.completion_tokens - 1, 0)
        token_ids = r.token_ids
        if len(token_ids) != r.completion_tokens:
            log.warning(
                "output_ids has %d ids for %d completion tokens",
                len(token_ids),
                r.completion_tokens,
            )
        return Completion(
            token_ids=token_ids,
            verify_steps=verify,
            accepted_per_position=[],
            wall_s=r.wall_s,
            ttft_s=r.ttft_s,
        )


def sweep_concurrency(
    base_url: str,
    prompts: Sequence[list[int]],
    *,
    config: str,
    levels: Iterable[int],
    max_new_tokens: int,
    min_requests: int,
    timeout: float = 600.0,
    api_key: str | None = None,
) -> list[dict]:
    """One row per concurrency level: `max(level, min_requests)` requests over `level` streams
    (prompts reused round-robin), output throughput over the level's wall time."""
    rows = []
    for level in levels:
        n = max(level, min_requests)
        batch = [prompts[i % len(prompts)] for i in range(n)]
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=level) as pool:
            results = list(
                pool.map(
                    lambda ids: stream_completion(
                        base_url, ids, max_new_tokens, timeout=timeout, api_key=api_key
                    ),
                    batch,
                )
            )
        wall = time.monotonic() - t0
        tokens = sum(r.completion_tokens for r in results)
        ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
        itls = [
            (r.wall_s - r.ttft_s) / (r.completion_tokens - 1)
            for r in results
            if r.ttft_s is not None and r.completion_tokens > 1
        ]
        verify = [r.verify_steps for r in results if r.verify_steps is not None]
        row = {
            "config": config,
            "concurrency": level,
            "requests": n,
            "completion_tokens": tokens,
            "wall_s": wall,
            "output_tokens_per_s": tokens / wall if wall > 0 else None,
            "ttft_s_mean": sum(ttfts) / len(ttfts) if ttfts else None,
            "itl_s_mean": sum(itls) / len(itls) if itls else None,
            # SGLang's convention, Σ completion / Σ verify; 1.0 without a drafter
            "accept_length": (tokens / sum(verify))
            if verify and sum(verify)
            else (1.0 if config == BASELINE else None),
        }
        log.info(
            "%s concurrency %d: %d requests, %.1f tok/s",
            config,
            level,
            n,
            row["output_tokens_per_s"] or 0.0,
        )
        rows.append(row)
    return rows


def _mean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else None


def summarize_rows(rows: Sequence[Mapping[str, Any]], sweep: Sequence[Mapping[str, Any]]) -> dict:
    """Single-stream and peak numbers of one server (one config) for the tables."""
    comp = sum(r["completion_tokens"] for r in rows)
    verify = sum(r["verify_steps"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    peak = max(sweep, key=lambda r: r["output_tokens_per_s"] or 0.0) if sweep else None
    baseline = bool(rows) and rows[0]["config"] == BASELINE
    return {
        "config": rows[0]["config"] if rows else None,
        "requests": len(rows),
        "completion_tokens": comp,
        "accept_length": (comp - len(rows)) / verify if verify else None,
        # SGLang's convention needs spec_verify_ct: undefined without a drafter
        "accept_length_sglang": comp / verify if verify and not baseline else None,
        "single_stream_tokens_per_s": comp / wall if wall else None,
        "ttft_s_mean": _mean([r.get("ttft_s") for r in rows]),
        "itl_s_mean": _mean([r.get("itl_s") for r in rows]),
        "peak_output_tokens_per_s": peak["output_tokens_per_s"] if peak else None,
        "peak_concurrency": peak["concurrency"] if peak else None,
    }


def run_server_bench(
    *,
    target_dir: str | os.PathLike,
    config: str,
    sets: Mapping[str, Mapping[str, Any]],
    out_rows: str | os.PathLike,
    out_sweep: str | os.PathLike,
    out_summary: str | os.PathLike,
    drafter_dir: str | None = None,
    drafter_name: str = "none",
    launcher: Sequence[str] = DEFAULT_LAUNCHER,
    server_args: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    startup_timeout_s: float = 900.0,
    request_timeout_s: float = 600.0,
    max_new_tokens: int = 256,
    concurrency: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    sweep_min_requests: int = 16,
) -> dict:
    """Start one server (chain `config` with the drafter, or the baseline), bench every set
    single-stream, sweep concurrency on the first set, write rows, sweep and summary."""
    from specbuild.target import load_tokenizer

    tokenizer = load_tokenizer(target_dir)
    args = {**dict(server_args or {}), **spec_server_args(config, drafter_dir)}
    spec = ServerSpec(
        model_path=str(target_dir),
        launcher=tuple(launcher),
        server_args=tuple(build_server_args(args)),
        env=dict(env or {}),
        host=host,
        startup_timeout_s=startup_timeout_s,
        api_key=new_api_key(),
    )
    prompt_sets = {name: read_bench_set(s) for name, s in sets.items()}
    with SGLangServer(spec, name=f"sglang-bench-{config}") as server:
        engine = SGLangBenchBackend(
            base_url=server.base_url,
            config=config,
            drafter=drafter_name,
            request_timeout_s=request_timeout_s,
            api_key=server.api_key,
        )
        warm = render_prompt(tokenizer, [{"role": "user", "content": "Hi"}])
        stream_completion(
            server.base_url,
            warm,
            WARMUP_TOKENS,
            timeout=request_timeout_s,
            api_key=server.api_key,
        )
        rows: list[dict] = []
        for name, prompts in prompt_sets.items():
            rows += run_requests(
                prompts,
                backend=engine,
                tokenizer=tokenizer,
                set_name=name,
                max_new_tokens=max_new_tokens,
            )
        first = next(iter(prompt_sets.values()))
        first_turns = [
            render_prompt(tokenizer, [{"role": "user", "content": p.turns[0]}]) for p in first
        ]
        sweep = sweep_concurrency(
            server.base_url,
            first_turns,
            config=config,
            levels=concurrency,
            max_new_tokens=max_new_tokens,
            min_requests=sweep_min_requests,
            timeout=request_timeout_s,
            api_key=server.api_key,
        )
        info = server.get_json("/server_info")
    check_rows(rows, source=str(out_rows))
    summary = {
        **summarize_rows(rows, sweep),
        "drafter": engine.drafter,
        "server_avg_spec_accept_length": _server_accept(info),
    }
    write_jsonl(out_rows, rows)
    write_jsonl(out_sweep, sweep)
    write_json(out_summary, summary)
    return summary


def _server_accept(info: Mapping[str, Any]) -> float | None:
    # /server_info counts complete windows only (see the kit notes); kept for reference.
    states = info.get("internal_states") or [{}]
    value = states[0].get("avg_spec_accept_length") if states else None
    return float(value) if value is not None else None


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def write_table(
    rows: Sequence[Mapping[str, Any]], keys: Sequence[str], *, csv_path, md_path
) -> None:
    """The same rows as CSV (full precision) and as a Markdown table (4 significant digits)."""
    with atomic_open(csv_path) as fh:
        w = csv.DictWriter(fh, fieldnames=list(keys), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with atomic_open(md_path) as fh:
        fh.write("| " + " | ".join(keys) + " |\n")
        fh.write("|" + "---|" * len(keys) + "\n")
        for r in rows:
            fh.write("| " + " | ".join(_fmt(r.get(k)) for k in keys) + " |\n")


SUMMARY_KEYS = (
    "config",
    "drafter",
    "requests",
    "completion_tokens",
    "accept_length",
    "accept_length_sglang",
    "single_stream_tokens_per_s",
    "speedup",
    "ttft_s_mean",
    "itl_s_mean",
    "peak_output_tokens_per_s",
    "peak_concurrency",
)


def write_server_bench_outputs(
    summaries: Sequence[str | os.PathLike],
    sweeps: Sequence[str | os.PathLike],
    *,
    csv_path: str | os.PathLike,
    md_path: str | os.PathLike,
    sweep_csv_path: str | os.PathLike,
    plot_path: str | os.PathLike,
) -> list[dict]:
    """One summary row per server (speedup = single-stream tok/s over the baseline's), the
    concurrency sweep of all servers as one table, and a throughput-vs-concurrency plot."""
    rows = [dict(read_json(p)) for p in summaries]
    base = next((r for r in rows if r["config"] == BASELINE), None)
    for r in rows:
        b = base and base.get("single_stream_tokens_per_s")
        s = r.get("single_stream_tokens_per_s")
        r["speedup"] = s / b if b and s else None
    write_table(rows, SUMMARY_KEYS, csv_path=csv_path, md_path=md_path)
    sweep_rows = [row for p in sweeps for row in read_jsonl(p)]
    with atomic_open(sweep_csv_path) as fh:
        w = csv.DictWriter(fh, fieldnames=list(SWEEP_KEYS), extrasaction="ignore")
        w.writeheader()
        w.writerows(sweep_rows)
    _plot_sweep(sweep_rows, plot_path)
    return rows


def _plot_sweep(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(6.5, 4))
    sns.lineplot(
        x=[r["concurrency"] for r in rows],
        y=[r["output_tokens_per_s"] or 0.0 for r in rows],
        hue=[r["config"] for r in rows],
        marker="o",
        ax=ax,
    )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("output tokens/s")
    ax.set_title("SGLang output throughput")
    fig.tight_layout()
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)
