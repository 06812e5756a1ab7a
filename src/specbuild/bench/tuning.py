"""Server tuning as a parameter space: one row per point (server flags + environment).

Each point is started as its own server with the shared flags plus its own, and measured for
single-stream decode speed and peak output throughput over a concurrency sweep. Nothing is
silently accepted: a point is recorded with a status, never dropped:

  ok            started, measured; `notes` lists flags the server ignored (its /server_info
                reports another value than asked) and env vars that cannot act (NCCL at TP 1)
  rejected      not started: a flag absent from this SGLang's `launch_server --help`, or an env
                value NCCL does not define (NCCL falls back to defaults with only a log line),
                or a setting that is unsafe on shared hosts (NVLink multicast, NCCL_NVLS_ENABLE)
  start_failed  the server exited or never became healthy; `detail` holds its last output line

Tables (CSV + Markdown) and a plot are written from the rows by `write_tuning_outputs`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from specbuild.backends.server import (
    DEFAULT_LAUNCHER,
    ServerSpec,
    ServerStartError,
    SGLangServer,
    build_server_args,
    launcher_help,
    mask_env,
    new_api_key,
    unknown_flags,
)
from specbuild.bench.server import (
    spec_server_args,
    stream_completion,
    sweep_concurrency,
    write_table,
)
from specbuild.bench.specdec import BASELINE
from specbuild.io import atomic_open, read_json, write_json

__all__ = [
    "TUNING_KEYS",
    "env_faults",
    "ignored_flags",
    "run_tuning_point",
    "write_tuning_outputs",
    "write_launcher_help",
]

log = logging.getLogger("specbuild")

TUNING_KEYS = (
    "point",
    "status",
    "detail",
    "notes",
    "server_args",
    "env",
    "single_stream_tokens_per_s",
    "ttft_s_mean",
    "itl_s_mean",
    "peak_output_tokens_per_s",
    "peak_concurrency",
    "accept_length",
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


def run_tuning_point(
    *,
    target_dir: str | os.PathLike,
    point: str,
    point_args: Mapping[str, Any],
    point_env: Mapping[str, str],
    base_args: Mapping[str, Any],
    base_env: Mapping[str, str],
    out: str | os.PathLike,
    prompt_set: Mapping[str, Any],
    help_text: str,
    prompts: int = 4,
    chain: str = BASELINE,
    drafter_dir: str | None = None,
    launcher: Sequence[str] = DEFAULT_LAUNCHER,
    host: str = "127.0.0.1",
    startup_timeout_s: float = 900.0,
    request_timeout_s: float = 600.0,
    max_new_tokens: int = 128,
    concurrency: Sequence[int] = (1, 8, 32, 64),
    sweep_min_requests: int = 16,
) -> dict:
    """Check, start and measure one point; write its row as JSON (also when it fails).

    `help_text` is the server's `--help` (rule sglang_help writes it once per sweep)."""
    from specbuild.bench.sets import read_bench_set
    from specbuild.target import load_tokenizer

    texts = [p.turns[0] for p in read_bench_set(prompt_set, limit=prompts)]
    args = {**dict(base_args), **dict(point_args), **spec_server_args(chain, drafter_dir)}
    env = {**dict(base_env), **{k: str(v) for k, v in point_env.items()}}
    rendered = build_server_args(args)
    row = _check_point(point, args, env, rendered, help_text)
    if row is None:
        row = _measure_point(
            point,
            args,
            env,
            rendered,
            target_dir=target_dir,
            launcher=launcher,
            host=host,
            startup_timeout_s=startup_timeout_s,
            request_timeout_s=request_timeout_s,
            prompts=texts,
            tokenizer=load_tokenizer(target_dir),
            max_new_tokens=max_new_tokens,
            concurrency=concurrency,
            sweep_min_requests=sweep_min_requests,
            point_args=point_args,
        )
    log.info("tuning point %s: %s %s", point, row["status"], row["detail"])
    write_json(out, row)
    return row


def _check_point(
    point: str, args: Mapping, env: Mapping, rendered: list[str], help_text: str
) -> dict | None:
    faults = env_faults(env)
    unknown = unknown_flags(rendered, help_text)
    if unknown:
        faults.insert(
            0,
            "unknown flag(s) " + " ".join(unknown) + " (not in this SGLang's launch_server --help)",
        )
    if faults:
        return _row(point, "rejected", "; ".join(faults), args, env)
    return None


def _measure_point(
    point: str,
    args: Mapping,
    env: Mapping,
    rendered: list[str],
    *,
    target_dir,
    launcher,
    host,
    startup_timeout_s,
    request_timeout_s,
    prompts,
    tokenizer,
    max_new_tokens,
    concurrency,
    sweep_min_requests,
    point_args,
) -> dict:
    from specbuild.bench.sets import render_prompt

    spec = ServerSpec(
        model_path=str(target_dir),
        launcher=tuple(launcher),
        server_args=tuple(rendered),
        env=dict(env),
        host=host,
        startup_timeout_s=startup_timeout_s,
        api_key=new_api_key(),
    )
    ids = [render_prompt(tokenizer, [{"role": "user", "content": p}]) for p in prompts]
    try:
        with SGLangServer(spec, name=f"sglang-tune-{point}") as srv:

            def complete(x: list[int], n: int):
                return stream_completion(
                    srv.base_url, x, n, timeout=request_timeout_s, api_key=srv.api_key
                )

            complete(ids[0], 16)  # warm-up
            single = [complete(x, max_new_tokens) for x in ids]
            sweep = sweep_concurrency(
                srv.base_url,
                ids,
                config=point,
                levels=concurrency,
                max_new_tokens=max_new_tokens,
                min_requests=sweep_min_requests,
                timeout=request_timeout_s,
                api_key=srv.api_key,
            )
            info = srv.get_json("/server_info")
    except ServerStartError as err:
        lines = [ln for ln in str(err).splitlines() if ln.strip()]
        detail = lines[0] + (" | " + lines[-1] if len(lines) > 1 else "")
        return _row(point, "start_failed", detail, args, env)
    notes = ignored_flags(point_args, info)
    tp = int(info.get("tp_size") or args.get("tp_size") or 1)
    if tp == 1:
        notes += [
            f"{k} has no effect at tp_size 1 (no collectives)"
            for k in env
            if k.startswith("NCCL_") and k not in _UNSAFE_ENV
        ]
    comp = sum(r.completion_tokens for r in single)
    wall = sum(r.wall_s for r in single)
    verify = sum(r.verify_steps or 0 for r in single)
    ttfts = [r.ttft_s for r in single if r.ttft_s is not None]
    itls = [
        (r.wall_s - r.ttft_s) / (r.completion_tokens - 1)
        for r in single
        if r.ttft_s is not None and r.completion_tokens > 1
    ]
    peak = max(sweep, key=lambda r: r["output_tokens_per_s"] or 0.0)
    row = _row(
        point,
        "ok",
        "",
        args,
        env,
        single_stream_tokens_per_s=comp / wall if wall else None,
        ttft_s_mean=sum(ttfts) / len(ttfts) if ttfts else None,
        itl_s_mean=sum(itls) / len(itls) if itls else None,
        peak_output_tokens_per_s=peak["output_tokens_per_s"],
        peak_concurrency=peak["concurrency"],
        accept_length=comp / verify if verify else None,
    )
    row["notes"] = "; ".join(notes)
    return row


def write_tuning_outputs(
    point_files: Sequence[str | os.PathLike], *, csv_path, md_path, plot_path
) -> list[dict]:
    rows = [read_json(p) for p in point_files]
    write_table(rows, TUNING_KEYS, csv_path=csv_path, md_path=md_path)
    _plot_tuning(rows, plot_path)
    return rows


def _plot_tuning(rows: Sequence[Mapping[str, Any]], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    data = []
    for r in rows:
        for metric in ("single_stream_tokens_per_s", "peak_output_tokens_per_s"):
            label = r["point"] if r["status"] == "ok" else f"{r['point']} ({r['status']})"
            data.append({"point": label, "metric": metric, "tokens/s": r[metric] or 0.0})
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.5 * len(rows) + 2), squeeze=False)
    for ax, metric in zip(
        axes[0], ("single_stream_tokens_per_s", "peak_output_tokens_per_s"), strict=False
    ):
        part = [d for d in data if d["metric"] == metric]
        sns.barplot(
            x=[d["tokens/s"] for d in part], y=[d["point"] for d in part], ax=ax, color="#4c72b0"
        )
        ax.set_title(metric.replace("_", " "))
        ax.set_xlabel("tokens/s")
    fig.tight_layout()
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)


def write_launcher_help(launcher: Sequence[str], out: str | os.PathLike) -> str:
    """The launcher's `--help` once per sweep, for every point's flag check."""
    text = launcher_help(launcher)
    with atomic_open(out) as fh:
        fh.write(text)
    return text
