"""Stage `bench`: one engine at one chain (or the baseline, without a drafter) over
every benchmark set, one request at a time, then the throughput sweep of a served engine; all
of it as rows of one file (`results/bench/{engine}/{drafter}/{chain}.jsonl`, schema in
`bench.rows`).

Engines (config `bench.engines`), chosen here at construction and nothing else:

  hf      the PyTorch engine in this job (`bench.hf`): lossless EAGLE-3 chain speculation
  sglang  an SGLang server this job starts for the chain, with the `sglang.*` flags and env
  openai  an existing OpenAI-compatible endpoint (`bench.openai`): vLLM, another deployment

An engine's `workers` option (hf: `bench.hf.workers`) splits the prompts over that many
processes, each with its own engine: two on a 2-core machine decode the CPU default's chain
bench in 23 s against 37 s, where a second torch thread saved nothing (one decode step of a
small model does not spread over threads; BENCHMARKS.md, "CPU decoding"). Greedy decoding makes
the rows the same either way.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from specbuild.bench.rows import bench_engine, check_rows
from specbuild.bench.sets import BenchPrompt, read_bench_set
from specbuild.engines.registry import lazy_class
from specbuild.infra.io import write_jsonl

__all__ = [
    "BenchPart",
    "BenchPlan",
    "BenchSettings",
    "merge_rows",
    "plan_bench",
    "run_bench",
    "split_prompts",
]

log = logging.getLogger("specbuild")


def _limit(*limits: int | None) -> int | None:
    given = [x for x in limits if x]
    return min(given) if given else None


@dataclass(frozen=True, kw_only=True)
class BenchSettings:
    """What every engine of a job is measured on (the bench rule's params). Each default is
    the schema's (`bench`); tests/unit/config/test_schema.py keeps them equal."""

    sets: Mapping[str, Mapping[str, Any]]  # name -> path, format, key, id_key, limit, turns
    max_new_tokens: int = 64
    prompt_limit: int | None = None  # prompts of each set at most (None: the set's own limit)
    # the throughput sweep: bench.concurrency where the job sweeps, () where it does not
    # (workflow.bench_plan.bench_concurrency), so no default
    concurrency: Sequence[int]
    sweep_min_requests: int = 16  # per concurrency


@dataclass(frozen=True)
class BenchPlan:
    """A job's prompts dealt over its worker processes (`split_prompts`), with each part's
    `bench_engine` keywords, the tokenizer aside: the first part also sweeps."""

    parts: tuple[dict[str, list[BenchPrompt]], ...]
    part_args: tuple[dict[str, Any], ...]


def plan_bench(
    prompt_sets: Mapping[str, Sequence[BenchPrompt]], *, workers: int, settings: BenchSettings
) -> BenchPlan:
    """The plan of benching `prompt_sets` in at most `workers` processes."""
    parts = split_prompts(prompt_sets, workers)
    bench_args = {"max_new_tokens": settings.max_new_tokens}
    sweep = {"concurrency": settings.concurrency, "min_requests": settings.sweep_min_requests}
    part_args = [{**bench_args, **sweep}] + [bench_args] * (len(parts) - 1)
    return BenchPlan(parts=tuple(parts), part_args=tuple(part_args))


@dataclass(frozen=True)
class BenchPart:
    """Benches one part of a plan on an engine of its own, opened in the process that runs
    it; called with the part's prompt sets and `bench_engine` keywords."""

    engine: str
    engine_args: Mapping[str, Any]  # the opener's keywords
    tokenizer: Any

    def __call__(
        self, prompt_sets: Mapping[str, Sequence[BenchPrompt]], bench_args: Mapping[str, Any]
    ) -> list[dict]:
        with lazy_class("bench.engines", self.engine)(**self.engine_args) as eng:
            sets = list(prompt_sets)
            log.info("bench %s / %s on %s: sets %s", self.engine, eng.chain, eng.device, sets)
            return bench_engine(eng, prompt_sets, tokenizer=self.tokenizer, **bench_args)


def run_bench(
    *,
    engine: str,
    target_dir: str | os.PathLike,
    chain: str,
    out: str | os.PathLike,
    options: Mapping[str, Any],
    settings: BenchSettings,
    drafter_dir: str | None = None,
    drafter_name: str = "drafter",
) -> list[dict]:
    """Bench every set of `settings.sets` (at most `settings.prompt_limit` prompts each), sweep
    `settings.concurrency` on the first set's first turns, write the rows. `options` are the
    engine's own (see each opener); `drafter_name` names the drafter in the rows of a chain (a
    baseline's say "none")."""
    from specbuild.eagle.target_info import load_tokenizer

    tokenizer = load_tokenizer(target_dir)
    prompt_sets = {
        name: read_bench_set(
            spec, limit=_limit(spec.get("limit"), settings.prompt_limit), tokenizer=tokenizer
        )
        for name, spec in settings.sets.items()
    }
    plan = plan_bench(prompt_sets, workers=int(options.get("workers", 1)), settings=settings)
    engine_args = {
        "target_dir": target_dir,
        "chain": chain,
        "drafter_dir": drafter_dir,
        "drafter_name": drafter_name,
        "options": options,
    }
    work = BenchPart(engine, engine_args, tokenizer)
    if len(plan.parts) == 1:
        rows = work(plan.parts[0], plan.part_args[0])
    else:
        # fork, not spawn: the workers start with this process's imports (~6 s each otherwise);
        # no engine, so no torch thread pool, exists here yet
        log.info("bench %s / %s: %d worker processes", engine, chain, len(plan.parts))
        pool = ProcessPoolExecutor(len(plan.parts), mp_context=multiprocessing.get_context("fork"))
        with pool:
            rows = merge_rows(prompt_sets, list(pool.map(work, plan.parts, plan.part_args)))
    check_rows(rows, source=str(out))
    write_jsonl(out, rows)
    return rows


def split_prompts(
    prompt_sets: Mapping[str, Sequence[BenchPrompt]], workers: int
) -> list[dict[str, list[BenchPrompt]]]:
    """The prompts dealt round-robin over at most `workers` parts, each set's order kept (a
    prompt's turns stay together: a later turn carries the earlier answers)."""
    flat = [(name, p) for name, prompts in prompt_sets.items() for p in prompts]
    n = max(1, min(workers, len(flat)))
    parts: list[dict[str, list[BenchPrompt]]] = [{} for _ in range(n)]
    for i, (name, p) in enumerate(flat):
        parts[i % n].setdefault(name, []).append(p)
    return parts


def merge_rows(
    prompt_sets: Mapping[str, Sequence[BenchPrompt]], parts: Sequence[Sequence[dict]]
) -> list[dict]:
    """The parts' rows in the order one process writes them: every set's prompts in order,
    each prompt's turns in order, then the sweep."""
    by_prompt: dict[tuple[str, str], list[dict]] = {}
    sweep = []
    for row in (r for part in parts for r in part):
        if row["phase"] == "bench":
            by_prompt.setdefault((row["set"], row["prompt_id"]), []).append(row)
        else:
            sweep.append(row)
    ordered = [
        row
        for name, prompts in prompt_sets.items()
        for p in prompts
        for row in sorted(by_prompt.pop((name, p.id), []), key=lambda r: r["turn"])
    ]
    if by_prompt:
        raise RuntimeError(f"bench rows of prompts nobody asked for: {sorted(by_prompt)}")
    return ordered + sweep
