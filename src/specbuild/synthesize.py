"""Helper stage `synthesize`: user prompts written by the target itself (Magpie-style).

A drafter learns to predict the target wherever the target will be served; trained only on
GSM8K answers it drafts math well and everything else badly. Prompts the target writes itself
cover what the target is used for, and need no data beyond the model: render the chat
template up to an open user turn (system prompt and user header, nothing after), let the target
continue at temperature 1, and keep what it writes up to its end-of-turn as the user message.
The `generate` stage then answers these prompts like any other.

Left alone, a small target writes mostly one kind of prompt (SmolLM2-135M: 59% of 20,247
open "Can you" or "I'm", asking for help or advice), so a drafter trained on them sees few
instructions to write, role-play, extract or code. `openers` start prompt i with
openers[i % n] (a word or two, e.g. "Write", "Imagine you are") for the target to continue:
the kind of request is steered, its content is still the target's own.

Each shard is a fixed slice of prompt indices; request i is seeded with `seed + i` where the
backend seeds per request (SGLang, OpenAI-compatible) and per batch otherwise (hf), so growing
`count` adds shards and leaves earlier ones as they were. Prompts that do not end within
`max_tokens`, come back empty or repeat an earlier one in the shard are rejected with a
reason; counts add up (in = kept + rejected).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from specbuild.backends.base import GenerationBackend, GenerationRequest, SamplingParams
from specbuild.backends.user_turn import open_user_turn, written_user_turn
from specbuild.eagle.target_info import load_tokenizer, read_target_info
from specbuild.generate import generate_each
from specbuild.rejects import ShardFiles, publish_shard

__all__ = ["PromptWriting", "open_user_turn", "synthesize_shard"]

log = logging.getLogger("specbuild")


@dataclass(frozen=True)
class PromptWriting:
    """How the target writes a dataset's prompts: its sampling, and the openers prompt i starts
    with (openers[i % n]; none: it writes freely)."""

    sampling: SamplingParams
    openers: tuple[str, ...] = ()

    @classmethod
    def from_param(cls, fields: Mapping) -> PromptWriting:
        """From the rule's `sampling` param: SamplingParams' fields, with `openers` folded in
        when the dataset has some (workflow/datasets.py's synthesize_sampling)."""
        fields = dict(fields)
        openers = tuple(fields.pop("openers", ()))
        return cls(SamplingParams(**fields), openers)


def synthesize_shard(
    *,
    fingerprint: str | os.PathLike,
    files: ShardFiles,
    dataset: str,
    start: int,
    stop: int,
    backend: Callable[[], GenerationBackend],
    writing: PromptWriting,
    batch_size: int,
) -> tuple[int, int]:
    """Write the self-written prompts [start, stop) of `dataset` as a samples shard, with the
    target whose `fingerprint` (in the target's folder) is given.

    Rows look like the `samples` stage's (`id`, `messages` with one user turn, `source`), so
    every later stage treats them alike. Prompt i starts with `writing`'s openers[i % n] when
    there are any (the kept text begins with it). Returns (kept, rejected).
    """
    sampling, openers = writing.sampling, writing.openers
    if stop <= start:
        raise ValueError(f"{dataset}: empty prompt range [{start}, {stop})")
    target = read_target_info(fingerprint)
    tokenizer = load_tokenizer(Path(fingerprint).parent)
    # Token ids, not text: a server would tokenize the rendered text with its BOS in front
    # of the template's own (Llama 3), and the prompts would open on a context never served.
    # The opener is tokenized with the turn's start, as the served template tokenizes a
    # message that begins with it.
    turn = open_user_turn(tokenizer)
    starts = list(openers) or [""]
    prefixes = [tokenizer(turn + o, add_special_tokens=False)["input_ids"] for o in starts]
    opener_of = {f"{dataset}-{i:07d}": starts[i % len(starts)] for i in range(start, stop)}
    requests = [
        GenerationRequest(
            id=f"{dataset}-{i:07d}", prompt=prefixes[i % len(starts)], seed=sampling.seed + i
        )
        for i in range(start, stop)
    ]
    log.info(
        "synthesize %s [%d, %d): %d prompts, temperature %g, at most %d tokens each, %s",
        dataset,
        start,
        stop,
        len(requests),
        sampling.temperature,
        sampling.max_new_tokens,
        f"{len(openers)} openers" if openers else "no openers",
    )
    kept: list[dict] = []
    bad: list[dict] = []
    seen: dict[str, str] = {}
    engine = backend()
    try:
        for b in range(0, len(requests), batch_size):
            batch = requests[b : b + batch_size]
            for req, gen in zip(batch, generate_each(engine, batch, sampling), strict=True):
                if isinstance(gen, str):  # the backend raised on this request alone
                    bad.append({"id": req.id, "reason": gen, "text": ""})
                    continue
                opener = opener_of[req.id]
                text, reason = written_user_turn(gen, sampling.max_new_tokens, opener)
                if reason is None and text in seen:
                    reason = f"repeats {seen[text]}"
                if reason is None:
                    seen[text] = req.id
                    source = {"synthesized_by": engine.name, "model": engine.model}
                    source.update(seed=req.seed, target_fingerprint=target.fingerprint)
                    if opener:
                        source["opener"] = opener
                    kept.append(
                        {
                            "id": req.id,
                            "messages": [{"role": "user", "content": text}],
                            "source": source,
                        }
                    )
                    continue
                bad.append({"id": req.id, "reason": reason, "text": gen.content[:2000]})
            log.info(
                "synthesize: %d/%d done, %d kept",
                min(b + batch_size, len(requests)),
                len(requests),
                len(kept),
            )
    finally:
        engine.close()
    publish_shard(
        files,
        rows=kept,
        bad=bad,
        n_in=len(requests),
        label=f"synthesize {files.out}",
    )
    return len(kept), len(bad)
