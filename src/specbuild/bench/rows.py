"""Bench rows: one JSON object per request, whatever the engine, and the two loops that make them.

An engine (`hf` in the job, `sglang` behind a server the job starts, `openai` behind an existing
endpoint) implements `BenchEngine.complete` and nothing else; turns, timing, the sweep and the
row format are written once, here. Every table and plot reads only these rows (`bench.metrics`).

Row schema (`results/bench/{engine}/{drafter}/{chain}.jsonl`, the baseline's drafter `none`;
every key present, null where unknown):

  set                    str    benchmark set name (config `bench.sets` key)
  prompt_id              str    the prompt's id in its set
  turn                   int    1-based user turn; turn 2 follows the target's own turn-1 answer
  phase                  str    "bench": every set and turn, one request at a time;
                                "sweep": the first set's first turns, `concurrency` at a time
  concurrency            int    requests in flight while this one ran (1 in phase bench)
  engine                 str    "hf", "sglang", or the openai endpoint's name ("vllm", ...)
  device                 str    where it ran ("cpu", "cuda (NVIDIA H200)", an endpoint's host)
  chain                  str    "steps-topk-draft_tokens" (e.g. "3-1-4"), or "baseline"
  drafter                str    drafter name: the variant's, a bench.drafters key ("none" for the
                                baseline)
  completion_tokens      int    tokens generated (the first one comes from prefill)
  verify_steps           int    target verify forwards (SGLang's spec_verify_ct); null for the
                                baseline and for engines that do not report it
  accept_length          float  completion_tokens / verify_steps (`bench.metrics`)
  accepted_per_position  list   per draft position k (0-based), verify steps that accepted the
                                k-th drafted token ([] where not reported)
  start_s                float  start, seconds after the job's first request (sweep throughput)
  wall_s                 float  request wall time, prefill included
  ttft_s, itl_s          float  time to first token; mean inter-token latency after it
  tokens_per_s           float  completion_tokens / wall_s
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from specbuild.bench.metrics import acceptance_length, inter_token_latency, output_throughput
from specbuild.bench.sets import BenchPrompt, render_prompt

__all__ = [
    "ROW_KEYS",
    "Completion",
    "BenchEngine",
    "device_label",
    "make_row",
    "check_rows",
    "bench_engine",
    "run_requests",
    "sweep_concurrency",
]

# In the order of the schema above: what was asked, what ran it, the counts, the times.
ROW_KEYS = (
    ("set", "prompt_id", "turn", "phase", "concurrency", "engine", "device", "chain", "drafter")
    + ("completion_tokens", "verify_steps", "accept_length", "accepted_per_position")
    + ("start_s", "wall_s", "ttft_s", "itl_s", "tokens_per_s")
)

log = logging.getLogger("specbuild")

WARMUP_TOKENS = 16  # one unrecorded request first: one-off allocations, kernels, CUDA graphs


@dataclass
class Completion:
    """What an engine reports for one request: the answer as ids (hf, sglang) or text (openai)."""

    completion_tokens: int
    verify_steps: int | None  # None: no drafter, or the engine does not report it
    wall_s: float
    ttft_s: float | None = None
    accepted_per_position: list[int] = field(default_factory=list)
    token_ids: list[int] | None = None
    text: str | None = None


@runtime_checkable
class BenchEngine(Protocol):
    name: str  # row `engine`
    device: str  # row `device`
    chain: str  # row `chain`: a chain name or "baseline"
    drafter: str  # row `drafter`: "none" for the baseline

    def complete(self, prompt_ids: list[int], max_new_tokens: int) -> Completion:
        """Greedy-decode up to max_new_tokens after prompt_ids (stopping at end of turn)."""
        ...


def device_label(device: str) -> str:
    """What ran a bench, for the rows: the device as named, with the GPU's name on CUDA (the
    job's pinned GPU, which its servers see too)."""
    if not str(device).startswith("cuda"):
        return str(device)
    import torch

    return f"cuda ({torch.cuda.get_device_name(torch.device(device))})"


def make_row(
    c: Completion,
    *,
    engine: BenchEngine,
    set_name: str,
    prompt_id: str,
    turn: int,
    start_s: float,
    phase: str = "bench",
    concurrency: int = 1,
) -> dict:
    n = c.completion_tokens
    return {
        "set": set_name,
        "prompt_id": prompt_id,
        "turn": turn,
        "phase": phase,
        "concurrency": concurrency,
        "engine": engine.name,
        "device": engine.device,
        "chain": engine.chain,
        "drafter": engine.drafter,
        "completion_tokens": n,
        "verify_steps": c.verify_steps,
        "accept_length": acceptance_length(n, c.verify_steps, engine.chain),
        "accepted_per_position": list(c.accepted_per_position),
        "start_s": start_s,
        "wall_s": c.wall_s,
        "ttft_s": c.ttft_s,
        "itl_s": inter_token_latency(c.wall_s, c.ttft_s, n),
        "tokens_per_s": n / c.wall_s if c.wall_s > 0 else None,
    }


def check_rows(rows: Sequence[dict], source: str = "rows") -> None:
    """Raise once listing every row that misses a schema key or carries an unknown one."""
    faults = []
    for i, row in enumerate(rows):
        missing = [k for k in ROW_KEYS if k not in row]
        unknown = sorted(set(row) - set(ROW_KEYS))
        if missing or unknown:
            faults.append(f"{source}: row {i}: missing {missing}, unknown {unknown}")
    if faults:
        raise ValueError(
            "bench rows break the schema in bench/rows.py (rows of an older specbuild? rerun "
            "the bench):\n  " + "\n  ".join(faults)
        )


def bench_engine(
    engine: BenchEngine,
    prompt_sets: Mapping[str, Sequence[BenchPrompt]],
    *,
    tokenizer,
    max_new_tokens: int,
    concurrency: Sequence[int] = (),
    min_requests: int = 16,
) -> list[dict]:
    """Every row of one engine: a warm-up request (unrecorded), every set one request at a
    time (phase bench), then the sweep of the first set's first turns (phase sweep)."""
    engine.complete(render_prompt(tokenizer, [{"role": "user", "content": "Hi"}]), WARMUP_TOKENS)
    common = {"engine": engine, "tokenizer": tokenizer, "max_new_tokens": max_new_tokens}
    t0, rows = time.monotonic(), []
    for name, prompts in prompt_sets.items():
        rows += run_requests(prompts, set_name=name, t0=t0, **common)
    if concurrency:
        name, prompts = next(iter(prompt_sets.items()))
        rows += sweep_concurrency(
            prompts, set_name=name, levels=concurrency, min_requests=min_requests, t0=t0, **common
        )
    return rows


def run_requests(
    prompts: Sequence[BenchPrompt],
    *,
    engine: BenchEngine,
    tokenizer,
    set_name: str,
    max_new_tokens: int,
    t0: float,
) -> Iterator[dict]:
    """Phase bench: one row per (prompt, turn), one request at a time; each later turn
    carries the target's own earlier answers. `start_s` counts from monotonic time `t0`."""
    for p in prompts:
        messages: list[dict] = []
        for turn, user in enumerate(p.turns, 1):
            messages.append({"role": "user", "content": user})
            start = time.monotonic() - t0
            c = engine.complete(render_prompt(tokenizer, messages), max_new_tokens)
            row = make_row(
                c, engine=engine, set_name=set_name, prompt_id=p.id, turn=turn, start_s=start
            )
            log.info(
                "%s %s turn %d: %d tokens, accept %.2f, %.1f tok/s",
                set_name,
                p.id,
                turn,
                c.completion_tokens,
                row["accept_length"] or 0.0,
                row["tokens_per_s"] or 0.0,
            )
            yield row
            answer = c.text
            if answer is None:
                answer = tokenizer.decode(c.token_ids or [], skip_special_tokens=True)
            messages.append({"role": "assistant", "content": answer})


def sweep_concurrency(
    prompts: Sequence[BenchPrompt],
    *,
    engine: BenchEngine,
    tokenizer,
    set_name: str,
    levels: Sequence[int],
    min_requests: int,
    max_new_tokens: int,
    t0: float,
) -> list[dict]:
    """Phase sweep: per level c, max(c, min_requests) first-turn requests (prompts reused
    round-robin) with c in flight; one row per request."""
    firsts = [
        (p.id, render_prompt(tokenizer, [{"role": "user", "content": p.turns[0]}])) for p in prompts
    ]
    rows: list[dict] = []
    for level in levels:
        batch = [firsts[i % len(firsts)] for i in range(max(level, min_requests))]

        def one(item: tuple[str, list[int]], level: int = level) -> dict:
            start = time.monotonic() - t0
            c = engine.complete(item[1], max_new_tokens)
            return make_row(
                c,
                engine=engine,
                set_name=set_name,
                prompt_id=item[0],
                turn=1,
                start_s=start,
                phase="sweep",
                concurrency=level,
            )

        with ThreadPoolExecutor(max_workers=level) as pool:
            done = list(pool.map(one, batch))
        tps = output_throughput(done) or 0.0
        log.info("%s concurrency %d: %d requests, %.1f tok/s", engine.chain, level, len(done), tps)
        rows += done
    return rows
