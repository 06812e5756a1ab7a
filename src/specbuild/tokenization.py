"""Stage `tokenize`: render conversations with the target's own chat template and mark the
tokens the drafter learns from.

`loss_mask` is 1 exactly on assistant tokens: the response text and the template's end-of-turn
token, never the role header or the newline after end-of-turn. Spans are found by rendering
each conversation prefix with the same template. Every assistant turn of a generated row is
trained on (`generate` decides whose text they are: all the target's with `regenerate`, the
dataset's with `keep`).

Each assistant turn is trained on as the target sees it when served: the prefix the template
renders when that turn is the one being answered. Most templates render a conversation's
prefixes as prefixes of the whole, and the conversation is one row with every turn masked.
Reasoning templates (Qwen3, DeepSeek-R1, Kimi-K2.5) drop the `reasoning_content` of earlier
assistant turns once a later user turn follows, so the whole conversation is no longer what the
target saw at turn k; found by rendering (the prefix through turn k is not a prefix of the
whole), never by the model's name. Such a conversation becomes one row per assistant turn
(id `<id>#<k>`, k = 1, 2, ...), each rendered through its own turn and masked on it alone.
A row per turn is the simplest exact answer: one token sequence cannot hold two different
prefixes, so a single row with a mask per turn would train some turn on a prefix the target
never sees. Its cost: turn k repeats the k-1 turns before it, so a conversation of N turns
takes about N/2 times its own tokens (and hidden-state bytes); conversations without reasoning
stay one row.

An overlong row (`truncate`) drops its oldest exchanges first (a user turn and what follows it
up to the next user turn, whole, after the system prompt) until it fits, so the last answer
stays; only when its last exchange alone is too long is its end cut. The meta counts the rows
truncated and the turns dropped. Reasoning tokens (`reasoning_tokens` in the meta: loss tokens
inside a trained turn's reasoning text) are counted beside the response tokens.

No single record stops a shard: a record that cannot be rendered or tokenized (its template
raises, no assistant turn, too long under `drop`, one of the target's special tokens typed as
text in any message: `specbuild.eagle.special_text`) is rejected with its id and the reason; a
record is kept when all its rows are, so counts are records (in = kept + rejected) and `rows`
in the meta says how many rows they made.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field

from specbuild.eagle.special_text import special_text_fault
from specbuild.eagle.target_info import load_tokenizer, read_target_info
from specbuild.infra.disk import ensure_free_space, tokenize_need
from specbuild.infra.io import read_jsonl, write_json
from specbuild.rejects import ShardFiles, error_text, publish_shard

__all__ = [
    "ROW_KEYS",
    "META_TOTALS",
    "RowRejected",
    "render_chat",
    "assistant_char_spans",
    "drops_earlier_reasoning",
    "tokenize_conversation",
    "tokenize_shard",
]

ROW_KEYS = (
    "id",
    "input_ids",
    "loss_mask",
    "seq_len",
    "n_prompt_tokens",
    "n_response_tokens",
    "has_reasoning",
    "finish_reason",
)
# Per-shard totals of the meta (summed over shards by the report's data table).
META_TOTALS = (
    "truncated",
    "turns_dropped",
    "tokens",
    "response_tokens",
    "reasoning_tokens",
)
OVERLONG = ("truncate", "drop")
log = logging.getLogger("specbuild")


class RowRejected(ValueError):
    """A row that cannot be used; the message is kept as the reason."""


def _template_takes_reasoning(tokenizer) -> bool:
    return "reasoning_content" in (tokenizer.chat_template or "")


def _with_reasoning(messages: list[dict], native: bool) -> list[dict]:
    """Templates without a reasoning slot get it inline, as reasoning models emit it."""
    out = []
    for m in messages:
        m = dict(m)
        reasoning = m.pop("reasoning_content", None)
        if reasoning:
            if native:
                m["reasoning_content"] = reasoning
            else:
                m["content"] = f"<think>\n{reasoning}\n</think>\n\n{m['content']}"
        out.append(m)
    return out


def render_chat(tokenizer, messages: list[dict], *, add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _turn_span(tokenizer, messages: list[dict], i: int) -> tuple[str, tuple[int, int]]:
    """The rendering through assistant turn `i` and that turn's [start, end) character span:
    after the generation prompt, through the end-of-turn token."""
    head = render_chat(tokenizer, messages[:i], add_generation_prompt=True)
    upto = render_chat(tokenizer, messages[: i + 1])
    if not upto.startswith(head):
        raise RowRejected(
            f"assistant turn {i}: the chat template does not render the answered prompt as the "
            "start of the answered turn; assistant tokens cannot be located"
        )
    start, end = len(head), len(upto.rstrip())
    eot = tokenizer.eos_token or ""
    if eot:
        at = upto.find(eot, start)
        if at >= 0:
            end = at + len(eot)
    return upto, (start, end)


def _assistant_turns(messages: list[dict]) -> list[int]:
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise RowRejected("no assistant turn to learn from")
    if not any(m["role"] == "user" for m in messages[: turns[0]]):
        raise RowRejected(
            "an assistant turn before any user turn (nothing it answers); samples drops one"
        )
    return turns


def assistant_char_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the [start, end) character span of every assistant turn, or
    RowRejected when the template does not render prefixes as prefixes (see
    `drops_earlier_reasoning`)."""
    text = render_chat(tokenizer, messages)
    spans = []
    for i in _assistant_turns(messages):
        upto, span = _turn_span(tokenizer, messages, i)
        if not text.startswith(upto):
            raise RowRejected(
                "the chat template does not render conversation prefixes as prefixes; "
                "assistant tokens cannot be located in one row"
            )
        spans.append(span)
    return text, spans


def drops_earlier_reasoning(tokenizer, messages: list[dict]) -> bool:
    """Whether the template renders some assistant turn of `messages` differently once later
    turns follow (Qwen3-style templates drop earlier reasoning): found by rendering."""
    text = render_chat(tokenizer, messages)
    return any(
        not text.startswith(render_chat(tokenizer, messages[: i + 1]))
        for i in _assistant_turns(messages)
    )


@dataclass
class Tokenized:
    rows: list[dict]
    truncated: int = 0  # rows truncated
    turns_dropped: int = 0  # messages of the conversation that no row holds (truncation)
    reasoning_tokens: int = 0
    per_turn: bool = False  # a row per assistant turn (module docstring)
    held: set[int] = field(default_factory=set)  # indices of the messages some row holds

    @property
    def row(self) -> dict:
        """The only row (a conversation that makes one)."""
        (row,) = self.rows
        return row


def _exchange_starts(messages: list[dict]) -> list[int]:
    """Indices where an exchange (a user turn and all up to the next user turn) starts."""
    return [i for i, m in enumerate(messages) if m["role"] == "user"]


def _kept(messages: list[dict], k: int) -> list[int]:
    """Indices of `messages` left when their first k exchanges go (the system prompt stays)."""
    head = [0] if messages[0]["role"] == "system" else []
    return head + list(range(_exchange_starts(messages)[k], len(messages)))


def _drop_exchanges(messages: list[dict], k: int) -> list[dict]:
    """`messages` without their first k exchanges (the system prompt stays)."""
    return [messages[i] for i in _kept(messages, k)]


def _encode(tokenizer, text: str):
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], enc["offset_mapping"]


def _n_tokens(tokenizer, messages: list[dict]) -> int:
    return len(tokenizer(render_chat(tokenizer, messages), add_special_tokens=False)["input_ids"])


def _fit(tokenizer, messages: list[dict], max_length: int) -> int:
    """The fewest oldest exchanges to drop so that `messages` render in max_length tokens (at
    most all but the last). Rendered length falls as exchanges go, so the count is found by
    bisection: a few renderings even for a long conversation."""
    lo, hi = 0, len(_exchange_starts(messages)) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _n_tokens(tokenizer, _drop_exchanges(messages, mid)) <= max_length:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _reasoning_ranges(text: str, spans, messages: list[dict], turns: list[int]):
    """Character ranges of the reasoning text inside each trained span (templates may strip
    its surrounding newlines)."""
    out = []
    for (s, e), i in zip(spans, turns, strict=True):
        reasoning = (messages[i].get("reasoning_content") or "").strip()
        if reasoning:
            at = text.find(reasoning, s, e)
            if at >= 0:
                out.append((at, at + len(reasoning)))
    return out


def _one_row(
    tokenizer,
    messages: list[dict],
    source: list[dict],
    *,
    row_id: str,
    finish_reason: str | None,
    max_length: int,
    overlong: str,
    last_only: bool,
    out: Tokenized,
) -> dict:
    """One row over `messages` (template-ready), masked on its last assistant turn
    (`last_only`) or on all of them; `source` holds the same turns with their reasoning."""

    def layout(msgs: list[dict]):
        turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        if last_only:
            turns = turns[-1:]
            text, span = _turn_span(tokenizer, msgs, turns[0])
            spans = [span]
        else:
            text, spans = assistant_char_spans(tokenizer, msgs)
        return turns, text, spans

    _assistant_turns(messages)
    turns, text, spans = layout(messages)
    ids, offsets = _encode(tokenizer, text)
    held = range(len(messages))  # `messages` is the conversation or a prefix of it
    if len(ids) > max_length:
        if overlong == "drop":
            raise RowRejected(f"overlong: {len(ids)} tokens > max_length {max_length}")
        k = _fit(tokenizer, messages, max_length)
        if k:
            held = _kept(messages, k)
            messages, source = _drop_exchanges(messages, k), _drop_exchanges(source, k)
            turns, text, spans = layout(messages)
            ids, offsets = _encode(tokenizer, text)
        out.truncated += 1
    mask = [int(any(s <= a < e for s, e in spans)) for a, _ in offsets]
    if len(ids) > max_length:
        ids, mask, offsets = ids[:max_length], mask[:max_length], offsets[:max_length]
    n_resp = sum(mask)
    if n_resp == 0:
        raise RowRejected(f"no response token within max_length {max_length}")
    out.held.update(held)
    ranges = _reasoning_ranges(text, spans, source, turns)
    out.reasoning_tokens += sum(
        m and any(s <= a < e for s, e in ranges) for m, (a, _) in zip(mask, offsets, strict=True)
    )
    return {
        "id": row_id,
        "input_ids": ids,
        "loss_mask": mask,
        "seq_len": len(ids),
        "n_prompt_tokens": len(ids) - n_resp,
        "n_response_tokens": n_resp,
        "has_reasoning": any(source[i].get("reasoning_content") for i in turns),
        "finish_reason": finish_reason,
    }


def _unrendered_tool_calls(tokenizer, messages: list[dict]) -> str | None:
    """Why `messages` cannot be trained on as they are: an assistant turn's tool_calls that the
    chat template does not render (it renders the turn the same without them), or None."""
    for i, m in enumerate(messages):
        if not m.get("tool_calls"):
            continue
        bare = {k: v for k, v in m.items() if k != "tool_calls"}
        with_calls = render_chat(tokenizer, messages[: i + 1])
        if with_calls == render_chat(tokenizer, [*messages[:i], bare]):
            return (
                f"assistant message {i} holds tool_calls the chat template does not render: "
                "trained without them, the drafter would learn to end the turn where the call "
                "was; use a target whose template renders tool calls, or drop the record"
            )
    return None


def tokenize_conversation(
    tokenizer,
    messages: list[dict],
    *,
    row_id: str,
    finish_reason: str | None,
    max_length: int,
    overlong: str,
) -> Tokenized:
    """One conversation to its rows (each with exactly ROW_KEYS): one row, or one per
    assistant turn where the template drops earlier reasoning (module docstring); or
    RowRejected with the reason."""
    forged = special_text_fault(tokenizer, messages)
    if forged:
        raise RowRejected(forged)
    unrendered = _unrendered_tool_calls(tokenizer, messages)
    if unrendered:
        raise RowRejected(unrendered)
    msgs = _with_reasoning(messages, _template_takes_reasoning(tokenizer))
    turns = _assistant_turns(msgs)
    out = Tokenized(rows=[])
    kw = {"max_length": max_length, "overlong": overlong, "out": out}
    if not drops_earlier_reasoning(tokenizer, msgs):
        out.rows.append(
            _one_row(
                tokenizer,
                msgs,
                messages,
                row_id=row_id,
                finish_reason=finish_reason,
                last_only=False,
                **kw,
            )
        )
        out.turns_dropped = len(msgs) - len(out.held)
        return out
    out.per_turn = True
    for k, i in enumerate(turns, 1):
        last = i == turns[-1]
        try:
            out.rows.append(
                _one_row(
                    tokenizer,
                    msgs[: i + 1],
                    messages[: i + 1],
                    row_id=f"{row_id}#{k}",
                    # an earlier answer ended at its end-of-turn: the target went on after it
                    finish_reason=finish_reason if last else "stop",
                    last_only=True,
                    **kw,
                )
            )
        except RowRejected as err:
            raise RowRejected(f"assistant turn {k}: {err}") from None
    # a message dropped from a later turn's row is still held by its own turn's row
    out.turns_dropped = len(msgs) - len(out.held)
    return out


def _failure(err: Exception) -> str:
    if isinstance(err, RowRejected):
        return str(err)
    return f"cannot render or tokenize it ({error_text(err)})"


def tokenize_shard(
    *,
    generated: str | os.PathLike,
    fingerprint: str | os.PathLike,
    out: str | os.PathLike,
    meta: str | os.PathLike,
    rejected: str | os.PathLike,
    counts: str | os.PathLike,
    max_length: int,
    overlong: str,
) -> dict:
    """Tokenize one generated shard with the target's tokenizer; returns the meta record."""
    if overlong not in OVERLONG:
        raise ValueError(f"tokenize.overlong {overlong!r}: allowed {', '.join(OVERLONG)}")
    ensure_free_space(out, tokenize_need(generated=generated), "a tokenized shard")
    target = read_target_info(fingerprint)
    tokenizer = load_tokenizer(os.path.dirname(fingerprint))
    rows, bad, n_in, n_kept, per_turn = [], [], 0, 0, 0
    totals = dict.fromkeys(("truncated", "turns_dropped", "reasoning_tokens"), 0)
    for n_in, src in enumerate(read_jsonl(generated), 1):
        if not isinstance(src, dict):
            bad.append({"id": None, "reason": f"line {n_in}: not a JSON object"})
            continue
        rid = src.get("id")
        if src.get("target_fingerprint") != target.fingerprint:
            bad.append(
                {
                    "id": rid,
                    "reason": "generated by another target fingerprint "
                    f"({str(src.get('target_fingerprint'))[:12]}); rerun generate",
                }
            )
            continue
        try:
            t = tokenize_conversation(
                tokenizer,
                src["messages"],
                row_id=rid,
                finish_reason=src.get("finish_reason"),
                max_length=max_length,
                overlong=overlong,
            )
        except Exception as err:  # one record's failure must not stop the shard
            bad.append({"id": rid, "reason": _failure(err)})
            continue
        rows += t.rows
        n_kept += 1
        per_turn += t.per_turn
        for key in totals:
            totals[key] += getattr(t, key)
    record = {
        "target": target.name,
        "target_fingerprint": target.fingerprint,
        "tokenizer_fingerprint": target.tokenizer_fingerprint,
        "chat_template_sha256": target.chat_template_sha256,
        "in": n_in,
        "kept": n_kept,
        "rows": len(rows),
        "rejected": len(bad),
        "row_per_turn": per_turn,
        **totals,
        "tokens": sum(r["seq_len"] for r in rows),
        "response_tokens": sum(r["n_response_tokens"] for r in rows),
        "max_length": max_length,
        "overlong": overlong,
        "rows_sha256": hashlib.sha256(
            b"".join(str(r["input_ids"]).encode() for r in rows)
        ).hexdigest(),
    }
    publish_shard(
        ShardFiles(out=out, rejected=rejected, counts=counts),
        rows=rows,
        bad=bad,
        n_in=n_in,
        n_kept=n_kept,
        label=f"tokenize {generated}",
        detail=(
            f" ({len(rows)} rows, {per_turn} of them split a row per assistant turn; "
            f"{totals['truncated']} rows truncated, {totals['turns_dropped']} turns dropped; "
            f"{record['tokens']} tokens, {totals['reasoning_tokens']} reasoning)"
        ),
    )
    write_json(meta, record)
    return record
