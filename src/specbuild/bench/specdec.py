"""Stage `bench`: speculative decoding against a no-spec baseline, one JSONL row per request.

Any bench backend (the PyTorch engine in `bench.hf`, an SGLang server later) implements
`BenchBackend.complete` and nothing else; prompts, turns, timing and the row format are
written once, here. The tables read only these rows, so every backend shows up the same way.

Row schema (one JSON object per request and turn, `results/bench/{set}/{chain}.jsonl`):

  set                    str    benchmark set name (config `bench.sets` key)
  prompt_id              str    the prompt's id in its set
  turn                   int    1-based user turn; turn 2 follows the target's own turn-1 answer
  config                 str    chain "steps-topk-draft_tokens" (e.g. "3-1-4") or "baseline"
  drafter                str    drafter name ("none" for the baseline)
  backend                str    "hf", "sglang", ...
  completion_tokens      int    tokens generated (the first one comes from prefill)
  verify_steps           int    target forwards after prefill that committed tokens
                                (baseline: one per token after the first)
  accept_length          float  tokens committed per verify step, bonus token included:
                                (completion_tokens - 1) / verify_steps; null if verify_steps is 0.
                                The baseline scores exactly 1.0.
  accepted_per_position  list   per draft position k (0-based, length = steps), how many verify
                                steps accepted the k-th drafted token ([] for the baseline)
  wall_s                 float  request wall time, prefill included
  tokens_per_s           float  completion_tokens / wall_s
  ttft_s, itl_s          float  optional: time to first token, mean inter-token latency
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from specbuild.bench.sets import BenchPrompt, read_bench_set, render_prompt
from specbuild.io import write_jsonl

__all__ = [
    "ROW_KEYS",
    "OPTIONAL_ROW_KEYS",
    "BASELINE",
    "ChainSpec",
    "Completion",
    "BenchBackend",
    "acceptance_length",
    "make_row",
    "check_rows",
    "run_requests",
    "make_hf_backend",
    "run_specdec_bench",
]

ROW_KEYS = (
    "set",
    "prompt_id",
    "turn",
    "config",
    "drafter",
    "backend",
    "completion_tokens",
    "verify_steps",
    "accept_length",
    "accepted_per_position",
    "wall_s",
    "tokens_per_s",
)
OPTIONAL_ROW_KEYS = ("ttft_s", "itl_s")
BASELINE = "baseline"  # the `config` of rows decoded without a drafter

log = logging.getLogger("specbuild")


@dataclass(frozen=True)
class ChainSpec:
    """SGLang's --speculative-num-steps / -eagle-topk / -num-draft-tokens, for chain drafting.

    With topk 1 the draft is a chain: `steps` drafter forwards propose `steps` tokens, and the
    verify pass scores them after the last committed token, so num_draft_tokens = steps + 1.
    """

    steps: int
    topk: int
    num_draft_tokens: int

    @classmethod
    def parse(cls, name: str) -> ChainSpec:
        """'3-1-4' -> ChainSpec(3, 1, 4); raises naming the fix for anything but a valid chain."""
        parts = name.split("-")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"chain {name!r}: expected 'steps-topk-draft_tokens', e.g. '3-1-4'")
        spec = cls(*(int(p) for p in parts))
        faults = []
        if spec.steps < 1:
            faults.append("steps must be >= 1")
        if spec.topk != 1:
            faults.append("only topk 1 (chain drafting) is supported by the hf bench engine")
        if spec.num_draft_tokens != spec.steps + 1:
            faults.append(f"with topk 1, draft tokens must be steps + 1 = {spec.steps + 1}")
        if faults:
            raise ValueError(f"chain {name!r}: " + "; ".join(faults))
        return spec

    @property
    def name(self) -> str:
        return f"{self.steps}-{self.topk}-{self.num_draft_tokens}"


@dataclass
class Completion:
    """What a backend reports for one request (token ids exclude the prompt)."""

    token_ids: list[int]
    verify_steps: int
    accepted_per_position: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    ttft_s: float | None = None


@runtime_checkable
class BenchBackend(Protocol):
    name: str  # row `backend`
    config: str  # row `config`: a chain name or "baseline"
    drafter: str  # row `drafter`: "none" for the baseline

    def complete(self, prompt_ids: list[int], max_new_tokens: int) -> Completion:
        """Greedy-decode up to max_new_tokens after prompt_ids (stopping after an EOS token)."""
        ...


def acceptance_length(completion_tokens: int, verify_steps: int) -> float | None:
    """Tokens committed per verify step, bonus token included; the prefill token is not one."""
    if verify_steps <= 0:
        return None
    return (completion_tokens - 1) / verify_steps


def make_row(
    c: Completion, *, set_name: str, prompt_id: str, turn: int, backend: BenchBackend
) -> dict:
    n = len(c.token_ids)
    row = {
        "set": set_name,
        "prompt_id": prompt_id,
        "turn": turn,
        "config": backend.config,
        "drafter": backend.drafter,
        "backend": backend.name,
        "completion_tokens": n,
        "verify_steps": c.verify_steps,
        "accept_length": acceptance_length(n, c.verify_steps),
        "accepted_per_position": list(c.accepted_per_position),
        "wall_s": c.wall_s,
        "tokens_per_s": n / c.wall_s if c.wall_s > 0 else None,
    }
    if c.ttft_s is not None:
        row["ttft_s"] = c.ttft_s
        row["itl_s"] = (c.wall_s - c.ttft_s) / (n - 1) if n > 1 else None
    return row


def check_rows(rows: Sequence[dict], source: str = "rows") -> None:
    """Raise once listing every row that misses a schema key or carries an unknown one."""
    allowed = set(ROW_KEYS) | set(OPTIONAL_ROW_KEYS)
    faults = []
    for i, row in enumerate(rows):
        missing = [k for k in ROW_KEYS if k not in row]
        unknown = sorted(set(row) - allowed)
        if missing or unknown:
            faults.append(f"{source}: row {i}: missing {missing}, unknown {unknown}")
    if faults:
        raise ValueError(
            "bench rows break the schema in bench/specdec.py:\n  " + "\n  ".join(faults)
        )


def run_requests(
    prompts: Sequence[BenchPrompt],
    *,
    backend: BenchBackend,
    tokenizer,
    set_name: str,
    max_new_tokens: int,
) -> Iterator[dict]:
    """One row per (prompt, turn); each later turn carries the target's own earlier answers."""
    for p in prompts:
        messages: list[dict] = []
        for turn, user in enumerate(p.turns, 1):
            messages.append({"role": "user", "content": user})
            ids = render_prompt(tokenizer, messages)
            t0 = time.perf_counter()
            c = backend.complete(ids, max_new_tokens)
            row = make_row(c, set_name=set_name, prompt_id=p.id, turn=turn, backend=backend)
            log.info(
                "%s %s turn %d: %d tokens, accept %.2f, %.1f tok/s (%.1fs)",
                set_name,
                p.id,
                turn,
                row["completion_tokens"],
                row["accept_length"] or 0.0,
                row["tokens_per_s"] or 0.0,
                time.perf_counter() - t0,
            )
            yield row
            answer = tokenizer.decode(c.token_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": answer})


def make_hf_backend(
    *,
    target_dir: str | os.PathLike,
    config: str,
    drafter_dir: str | None,
    drafter_name: str,
    dtype: str,
    device: str,
) -> tuple[BenchBackend, object]:
    """The PyTorch engine (or its baseline) over a materialized target folder, and its tokenizer."""
    from specbuild.bench.hf import HFBaseline, HFSpecDecoder, eos_token_ids, load_drafter
    from specbuild.target import load_target_model, load_tokenizer

    tokenizer = load_tokenizer(target_dir)
    target = load_target_model(target_dir, dtype=dtype, device=device)
    eos = eos_token_ids(target, tokenizer)
    if config == BASELINE:
        return HFBaseline(target, eos_ids=eos), tokenizer
    chain = ChainSpec.parse(config)
    if drafter_dir is None:
        raise ValueError(f"chain {config!r} needs a drafter folder")
    drafter, layer_ids = load_drafter(drafter_dir, target)
    backend = HFSpecDecoder(
        target, drafter, layer_ids=layer_ids, chain=chain, eos_ids=eos, drafter_name=drafter_name
    )
    return backend, tokenizer


def run_specdec_bench(
    *,
    target_dir: str | os.PathLike,
    set_name: str,
    set_spec: dict,
    config: str,
    out: str | os.PathLike,
    drafter_dir: str | None = None,
    drafter_name: str = "none",
    backend: str = "hf",
    max_new_tokens: int = 64,
    dtype: str = "float32",
    device: str = "cpu",
    threads: int = 1,
) -> list[dict]:
    """Bench one set under one config ("baseline" or a chain like "3-1-4"); write its rows.

    `set_spec` is the set's config entry: path, format, key, id_key, limit, turns.
    """
    import torch

    if backend != "hf":
        raise ValueError(f"bench.backend {backend!r}: only 'hf' runs inside a job (sglang: later)")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(threads)
    prompts = read_bench_set(set_spec)
    engine, tokenizer = make_hf_backend(
        target_dir=target_dir,
        config=config,
        drafter_dir=drafter_dir,
        drafter_name=drafter_name if config != BASELINE else "none",
        dtype=dtype,
        device=device,
    )
    log.info("bench %s / %s: %d prompts on %s (%s)", set_name, config, len(prompts), device, dtype)
    # Warm up once, unrecorded: the first forward pays one-off allocation and kernel setup.
    engine.complete(render_prompt(tokenizer, [{"role": "user", "content": "Hi"}]), 4)
    rows = list(
        run_requests(
            prompts,
            backend=engine,
            tokenizer=tokenizer,
            set_name=set_name,
            max_new_tokens=max_new_tokens,
        )
    )
    check_rows(rows, source=str(out))
    write_jsonl(out, rows)
    return rows
