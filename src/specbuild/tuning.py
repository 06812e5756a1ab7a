"""Server tuning as a parameter space: one row per point (server flags + environment).

Each point is started as its own server with the shared flags plus its own (a point whose
flags are another job's measures on that job's server where servers are shared,
`sglang.share_idle_s`), and measured for single-stream decode speed and peak output
throughput over a concurrency sweep. Nothing is silently accepted: a point is recorded with a
status, never dropped:

  ok            started, measured; `notes` lists flags the server ignored (its /server_info
                reports another value than asked) and env vars that cannot act (NCCL at TP 1);
                `server_start_s` what the point's server start cost
  rejected      not started: a flag absent from this SGLang's `launch_server --help`, or an env
                value NCCL does not define (NCCL falls back to defaults with only a log line),
                or a setting that is unsafe on shared hosts (NVLink multicast, NCCL_NVLS_ENABLE)
  start_failed  the server exited or never became healthy; `detail` holds its last output line

The table and plot of all points are written by `specbuild.report.tuning`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specbuild.bench.metrics import output_throughput, summarize
from specbuild.bench.rows import bench_engine
from specbuild.bench.served import sglang_engine
from specbuild.bench.sets import BenchPrompt, read_bench_set
from specbuild.eagle.chain import BASELINE, Chain
from specbuild.engines.kept_server import Endpoint
from specbuild.engines.open import open_engine
from specbuild.engines.runtime import Runtime
from specbuild.engines.server import (
    ServerOptions,
    ServerSpec,
    ServerStartError,
    launcher_help,
    mask_env,
    tp_size,
    unknown_flags,
)
from specbuild.infra.io import atomic_open, write_json

__all__ = [
    "TUNING_KEYS",
    "TuningPlan",
    "TuningPoint",
    "TuningSettings",
    "env_faults",
    "ignored_flags",
    "plan_tuning_point",
    "run_tuning_point",
    "write_launcher_help",
]

log = logging.getLogger("specbuild")

TUNING_KEYS = (
    ("point", "status", "detail", "notes", "server_args", "env", "device", "server_start_s")
    + ("single_stream_tokens_per_s",)
    + ("ttft_s_p50", "ttft_s_p99", "itl_s_p50", "itl_s_p99")
    + ("peak_output_tokens_per_s", "peak_concurrency", "accept_length")
)

# Values NCCL documents for the variables a sweep is likely to touch (NCCL 2.2x).
_NCCL_WORDS = {
    "NCCL_PROTO": {"LL", "LL128", "Simple"},
    "NCCL_ALGO": {"Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"},
    "NCCL_P2P_LEVEL": {"LOC", "NVL", "PIX", "PXB", "PHB", "SYS"},
}
_NCCL_INTS = {
    "NCCL_MAX_NCHANNELS": (1, 64),
    "NCCL_MIN_NCHANNELS": (1, 64),
    "NCCL_BUFFSIZE": (1 << 16, 1 << 31),
    "NCCL_NTHREADS": (64, 512),
}
# NVLink multicast can take a shared host's GPUs out of service; it stays off (KINDS notes).
_UNSAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def env_faults(env: Mapping[str, str]) -> list[str]:
    """Env values that NCCL would not honour (or that are unsafe), each with the allowed ones."""
    faults = []
    for key, raw in env.items():
        value = str(raw)
        if key in _UNSAFE_ENV and value != _UNSAFE_ENV[key]:
            faults.append(f"{key}={value}: must stay {_UNSAFE_ENV[key]} (NVLink multicast off)")
        elif key in _NCCL_WORDS:
            # NCCL takes comma lists and a leading ^ to exclude
            words = [w for w in re.split(r"[,\s]+", value.lstrip("^")) if w]
            bad = [w for w in words if w not in _NCCL_WORDS[key]]
            if bad or not words:
                faults.append(f"{key}={value}: choose from {sorted(_NCCL_WORDS[key])}")
        elif key in _NCCL_INTS:
            lo, hi = _NCCL_INTS[key]
            if not value.isdigit() or not lo <= int(value) <= hi:
                faults.append(f"{key}={value}: an integer in [{lo}, {hi}]")
            elif key == "NCCL_NTHREADS" and int(value) % 64:
                faults.append(f"{key}={value}: a multiple of 64")
    return faults


def _same(asked: Any, got: Any) -> bool:
    if isinstance(asked, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(asked) == len(got) and all(_same(a, g) for a, g in zip(asked, got, strict=True))
    if isinstance(asked, bool) or isinstance(got, bool):
        return bool(asked) == (got is True or str(got).lower() == "true")
    try:
        return float(asked) == float(got)
    except (TypeError, ValueError):
        return str(asked) == str(got)


def ignored_flags(asked: Mapping[str, Any], server_info: Mapping[str, Any]) -> list[str]:
    """Flags whose value in /server_info differs from the one asked for (the server overrode
    or ignored them). Keys /server_info does not report cannot be checked and are skipped."""
    notes = []
    for key, value in asked.items():
        if value is None or key not in server_info:
            continue
        if not _same(value, server_info[key]):
            notes.append(f"{key}: asked {value!r}, server runs {server_info[key]!r}")
    return notes


def _row(point: str, status: str, detail: str, args: Mapping, env: Mapping, **metrics) -> dict:
    row = {k: None for k in TUNING_KEYS}
    row.update(
        point=point,
        status=status,
        detail=detail,
        notes="",
        server_args=json.dumps(dict(args), sort_keys=True),
        env=json.dumps(mask_env(env), sort_keys=True),
    )
    row.update(metrics)
    return row


@dataclass(frozen=True)
class TuningPoint:
    """One point of the sweep: its name, and the flags and env it adds to the shared ones."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TuningSettings:
    """How every point is measured (the tuning rule's params)."""

    prompt_set: Mapping[str, Any]  # a bench set's config entry
    prompts: int = 4  # of the set, their first turns
    chain: str = BASELINE  # the speculation every point serves
    max_new_tokens: int = 128
    concurrency: Sequence[int] = (1, 8, 32, 64)  # the throughput sweep
    sweep_min_requests: int = 16  # per concurrency


@dataclass(frozen=True)
class TuningPlan:
    """A point's server, decided before any starts: its spec, the flags it runs with (shared,
    the point's, the chain's) and why it must not start (none: it may)."""

    spec: ServerSpec
    args: Mapping[str, Any]
    faults: tuple[str, ...]


def plan_tuning_point(
    point: TuningPoint,
    *,
    server: ServerOptions,
    target_dir: str | os.PathLike,
    help_text: str,
    chain: str = BASELINE,
    drafter_dir: str | None = None,
) -> TuningPlan:
    """The server of `point` (the shared `server` options plus the point's and the chain's),
    checked: env values NCCL would not honour and flags absent from `help_text` (the server's
    `--help`) are its faults."""
    chain_args = (
        {}
        if chain == BASELINE
        else Chain.parse(chain).server_args(
            str(drafter_dir), draft_attention_backend=server.draft_attention_backend
        )
    )
    extra = {**dict(point.args), **chain_args}
    spec = server.spec(target_dir, extra_args=extra, extra_env=point.env)
    faults = env_faults(spec.env)
    unknown = unknown_flags(spec.server_args, help_text)
    if unknown:
        flags = " ".join(unknown)
        faults.insert(0, f"unknown flag(s) {flags} (not in this SGLang's launch_server --help)")
    return TuningPlan(spec=spec, args={**dict(server.server_args), **extra}, faults=tuple(faults))


def run_tuning_point(
    *,
    target_dir: str | os.PathLike,
    point: TuningPoint,
    server: ServerOptions,
    out: str | os.PathLike,
    help_text: str,
    settings: TuningSettings,
    drafter_dir: str | None = None,
    share_idle_s: float = 0.0,
) -> dict:
    """Check, start and measure one point (the shared `server` options plus its own flags and
    env); write its row as JSON, also when it fails. `help_text` is the server's `--help`
    (rule tuning_help writes it once per sweep). `share_idle_s` > 0: a point whose flags are
    another job's (its chain's bench server, say) measures on that job's server, alone."""
    plan = plan_tuning_point(
        point,
        server=server,
        target_dir=target_dir,
        help_text=help_text,
        chain=settings.chain,
        drafter_dir=drafter_dir,
    )
    if plan.faults:
        row = _row(point.name, "rejected", "; ".join(plan.faults), plan.args, plan.spec.env)
    else:
        row = _start_and_measure(
            point,
            plan,
            target_dir=target_dir,
            server=server,
            settings=settings,
            share_idle_s=share_idle_s,
        )
    log.info("tuning point %s: %s %s", point.name, row["status"], row["detail"])
    write_json(out, row)
    return row


def _start_and_measure(
    point: TuningPoint,
    plan: TuningPlan,
    *,
    target_dir: str | os.PathLike,
    server: ServerOptions,
    settings: TuningSettings,
    share_idle_s: float,
) -> dict:
    """The row of a point whose plan has no fault: measured, or why its server did not start."""
    from specbuild.eagle.target_info import load_tokenizer

    s, spec, args = settings, plan.spec, plan.args
    tokenizer = load_tokenizer(target_dir)
    read = read_bench_set(s.prompt_set, limit=s.prompts, tokenizer=tokenizer)
    firsts = [BenchPrompt(p.id, p.turns[:1]) for p in read]
    try:
        name = f"sglang-tune-{point.name}"
        with open_engine(spec, Runtime(idle_s=share_idle_s), name=name, exclusive=True) as srv:
            engine = sglang_engine(
                srv, chain=s.chain, drafter="drafter", timeout=server.request_timeout_s
            )
            metrics = _measure(
                engine,
                firsts,
                tokenizer=tokenizer,
                max_new_tokens=s.max_new_tokens,
                concurrency=s.concurrency,
                min_requests=s.sweep_min_requests,
            )
            info = srv.get_json("/server_info")
            start_s = srv.start_s
    except ServerStartError as err:
        lines = [ln for ln in str(err).splitlines() if ln.strip()]
        detail = lines[0] + (" | " + lines[-1] if len(lines) > 1 else "")
        return _row(point.name, "start_failed", detail, args, spec.env)
    row = _row(point.name, "ok", "", args, spec.env, server_start_s=start_s, **metrics)
    notes = ignored_flags(point.args, info)
    if isinstance(srv, Endpoint):
        notes.append("shared server: started once for the jobs with these flags")
    if int(info.get("tp_size") or tp_size(args)) == 1:
        notes += [
            f"{k} has no effect at tp_size 1 (no collectives)"
            for k in spec.env
            if k.startswith("NCCL_") and k not in _UNSAFE_ENV
        ]
    row["notes"] = "; ".join(notes)
    return row


def _measure(engine, prompts, *, tokenizer, max_new_tokens, concurrency, min_requests) -> dict:
    """Single-stream rows on the prompts, then the sweep; the point's numbers (`metrics`)."""
    rows = bench_engine(
        engine,
        {"tuning": prompts},
        tokenizer=tokenizer,
        max_new_tokens=max_new_tokens,
        concurrency=concurrency,
        min_requests=min_requests,
    )
    single = summarize([r for r in rows if r["phase"] == "bench"])
    peak = {
        c: output_throughput([r for r in rows if r["concurrency"] == c and r["phase"] == "sweep"])
        or 0.0
        for c in concurrency
    }
    best = max(peak, key=peak.get)
    return {
        "device": engine.device,
        "single_stream_tokens_per_s": single["tokens_per_s"],
        **{k: single[k] for k in ("ttft_s_p50", "ttft_s_p99", "itl_s_p50", "itl_s_p99")},
        "peak_output_tokens_per_s": peak[best],
        "peak_concurrency": best,
        "accept_length": single["accept_length"],
    }


def write_launcher_help(launcher: Sequence[str], out: str | os.PathLike) -> str:
    """The launcher's `--help` once per sweep, for every point's flag check."""
    text = launcher_help(launcher)
    with atomic_open(out) as fh:
        fh.write(text)
    return text
