"""Every benchmark number, defined once: the tables, plots, concurrency sweep, tuning rows and
`make serve` all compute them here, from the per-request rows (schema in `bench.rows`).

acceptance length   Σ completion_tokens / Σ verify_steps over a group's requests: output tokens
                    per target verify step, the prefill's first token counted too. SGLang's
                    convention (its `accept len` log line and per-request `spec_accept_length`),
                    the number SpecForge and speculators quote. 1.0 for the baseline by
                    definition (one token per target forward). Its interval is a seeded 95%
                    percentile bootstrap over requests: every request commits at least one token
                    per verify step, so no resampled ratio, and no bound, falls below 1.0.
                    Fewer than MIN_INTERVAL_REQUESTS requests get no interval. Two runs over
                    the same requests (fp8 against bf16 shards, say) compare as B / A with a
                    paired bootstrap: requests are resampled together in both.
acceptance at k     Σ verify steps that accepted draft position k / Σ verify steps (k from 1),
                    where the engine reports it (the PyTorch engine). Non-increasing in k.
TTFT                seconds from sending a request to its first output token.
ITL                 a request's mean inter-token latency after its first token,
                    (wall - TTFT) / (completion_tokens - 1) (SGLang's bench_serving: TPOT).
                    TTFT and ITL are reported as mean, p50, p90 and p99 over requests.
tokens/s            single stream: Σ completion_tokens / Σ wall; at concurrency c: Σ
                    completion_tokens / the span from the first request's start to the last
                    request's end (output throughput).
speedup             tokens/s over the baseline's on the same engine and set.
step time           decode milliseconds per target forward, single stream: Σ (wall - TTFT) /
                    Σ verify_steps for a chain (one verify cycle: the draft's steps plus the
                    target's verify), Σ (wall - TTFT) / Σ (completion_tokens - 1) for the
                    baseline (one token).
break-even          a chain's step time over the baseline's on the same engine and set: the
                    verify-cycle cost in baseline steps, which is the acceptance length (decode
                    tokens per verify cycle) at which the chain only breaks even. Decode
                    speedup = (acceptance length - requests / Σ verify_steps) / break-even:
                    the acceptance column counts each request's prefill token too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from specbuild.eagle.chain import BASELINE

__all__ = [
    "MIN_INTERVAL_REQUESTS",
    "PERCENTILES",
    "acceptance_length",
    "acceptance_interval",
    "paired_ratio_interval",
    "inter_token_latency",
    "latency_stats",
    "output_throughput",
    "position_rates",
    "break_even",
    "speedup",
    "step_ms",
    "summarize",
]

MIN_INTERVAL_REQUESTS = 5  # a bootstrap over fewer requests is no evidence of anything
BOOTSTRAP_RESAMPLES = 2000  # the bounds move by < 0.01 between seeds at 20+ requests
BOOTSTRAP_SEED = 0  # seeded: a rerun of the tables draws the same interval
PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft_s", "itl_s")


def acceptance_length(
    completion_tokens: float, verify_steps: float | None, chain: str
) -> float | None:
    """Σcompletion / Σverify (one request's counts or a group's sums); 1.0 for the baseline;
    None where no verify step was counted (EOS from prefill, or an engine that does not say)."""
    if chain == BASELINE:
        return 1.0
    return completion_tokens / verify_steps if verify_steps else None


def acceptance_interval(
    completion: Sequence[int], verify: Sequence[int]
) -> tuple[float | None, float | None]:
    """95% percentile-bootstrap bounds of Σcompletion/Σverify over requests; None, None from
    fewer than MIN_INTERVAL_REQUESTS requests."""
    if len(completion) < MIN_INTERVAL_REQUESTS:
        return None, None
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    picks = rng.integers(0, len(completion), size=(BOOTSTRAP_RESAMPLES, len(completion)))
    num, den = np.asarray(completion)[picks].sum(1), np.asarray(verify)[picks].sum(1)
    ratios = num[den > 0] / den[den > 0]
    if not len(ratios):
        return None, None
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def paired_ratio_interval(
    completion_a: Sequence[int],
    verify_a: Sequence[int],
    completion_b: Sequence[int],
    verify_b: Sequence[int],
) -> tuple[float, float | None, float | None]:
    """B's acceptance length over A's on the same requests (row i of each: one request), and
    95% percentile-bootstrap bounds that resample requests in pairs, so what the requests share
    (a prompt easy for both) cancels; None, None from fewer than MIN_INTERVAL_REQUESTS."""
    ca, va, cb, vb = (
        np.asarray(x, dtype=float) for x in (completion_a, verify_a, completion_b, verify_b)
    )
    ratio = float((cb.sum() / vb.sum()) / (ca.sum() / va.sum()))
    if len(ca) < MIN_INTERVAL_REQUESTS:
        return ratio, None, None
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    picks = rng.integers(0, len(ca), size=(BOOTSTRAP_RESAMPLES, len(ca)))
    ratios = (cb[picks].sum(1) / vb[picks].sum(1)) / (ca[picks].sum(1) / va[picks].sum(1))
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return ratio, float(lo), float(hi)


def inter_token_latency(
    wall_s: float, ttft_s: float | None, completion_tokens: int
) -> float | None:
    """Mean seconds between output tokens after the first; None for one token or no TTFT."""
    if ttft_s is None or completion_tokens < 2:
        return None
    return (wall_s - ttft_s) / (completion_tokens - 1)


def position_rates(accepted: Iterable[Sequence[int]], verify_steps: int) -> list[float]:
    """Per draft position: accepted count / verify steps, summed over requests."""
    lists = [list(a) for a in accepted if len(a)]
    if not lists or not verify_steps:
        return []
    width = max(len(a) for a in lists)
    return [sum(a[k] for a in lists if k < len(a)) / verify_steps for k in range(width)]


def latency_stats(values: Iterable[float | None], name: str) -> dict[str, float | None]:
    """`{name}_mean`, `{name}_p50`, `_p90`, `_p99` over the known values (None without any)."""
    xs = [float(v) for v in values if v is not None and v == v]  # NaN != NaN
    stats = {f"{name}_mean": float(np.mean(xs)) if xs else None}
    for p in PERCENTILES:
        stats[f"{name}_p{p}"] = float(np.percentile(xs, p)) if xs else None
    return stats


def output_throughput(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """Σ completion tokens over the span from the first start to the last end of `rows`."""
    if not rows:
        return None
    start = min(r["start_s"] for r in rows)
    span = max(r["start_s"] + r["wall_s"] for r in rows) - start
    tokens = sum(r["completion_tokens"] for r in rows)
    return tokens / span if span > 0 else None


def speedup(tokens_per_s: float | None, baseline_tokens_per_s: float | None) -> float | None:
    if not tokens_per_s or not baseline_tokens_per_s:
        return None
    return tokens_per_s / baseline_tokens_per_s


def step_ms(rows: Sequence[Mapping[str, Any]], chain: str) -> float | None:
    """Decode milliseconds per target forward of `rows` (one chain's): per verify cycle for a
    chain, per token for the baseline; None where no request has a TTFT and a decode step."""
    decode, steps = 0.0, 0
    for r in rows:
        if r.get("ttft_s") is None:
            continue
        n = r["completion_tokens"] - 1 if chain == BASELINE else r["verify_steps"]
        if n:
            decode += r["wall_s"] - r["ttft_s"]
            steps += n
    return 1e3 * decode / steps if steps else None


def break_even(chain_step_ms: float | None, baseline_step_ms: float | None) -> float | None:
    """A verify cycle's cost in baseline steps: the acceptance length a chain must reach."""
    if not chain_step_ms or not baseline_step_ms:
        return None
    return chain_step_ms / baseline_step_ms


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every number of one group of request rows at one chain (an engine and set; a sweep
    level; a tuning point), in display order; None where it is undefined."""
    chains = {r["chain"] for r in rows}
    if len(chains) != 1:
        raise ValueError(f"summarize: one chain per group, got {sorted(chains)}")
    (chain,) = chains
    counted = [r for r in rows if r["verify_steps"] is not None]
    completion = [r["completion_tokens"] for r in counted]
    verify = [r["verify_steps"] for r in counted]
    tokens = sum(r["completion_tokens"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    lo, hi = (None, None) if chain == BASELINE else acceptance_interval(completion, verify)
    out: dict[str, Any] = {
        "requests": len(rows),
        "completion_tokens": tokens,
        "verify_steps": sum(verify) if counted else None,
        "accept_length": acceptance_length(sum(completion), sum(verify), chain)
        if counted or chain == BASELINE
        else None,
        "accept_length_lo": lo,
        "accept_length_hi": hi,
    }
    rates = position_rates((r["accepted_per_position"] for r in counted), sum(verify))
    out |= {f"accept_pos{k}": rate for k, rate in enumerate(rates, 1)}
    out["tokens_per_s"] = tokens / wall if wall > 0 else None
    out["step_ms"] = step_ms(rows, chain)
    for name in LATENCIES:
        out |= latency_stats((r.get(name) for r in rows), name)
    return out
