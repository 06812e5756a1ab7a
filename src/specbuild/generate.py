"""Stage `generate`: regenerate the assistant turns of a samples shard with the target.

The drafter learns to predict the target's own output, so responses come from the serving
target (any backend). Every row records finish_reason, reasoning, usage and which backend,
model and target fingerprint produced it.

`regenerate` answers every assistant turn of a conversation anew, in order, each on the
target's own earlier answers, as a served conversation goes: the dataset's assistant text is
dropped, and its other turns (system, user, tool) are kept where they were. A tool result after
an assistant turn rejects the conversation: that turn was the call, which the target, answering
without the tools, cannot make again. A run of assistant
turns is one answer; a conversation ending on a user turn gets a last answer after it. So every
assistant turn of a generated row is the target's, and `tokenize` trains on all of them. Cost:
N requests for a conversation of N answers, sequential within it and batched across the
shard's conversations (round k sends the k-th answer of every conversation that has one). A
conversation ends early, keeping the answers it has, when an answer stops at max_new_tokens
(the next user turn would follow an answer the target never finished) or fails after the
first; the log counts each reason. A failed first answer rejects the sample, as does a
conversation whose first assistant turn comes before any user turn (`samples` drops such a
turn; nothing would be answered).

`keep` reuses a conversation whose last turn is an assistant turn as it is (earlier inference
from the same target), every assistant turn included, and marks it `response_source:
dataset`; a conversation ending on a user turn gets one answer after the dataset's turns.
`tokenize` trains on every assistant turn, so under `keep` the dataset's own turns are trained
on: use it only for text the target wrote.

Self-written conversations (`synthesize.turns` > 1) go on for more turns in the same job: the
target writes each follow-up user turn itself and answers it (`generate_shard`).

`answers` > 1 answers each prompt several times, each answer a conversation and sample of its
own (`answer_copies`): sampled at a temperature, one prompt yields several target-written
answers.

No single record takes a shard down: when the backend raises on a batch, each of its requests
is tried alone, and one that still fails is rejected with the error as its reason.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

from specbuild.backends.base import (
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)
from specbuild.backends.user_turn import follow_up_seed, open_user_turn, written_user_turn
from specbuild.eagle.special_text import special_text_fault
from specbuild.eagle.target_info import load_tokenizer, read_target_info
from specbuild.engines.http import EngineUnavailable
from specbuild.infra.disk import ensure_free_space, generate_need
from specbuild.infra.io import read_jsonl
from specbuild.infra.near_dup import find_near_duplicates
from specbuild.rejects import ShardFiles, error_text, publish_shard
from specbuild.samples import ANSWER_SEPARATOR, split_prompt

__all__ = [
    "AnswerRounds",
    "answer_copies",
    "answer_ids",
    "output_ids",
    "GenerateSettings",
    "GenerationPlan",
    "generate_shard",
    "generate_each",
    "plan_generation",
    "split_prompt",
    "answer_contexts",
    "most_new_tokens",
]

MODES = ("regenerate", "keep")
log = logging.getLogger("specbuild")


def _raised(err: Exception) -> str:
    return f"backend raised {error_text(err)}"


def generate_each(
    engine: GenerationBackend, batch: list[GenerationRequest], sampling: SamplingParams
) -> list[Generation | str]:
    """One Generation per request of `batch`, or, for a request the backend raised on even
    alone, the reason. A whole batch is tried first; only a failing one is split."""
    try:
        return list(engine.generate(batch, sampling))
    except EngineUnavailable:
        raise  # the engine, not this batch: fail the job, publish nothing
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


def _run(
    engine: GenerationBackend,
    requests: list[GenerationRequest],
    sampling: SamplingParams,
    batch_size: int,
    what: str,
) -> Iterator[tuple[GenerationRequest, Generation | str]]:
    """Every request with its Generation (or failure reason), batch by batch, logging progress."""
    t0, n_tok = time.perf_counter(), 0
    for b in range(0, len(requests), batch_size):
        batch = requests[b : b + batch_size]
        for req, gen in zip(batch, generate_each(engine, batch, sampling), strict=True):
            n_tok += 0 if isinstance(gen, str) else gen.completion_tokens
            yield req, gen
        log.info(
            "%s: %d/%d done, %d tokens, %.1f tok/s",
            what,
            min(b + batch_size, len(requests)),
            len(requests),
            n_tok,
            n_tok / max(time.perf_counter() - t0, 1e-9),
        )


def _answer_failure(gen: Generation | str) -> str | None:
    if isinstance(gen, str):
        return gen
    if gen.finish_reason not in ("stop", "length"):
        return "backend error: " + str(gen.extra.get("error", gen.finish_reason))
    if not gen.content.strip() and not gen.reasoning:
        return "empty answer: the target wrote nothing to learn from"
    return None


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"generate.mode {mode!r}: allowed {', '.join(MODES)}")


def _check_settings(s: GenerateSettings) -> None:
    """Raise for settings no shard can be generated with (the config checks name the keys)."""
    _check_mode(s.mode)
    if s.turns > 1 and s.follow_up is None:
        raise ValueError(f"turns {s.turns} needs the follow-up sampling (synthesize settings)")
    if s.answers < 1:
        raise ValueError(f"answers {s.answers}: at least 1")
    if s.answers > 1 and (s.mode != "regenerate" or s.sampling.temperature == 0):
        # greedy answers would be one answer n times; keep reuses the dataset's one answer
        raise ValueError(
            f"answers {s.answers} needs mode regenerate and a temperature > 0 (got mode "
            f"{s.mode}, temperature {s.sampling.temperature})"
        )


def answer_contexts(messages: list[dict]) -> list[list[dict]]:
    """The turns the target answers, in order, with the dataset's assistant text dropped: the
    turns before each run of assistant turns, and the turns after the last run when the
    conversation ends on them. A conversation is rebuilt as context 1, answer 1, context 2,
    answer 2, ..."""
    contexts, current = [], []
    for m in messages:
        if m["role"] != "assistant":
            current.append(m)
        elif current:
            contexts.append(current)
            current = []
    if current:
        contexts.append(current)
    return contexts


def most_new_tokens(
    rows: list[dict], *, mode: str, turns: int, answer_tokens: int, follow_up_tokens: int
) -> int:
    """The most tokens a shard's rows can gain: every answer at `answer_tokens` (under
    regenerate one per assistant turn, `answer_contexts`; else at most the one a conversation
    ending on a user turn needs) and, for `turns` > 1, each written follow-up turn and its
    answer."""
    per_row = (turns - 1) * (answer_tokens + follow_up_tokens)
    answers = sum(
        max(1, len(answer_contexts(r["messages"]))) if mode == "regenerate" else 1 for r in rows
    )
    return len(rows) * per_row + answers * answer_tokens


def _n_answers(messages: list[dict]) -> int:
    return sum(m["role"] == "assistant" for m in messages)


def _follow_ups(
    engine: GenerationBackend,
    tokenizer,
    conversations: dict[str, list[dict]],
    *,
    sampling: SamplingParams,
    batch_size: int,
) -> tuple[list[GenerationRequest], Counter]:
    """The next user turn of each conversation (turn = its answers + 1), written by the target
    (see specbuild.backends.user_turn), as the requests that answer it; and why the other
    conversations end here."""
    turn = {cid: _n_answers(msgs) + 1 for cid, msgs in conversations.items()}
    requests = [
        GenerationRequest(
            id=cid,
            # token ids, not text: a server would put its BOS before the template's own
            prompt=tokenizer(open_user_turn(tokenizer, msgs), add_special_tokens=False)[
                "input_ids"
            ],
            seed=follow_up_seed(sampling.seed, cid, turn[cid]),
        )
        for cid, msgs in conversations.items()
    ]
    answers: list[GenerationRequest] = []
    ended: Counter = Counter()
    what = "user turn " + "/".join(map(str, sorted(set(turn.values()))))
    for req, gen in _run(engine, requests, sampling, batch_size, what):
        text, reason = (
            ("", gen) if isinstance(gen, str) else written_user_turn(gen, sampling.max_new_tokens)
        )
        if reason is not None:
            ended[f"user turn {turn[req.id]}: {reason}"] += 1
            continue
        user = {"role": "user", "content": text}
        if special_text_fault(tokenizer, [user]):
            ended[f"user turn {turn[req.id]}: written with a special token as text"] += 1
            continue
        answers.append(GenerationRequest(id=req.id, messages=conversations[req.id] + [user]))
    return answers, ended


@dataclass(frozen=True)
class GenerateSettings:
    """How a shard's answers are made (the generate rule's params)."""

    mode: str  # regenerate | keep (module docstring)
    sampling: SamplingParams
    batch_size: int
    turns: int = 1  # answers per self-written conversation (synthesize.turns)
    follow_up: SamplingParams | None = None  # how the target writes a follow-up user turn
    near_duplicate_threshold: float | None = None  # Jaccard; None: no near-duplicate check
    answers: int = 1  # per prompt, each a sample of its own (`answer_copies`)


@dataclass(frozen=True)
class GenerationPlan:
    """What a shard asks of the target, decided before any model loads.

    `kept`: rows reused as they are (keep mode), by id. `first`: each conversation's first
    request. `later`: per conversation, the contexts answered after its first answer, in order
    (regenerate mode, `answer_contexts`). `bad`: the samples rejected before any answer.
    """

    kept: Mapping[str, dict]
    first: tuple[GenerationRequest, ...]
    later: Mapping[str, tuple[list[dict], ...]]
    bad: tuple[dict, ...]

    @property
    def n_answers(self) -> int:
        return len(self.first) + sum(map(len, self.later.values()))


def plan_generation(
    rows: Sequence[dict],
    *,
    mode: str,
    duplicates: Mapping[str, str],
    special_fault: Callable[[list[dict]], str | None],
) -> GenerationPlan:
    """The plan of a shard's `rows`: `duplicates` (id -> reason) are rejected first, then each
    row whose messages `special_fault` names (a special token written as text), or which
    regenerate cannot answer (an assistant turn before any user turn, a tool result after an
    assistant turn); the rest are kept (keep mode, a finished conversation) or asked."""
    _check_mode(mode)
    bad = [{"id": row_id, "reason": reason} for row_id, reason in duplicates.items()]
    kept: dict[str, dict] = {}
    first: list[GenerationRequest] = []
    later: dict[str, tuple[list[dict], ...]] = {}
    for row in rows:
        if row["id"] in duplicates:
            continue
        # samples checks its records; a self-written prompt (synthesize) is checked here
        forged = special_fault(row["messages"])
        if forged:
            bad.append({"id": row["id"], "reason": forged})
            continue
        prompt, answer = split_prompt(row["messages"])
        if mode == "keep":
            if answer is not None:
                kept[row["id"]] = {
                    "messages": prompt + [answer],
                    "finish_reason": "stop",
                    "usage": None,
                    "response_source": "dataset",
                }
            else:
                first.append(GenerationRequest(id=row["id"], messages=prompt))
            continue
        roles = [m["role"] for m in row["messages"]]
        if "assistant" in roles[: roles.index("user") if "user" in roles else len(roles)]:
            bad.append(
                {
                    "id": row["id"],
                    "reason": "an assistant turn before any user turn answers nothing; "
                    "rerun samples (which drops it)",
                }
            )
            continue
        after_answer = roles[roles.index("assistant") + 1 :] if "assistant" in roles else []
        if "tool" in after_answer:
            # the assistant turn before a tool result is its call: answered anew it is plain
            # text, and the result would follow a call the target never made
            bad.append(
                {
                    "id": row["id"],
                    "reason": "a tool result after an assistant turn: regenerate cannot make "
                    "the call it answers (generate.mode keep takes text the target wrote)",
                }
            )
            continue
        context, *rest = answer_contexts(row["messages"])
        first.append(GenerationRequest(id=row["id"], messages=context))
        later[row["id"]] = tuple(rest)
    return GenerationPlan(kept=kept, first=tuple(first), later=later, bad=tuple(bad))


def answer_ids(sample_id: str, n: int) -> list[str]:
    """The ids of a sample's `n` answers: its own, then `<id>~1` .. `<id>~<n-1>`."""
    return [sample_id] + [f"{sample_id}{ANSWER_SEPARATOR}{k}" for k in range(1, n)]


def output_ids(samples: str | os.PathLike, rows: Sequence[dict], n: int) -> list[str]:
    """The id of every row the shard `samples` (its `rows`, `n` answers each) can publish, in
    order. Raises naming the shard and the ids where two rows would share one: answers are
    made and kept by id, so one would silently replace the other. Only a shard `samples` did
    not write as it does now can hold such ids (a repeated id, or one holding
    ANSWER_SEPARATOR: `q~1` beside `q`, which has an answer `q~1`)."""
    ids = [(cid, row["id"], k) for row in rows for k, cid in enumerate(answer_ids(row["id"], n))]
    owners: dict[str, list[str]] = {}
    for cid, sid, k in ids:
        owners.setdefault(cid, []).append(f"answer {k} of {sid!r}" if k else f"sample {sid!r}")
    shared = {cid: who for cid, who in owners.items() if len(who) > 1}
    if shared:
        named = "; ".join(f"{cid!r}: {' and '.join(who)}" for cid, who in list(shared.items())[:5])
        raise ValueError(
            f"{samples}: {len(shared)} id(s) would each name two rows ({named}); sample ids "
            f"must be unique and hold no {ANSWER_SEPARATOR!r}: delete this samples shard and "
            "rerun, so that samples rejects the record with the reason"
        )
    return [cid for cid, _, _ in ids]


def answer_copies(plan: GenerationPlan, n: int, seed: int) -> GenerationPlan:
    """`plan` with each sample answered `n` times, answer k a conversation of its own with id
    `answer_ids(id, n)[k]`. Answer 0 keeps its request as it is (the shard's `seed`: one answer
    is sampled as before); answer k >= 1 is seeded `seed + k`. A sample rejected before any
    answer is rejected once per answer, so in (rows x n) = kept + rejected still holds."""
    if n == 1:
        return plan
    if plan.kept:
        raise ValueError(f"answers {n}: keep mode reuses the dataset's one answer")
    first = tuple(
        replace(req, id=cid, seed=req.seed if k == 0 else seed + k)
        for req in plan.first
        for k, cid in enumerate(answer_ids(req.id, n))
    )
    later = {cid: rest for sid, rest in plan.later.items() for cid in answer_ids(sid, n)}
    bad = tuple({**b, "id": cid} for b in plan.bad for cid in answer_ids(b["id"], n))
    return GenerationPlan(kept=plan.kept, first=first, later=later, bad=bad)


class AnswerRounds:
    """The answering loop of one shard on one engine: round k sends the k-th answer of every
    conversation that has one, then asks the target for the follow-up user turns of those
    answered to the end with turns to go. Fills `made` (each conversation so far, by id),
    `bad` (samples whose first answer failed) and `ended` (why conversations ended early)."""

    def __init__(
        self,
        engine: GenerationBackend,
        tokenizer,
        settings: GenerateSettings,
        later: Mapping[str, Sequence[list[dict]]],
    ) -> None:
        self.engine, self.tokenizer, self.settings = engine, tokenizer, settings
        self.rest = {cid: list(contexts) for cid, contexts in later.items()}  # still to answer
        self.made: dict[str, dict] = {}
        self.bad: list[dict] = []
        self.ended: Counter = Counter()

    def run(self, first: Sequence[GenerationRequest], *, multi: bool) -> None:
        """Answer `first`, then every answer and follow-up they lead to."""
        pending, round_ = list(first), 0
        while pending:
            round_ += 1
            pending = self._round(pending, f"generate answer {round_}" if multi else "generate")

    def _round(self, pending: list[GenerationRequest], what: str) -> list[GenerationRequest]:
        s, made, rest = self.settings, self.made, self.rest
        follow: dict[str, list[dict]] = {}  # answered to the end: the target goes on
        seeds: dict[str, int | None] = {}  # of the conversations in `follow`
        after: list[GenerationRequest] = []
        for req, gen in _run(self.engine, pending, s.sampling, s.batch_size, what):
            n = _n_answers(req.messages) + 1
            more = bool(rest.get(req.id)) or n < s.turns
            reason = _answer_failure(gen)
            if reason is None:
                answer = {"role": "assistant", "content": gen.content}
                if gen.reasoning:
                    answer["reasoning_content"] = gen.reasoning
                # the next turn would carry it back to the target as chat structure
                forged = special_text_fault(self.tokenizer, [answer])
                reason = forged and "the target's answer holds a special token as text"
            if reason:
                if req.id not in made:
                    self.bad.append({"id": req.id, "reason": reason})
                else:  # the conversation keeps its earlier answers
                    self.ended[f"answer {n}: {reason}"] += 1
                continue
            usage = (made.get(req.id) or {}).get("usage") or {}
            made[req.id] = {
                "messages": req.messages + [answer],
                "finish_reason": gen.finish_reason,
                "usage": {
                    "prompt_tokens": usage.get("prompt_tokens", 0) + gen.prompt_tokens,
                    "completion_tokens": usage.get("completion_tokens", 0) + gen.completion_tokens,
                },
                "response_source": "generated",
            }
            if gen.finish_reason != "stop":
                if more:
                    self.ended[f"answer {n}: stopped at max_new_tokens"] += 1
            elif rest.get(req.id):
                context = made[req.id]["messages"] + rest[req.id].pop(0)
                after.append(GenerationRequest(id=req.id, messages=context, seed=req.seed))
            elif n < s.turns:
                follow[req.id], seeds[req.id] = made[req.id]["messages"], req.seed
        if follow:
            asked, why = _follow_ups(
                self.engine,
                self.tokenizer,
                follow,
                sampling=s.follow_up,
                batch_size=s.batch_size,
            )
            # each answer of a conversation is sampled with its seed (`answer_copies`)
            after += [replace(r, seed=seeds[r.id]) for r in asked]
            self.ended += why
        return after


def generate_shard(
    *,
    samples: str | os.PathLike,
    fingerprint: str | os.PathLike,
    files: ShardFiles,
    backend: Callable[[], GenerationBackend],
    settings: GenerateSettings,
    earlier: Sequence[str | os.PathLike] = (),
) -> tuple[int, int]:
    """Write one generated row per sample of `samples`; failures go to `files.rejected`, the
    numbers to `files.counts`.

    `backend` is a constructor, called only if some sample needs the model (keep mode may not).
    `settings.mode`: `regenerate` answers every assistant turn anew, `keep` reuses finished
    conversations (module docstring).

    `settings.turns` > 1 (self-written conversations, `synthesize.turns`): after the target
    answers, it writes the next user turn itself with `settings.follow_up` sampling (the open
    user turn of `specbuild.backends.user_turn`, continued on the conversation so far) and answers
    that, until each generated conversation has `turns` answers, in this one job through the same
    backend. A conversation ends early, keeping every turn it has, when an answer stops at
    max_new_tokens (a follow-up would build on an answer the target never finished) or a
    follow-up is not written (unfinished, empty, the backend failed); the log counts each
    reason. Only a failed first answer rejects the sample. `finish_reason` is the last
    answer's, `usage` the sum.

    `settings.near_duplicate_threshold` (None: off) rejects, before any answer is generated,
    each sample whose prompt is a near-duplicate of an earlier kept one of its dataset: in the
    `earlier` samples shards (every shard before this one, in order) or earlier in this shard
    (`specbuild.infra.near_dup`).

    `settings.answers` > 1 answers each sample that many times (`answer_copies`: ids `<id>`,
    `<id>~1`, ..., each seeded apart), after the near-duplicate check, so a prompt's answers
    are never rejected as each other's duplicates. Rows keep input order, a sample's answers
    together; each answer counts as a sample (in = rows x answers = kept + rejected). A shard
    where two rows would share an id fails before any answer is made (`output_ids`).
    """
    s = settings
    _check_settings(s)
    target = read_target_info(fingerprint)
    rows = list(read_jsonl(samples))
    ids = output_ids(samples, rows, s.answers)  # before any answer is paid for
    ensure_free_space(
        files.out,
        generate_need(
            samples=samples,
            new_tokens=most_new_tokens(
                rows,
                mode=s.mode,
                turns=s.turns,
                answer_tokens=s.sampling.max_new_tokens,
                follow_up_tokens=s.follow_up.max_new_tokens if s.follow_up is not None else 0,
            ),
            copies=s.answers,
        ),
        "a generated shard",
        hint="lower generate.max_new_tokens",
    )
    tokenizer = load_tokenizer(Path(fingerprint).parent)
    dups: dict[str, str] = {}
    if s.near_duplicate_threshold is not None:
        dups, n_earlier = find_near_duplicates(earlier, rows, s.near_duplicate_threshold)
        log.info(
            "near-duplicates: %d of %d prompts (Jaccard >= %g), against %d kept prompts of %d "
            "earlier shard(s) and the shard itself",
            len(dups),
            len(rows),
            s.near_duplicate_threshold,
            n_earlier,
            len(earlier),
        )
    # copied after the near-duplicate check: a prompt's answers are never each other's duplicates
    plan = answer_copies(
        plan_generation(
            rows, mode=s.mode, duplicates=dups, special_fault=partial(special_text_fault, tokenizer)
        ),
        s.answers,
        s.sampling.seed,
    )
    multi = s.turns > 1 or plan.n_answers > len(plan.first)
    each = [f"{s.answers} answers per prompt"] if s.answers > 1 else []
    each += [f"{s.turns} turns each"] if s.turns > 1 else []
    log.info(
        "generate %s: %d samples, %d kept from the dataset, %d to generate (%d answers%s)",
        samples,
        len(rows),
        len(plan.kept),
        len(plan.first),
        plan.n_answers,
        "".join(", " + e for e in each),
    )

    made: dict[str, dict] = {}
    bad = list(plan.bad)
    if plan.first:
        torch.manual_seed(s.sampling.seed)
        engine = backend()
        try:
            rounds = AnswerRounds(engine, tokenizer, s, plan.later)
            rounds.run(plan.first, multi=multi)
            producer = {"backend": engine.name, "model": engine.model}
        finally:
            engine.close()
        made, ended = rounds.made, rounds.ended
        bad += rounds.bad
    else:
        producer, ended = {"backend": None, "model": None}, Counter()
    if multi:
        answers = Counter(_n_answers(r["messages"]) for r in made.values())
        log.info(
            "conversations by answers: %s; ended early: %s",
            ", ".join(f"{n} answers: {c}" for n, c in sorted(answers.items())) or "none",
            ", ".join(f"{why}: {c}" for why, c in sorted(ended.items())) or "none",
        )

    def rows_out():
        for cid in ids:
            res = plan.kept.get(cid) or made.get(cid)
            if res is None:
                continue
            src = (
                producer
                if res["response_source"] == "generated"
                else {"backend": None, "model": None}
            )
            yield {"id": cid, **res, **src, "target_fingerprint": target.fingerprint}

    n = publish_shard(
        files,
        rows=rows_out(),
        bad=bad,
        n_in=len(rows) * s.answers,  # every answer is a sample, kept or rejected
        label=f"generate {samples}",
    )
    return n, len(bad)
