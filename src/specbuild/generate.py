"""Stage `generate`: regenerate the assistant turns of a samples shard with the target.

The drafter learns to predict the target's own output, so responses come from the serving
target (any backend). Every row records finish_reason, reasoning, usage and which backend,
model and target fingerprint produced it; `keep` mode reuses assistant turns already in the
samples (earlier inference from the same target) and marks where each response came from.

No single record takes a shard down: when the backend raises on a batch, each of its requests
is tried alone, and one that still fails is rejected with the error as its reason.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import torch

from specbuild.backends.base import (
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)
from specbuild.io import read_jsonl
from specbuild.rejects import publish_shard
from specbuild.samples import split_prompt
from specbuild.target import read_target_info

__all__ = ["generate_shard", "generate_each", "split_prompt"]

MODES = ("regenerate", "keep")
ERROR_CHARS = 500  # of an exception's text kept as a reject reason
log = logging.getLogger("specbuild")


def _raised(err: Exception) -> str:
    text = str(err)
    text = text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + "..."
    return f"backend raised {type(err).__name__}: {text}"


def generate_each(
    engine: GenerationBackend, batch: list[GenerationRequest], sampling: SamplingParams
) -> list[Generation | str]:
    """One Generation per request of `batch`, or, for a request the backend raised on even
    alone, the reason. A whole batch is tried first; only a failing one is split."""
    try:
        return list(engine.generate(batch, sampling))
    except Exception as err:  # a record's failure must not take the shard down
        if len(batch) == 1:
            log.warning("request %s failed: %s", batch[0].id, _raised(err))
            return [_raised(err)]
        log.warning("a batch of %d failed (%s); trying each request alone", len(batch), err)
    _free_accelerator_memory()
    out: list[Generation | str] = []
    for req in batch:
        out += generate_each(engine, [req], sampling)
        _free_accelerator_memory()
    return out


def _free_accelerator_memory() -> None:
    # What a failed allocation left cached would fail the next request too.
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def generate_shard(
    *,
    samples: str | os.PathLike,
    fingerprint: str | os.PathLike,
    out: str | os.PathLike,
    rejected: str | os.PathLike,
    counts: str | os.PathLike,
    backend: Callable[[], GenerationBackend],
    mode: str,
    sampling: SamplingParams,
    batch_size: int,
) -> tuple[int, int]:
    """Write one generated row per sample of `samples`; failures go to `rejected`, the numbers
    to `counts`.

    `backend` is a constructor, called only if some sample needs the model (keep mode may not).
    """
    if mode not in MODES:
        raise ValueError(f"generate.mode {mode!r}: allowed {', '.join(MODES)}")
    target = read_target_info(fingerprint)
    rows = list(read_jsonl(samples))
    kept: dict[str, dict] = {}
    todo: list[GenerationRequest] = []
    for row in rows:
        prompt, answer = split_prompt(row["messages"])
        if mode == "keep" and answer is not None:
            kept[row["id"]] = {
                "messages": prompt + [answer],
                "finish_reason": "stop",
                "usage": None,
                "response_source": "dataset",
            }
        else:
            todo.append(GenerationRequest(id=row["id"], messages=prompt))
    log.info(
        "generate %s: %d samples, %d kept from the dataset, %d to generate",
        samples,
        len(rows),
        len(kept),
        len(todo),
    )

    made: dict[str, dict] = {}
    bad: list[dict] = []
    if todo:
        torch.manual_seed(sampling.seed)
        engine = backend()
        try:
            t0, n_tok = time.perf_counter(), 0
            for b in range(0, len(todo), batch_size):
                batch = todo[b : b + batch_size]
                for req, gen in zip(batch, generate_each(engine, batch, sampling), strict=True):
                    if isinstance(gen, str):
                        bad.append({"id": req.id, "reason": gen})
                        continue
                    if gen.finish_reason not in ("stop", "length"):
                        bad.append(
                            {
                                "id": req.id,
                                "reason": "backend error: "
                                + str(gen.extra.get("error", gen.finish_reason)),
                            }
                        )
                        continue
                    answer = {"role": "assistant", "content": gen.content}
                    if gen.reasoning:
                        answer["reasoning_content"] = gen.reasoning
                    made[req.id] = {
                        "messages": req.messages + [answer],
                        "finish_reason": gen.finish_reason,
                        "usage": {
                            "prompt_tokens": gen.prompt_tokens,
                            "completion_tokens": gen.completion_tokens,
                        },
                        "response_source": "generated",
                    }
                    n_tok += gen.completion_tokens
                dt = time.perf_counter() - t0
                log.info(
                    "generate: %d/%d done, %d tokens, %.1f tok/s",
                    min(b + batch_size, len(todo)),
                    len(todo),
                    n_tok,
                    n_tok / max(dt, 1e-9),
                )
            producer = {"backend": engine.name, "model": engine.model}
        finally:
            engine.close()
    else:
        producer = {"backend": None, "model": None}

    def rows_out():
        for row in rows:
            res = kept.get(row["id"]) or made.get(row["id"])
            if res is None:
                continue
            src = (
                producer
                if res["response_source"] == "generated"
                else {"backend": None, "model": None}
            )
            yield {"id": row["id"], **res, **src, "target_fingerprint": target.fingerprint}

    n = publish_shard(
        out=out,
        rows=rows_out(),
        rejected=rejected,
        counts=counts,
        bad=bad,
        n_in=len(rows),
        label=f"generate {samples}",
    )
    return n, len(bad)
