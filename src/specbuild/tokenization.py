"""Stage `tokenize`: render conversations with the target's own chat template and mark the
tokens the drafter learns from.

`loss_mask` is 1 exactly on assistant tokens: the response text and the template's end-of-turn
token, never the role header or the newline after end-of-turn. Spans are found by rendering
each conversation prefix with the same template, so any template that renders prefixes as
prefixes works; one that does not is reported, not guessed around.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass

from specbuild.io import read_jsonl, write_json
from specbuild.rejects import publish_shard
from specbuild.target import read_target_info

__all__ = [
    "ROW_KEYS",
    "RowRejected",
    "render_chat",
    "assistant_char_spans",
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


def assistant_char_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the [start, end) character span of every assistant turn.

    A span starts after the generation prompt and ends after the end-of-turn token.
    """
    text = render_chat(tokenizer, messages)
    eot = tokenizer.eos_token or ""
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = render_chat(tokenizer, messages[:i], add_generation_prompt=True)
        upto = render_chat(tokenizer, messages[: i + 1])
        if not text.startswith(head) or not text.startswith(upto) or not upto.startswith(head):
            raise RowRejected(
                "the chat template does not render conversation prefixes as prefixes; "
                "assistant tokens cannot be located"
            )
        start, end = len(head), len(upto.rstrip())
        if eot:
            at = upto.find(eot, start)
            if at >= 0:
                end = at + len(eot)
        spans.append((start, end))
    return text, spans


@dataclass
class Tokenized:
    row: dict
    truncated: bool


def tokenize_conversation(
    tokenizer,
    messages: list[dict],
    *,
    row_id: str,
    finish_reason: str | None,
    max_length: int,
    overlong: str,
) -> Tokenized:
    """One conversation to a row with exactly ROW_KEYS, or RowRejected with the reason."""
    has_reasoning = any(m.get("reasoning_content") for m in messages)
    msgs = _with_reasoning(messages, _template_takes_reasoning(tokenizer))
    if not any(m["role"] == "assistant" for m in msgs):
        raise RowRejected("no assistant turn to learn from")
    text, spans = assistant_char_spans(tokenizer, msgs)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    mask = [int(any(s <= a < e for s, e in spans)) for a, _ in offsets]
    truncated = False
    if len(ids) > max_length:
        if overlong == "drop":
            raise RowRejected(f"overlong: {len(ids)} tokens > max_length {max_length}")
        ids, mask, truncated = ids[:max_length], mask[:max_length], True
    n_resp = sum(mask)
    if n_resp == 0:
        raise RowRejected(f"no response token within max_length {max_length}")
    row = {
        "id": row_id,
        "input_ids": ids,
        "loss_mask": mask,
        "seq_len": len(ids),
        "n_prompt_tokens": len(ids) - n_resp,
        "n_response_tokens": n_resp,
        "has_reasoning": has_reasoning,
        "finish_reason": finish_reason,
    }
    return Tokenized(row, truncated)


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
    from specbuild.target import load_tokenizer

    if overlong not in OVERLONG:
        raise ValueError(f"tokenize.overlong {overlong!r}: allowed {', '.join(OVERLONG)}")
    target = read_target_info(fingerprint)
    tokenizer = load_tokenizer(os.path.dirname(fingerprint))
    rows, bad, n_in, n_trunc = [], [], 0, 0
    for src in read_jsonl(generated):
        n_in += 1
        if src.get("target_fingerprint") != target.fingerprint:
            bad.append(
                {
                    "id": src["id"],
                    "reason": "generated by another target fingerprint "
                    f"({str(src.get('target_fingerprint'))[:12]}); rerun generate",
                }
            )
            continue
        try:
            t = tokenize_conversation(
                tokenizer,
                src["messages"],
                row_id=src["id"],
                finish_reason=src.get("finish_reason"),
                max_length=max_length,
                overlong=overlong,
            )
        except RowRejected as err:
            bad.append({"id": src["id"], "reason": str(err)})
            continue
        rows.append(t.row)
        n_trunc += t.truncated
    record = {
        "target": target.name,
        "target_fingerprint": target.fingerprint,
        "tokenizer_fingerprint": target.tokenizer_fingerprint,
        "chat_template_sha256": target.chat_template_sha256,
        "in": n_in,
        "rows": len(rows),
        "rejected": len(bad),
        "truncated": n_trunc,
        "tokens": sum(r["seq_len"] for r in rows),
        "response_tokens": sum(r["n_response_tokens"] for r in rows),
        "max_length": max_length,
        "overlong": overlong,
        "rows_sha256": hashlib.sha256(
            b"".join(str(r["input_ids"]).encode() for r in rows)
        ).hexdigest(),
    }
    publish_shard(
        out=out,
        rows=rows,
        rejected=rejected,
        counts=counts,
        bad=bad,
        n_in=n_in,
        label=f"tokenize {generated}",
        detail=f" ({n_trunc} truncated, {record['tokens']} tokens)",
    )
    write_json(meta, record)
    return record
