"""Stage `bench`: one engine at one config (a chain, or the baseline without a drafter) over
every benchmark set, one request at a time, then the throughput sweep of a served engine; all
of it as rows of one file (`results/bench/{engine}/{drafter}/{config}.jsonl`, schema in
`bench.rows`).

Engines (config `bench.engines`), chosen here at construction and nothing else:

  hf      the PyTorch engine in this job (`bench.hf`): lossless EAGLE-3 chain speculation
  sglang  an SGLang server this job starts for the config, with the `sglang.*` flags and env
  openai  an existing OpenAI-compatible endpoint (`bench.openai`): vLLM, another deployment

"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from importlib import import_module
from typing import Any

from specbuild.bench.rows import bench_engine, check_rows
from specbuild.bench.sets import read_bench_set
from specbuild.io import write_jsonl

__all__ = ["ENGINES", "run_bench"]

log = logging.getLogger("specbuild")

# engine -> "module:opener"; imported lazily so a CPU job never imports server code or torch
ENGINES = {
    "hf": "specbuild.bench.hf:open_engine",
    "sglang": "specbuild.bench.served:open_sglang",
    "openai": "specbuild.bench.served:open_openai",
}


def _opener(engine: str):
    if engine not in ENGINES:
        raise ValueError(f"unknown bench engine {engine!r}; choose one of {sorted(ENGINES)}")
    module, name = ENGINES[engine].split(":")
    return getattr(import_module(module), name)


def _limit(*limits: int | None) -> int | None:
    given = [x for x in limits if x]
    return min(given) if given else None


def run_bench(
    *,
    engine: str,
    target_dir: str | os.PathLike,
    config: str,
    sets: Mapping[str, Mapping[str, Any]],
    out: str | os.PathLike,
    options: Mapping[str, Any],
    drafter_dir: str | None = None,
    drafter_name: str = "drafter",
    max_new_tokens: int = 64,
    prompt_limit: int | None = None,
    concurrency: Sequence[int] = (),
    sweep_min_requests: int = 16,
) -> list[dict]:
    """Bench every set (its config entry: path, format, key, id_key, limit, turns; at most
    `prompt_limit` prompts each), sweep `concurrency` on the first set's first turns, write
    the rows. `options` are the engine's own (see each opener); `drafter_name` names the
    drafter in the rows of a chain (a baseline's say "none")."""
    from specbuild.target import load_tokenizer

    tokenizer = load_tokenizer(target_dir)
    prompt_sets = {
        name: read_bench_set(spec, limit=_limit(spec.get("limit"), prompt_limit))
        for name, spec in sets.items()
    }
    with _opener(engine)(
        target_dir=target_dir,
        config=config,
        drafter_dir=drafter_dir,
        drafter_name=drafter_name,
        options=options,
    ) as eng:
        log.info("bench %s / %s on %s: sets %s", engine, config, eng.device, list(prompt_sets))
        rows = bench_engine(
            eng,
            prompt_sets,
            tokenizer=tokenizer,
            max_new_tokens=max_new_tokens,
            concurrency=concurrency,
            min_requests=sweep_min_requests,
        )
    check_rows(rows, source=str(out))
    write_jsonl(out, rows)
    return rows
