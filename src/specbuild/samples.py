"""Stage `samples`: raw chat records (plain prompts, OpenAI `messages`, ShareGPT
`conversations`; a `.jsonl` file or a `.json` list) to normalized shards with a stable id each.

Shards are fixed-size slices of the raw records in input order, so appending records adds
shards and leaves earlier ones untouched; `record_digests` gives each slice a content hash that
the workflow passes as a param, so a shard reruns exactly when its own records change (or, with
`id_key`, the ids before it, which decide what counts as a duplicate).
Bad records are never dropped silently: each goes to the rejected file with file, line and
reason (malformed, or JSON that `specbuild.infra.records` refuses: nested too deep, a key twice,
NaN, a lone surrogate; empty, unknown role, duplicate id, an id holding `~` (which numbers
generate's answers), a conversation the target's chat template cannot render, one of the
target's special tokens typed as text (`specbuild.eagle.special_text`), a prompt longer than
`max_prompt_tokens` of the target's tokenizer), and the counts always add up (in = kept +
rejected). A `.json` list is cut into items before any is parsed, so the same
faults reject one item; only a list whose own syntax is broken fails as a whole.

One repair, never silent: assistant turns before the first user turn (ShareGPT dumps that open
with the bot's greeting) answer nothing, and most templates cannot render them or put them
where no served conversation has them; they are dropped, the row says so in `repairs` (a list
of what was changed, empty for most rows) and the log counts them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specbuild.eagle.special_text import special_text_fault
from specbuild.eagle.target_info import load_tokenizer  # transformers only when called
from specbuild.infra.formats import TOOL_CALL_ROWS
from specbuild.infra.io import GZIP_SUFFIX, iter_utf8_lines, read_text_any
from specbuild.infra.records import RecordError, parse_record
from specbuild.rejects import ShardFiles, publish_shard

__all__ = [
    "ANSWER_SEPARATOR",
    "RawRecord",
    "SampleError",
    "SampleSettings",
    "PromptLength",
    "iter_raw_records",
    "record_digests",
    "record_id",
    "normalize_sample",
    "repair_conversation",
    "write_sample_shard",
]

FORMATS = ("auto", "prompt", "messages", "sharegpt")
# Between a sample's id and the number of its answer (generate.answer_ids): no record id holds it.
ANSWER_SEPARATOR = "~"
# `tool` turns (a function's result) pass through to the target's chat template like any other
# non-assistant turn: part of the prompt, never of the loss.
ROLES = ("system", "user", "assistant", "tool")
# ShareGPT speaker names seen in the wild, mapped to OpenAI roles.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "system": "system",
    "tool": "tool",
    "function_response": "tool",
    "observation": "tool",
}

log = logging.getLogger("specbuild")


class SampleError(ValueError):
    """A record that cannot be used; the message is the reason kept in the rejected file."""


@dataclass(frozen=True)
class RawRecord:
    index: int  # 0-based position among records (non-blank lines / list items)
    line: int  # 1-based line in the file (item number for a JSON list)
    raw: bytes  # exact bytes, hashed for the shard digest


# The file's name decides how it is read, never its first bytes: a JSONL file whose first
# record happens to be a JSON array is still JSONL (that record is rejected, the rest kept).
# A further `.gz` is gunzipped as it is read; the encoding (UTF-8, with or without a BOM,
# UTF-16/32) is the reader's (specbuild.infra.io.iter_utf8_lines).
JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSON_LIST_SUFFIXES = (".json",)


_WS = re.compile(r"[ \t\n\r]*")
# A string (escapes and all) or a bracket: enough to find where a value ends that the decoder
# gave up on (nested past the recursion limit, a number past the digit limit).
_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_BRACKET_OR_STRING = re.compile(_STRING + r"|[\[\]{}]")
_SCALAR = re.compile(_STRING + r"|[^,\]\s]+")


def _list_error(path: Path, err: json.JSONDecodeError) -> ValueError:
    return ValueError(
        f"{path}:{err.lineno}: not valid JSON ({err.msg}, column {err.colno}); a .json "
        "dataset is one JSON list, so one bad record fails it all: fix it, or write the "
        "records one a line to a .jsonl file (bad lines are then rejected, the rest kept)"
    )


def _value_end(text: str, pos: int) -> int:
    """Where the JSON value at `pos` ends, found without decoding it."""
    if text[pos] not in "[{":
        return _SCALAR.match(text, pos).end()
    depth = 0
    for m in _BRACKET_OR_STRING.finditer(text, pos):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(m.group(), 0)
        if depth == 0:
            return m.end()
    raise json.JSONDecodeError("Unterminated value", text, pos)


def _json_list_items(path: Path) -> Iterator[str]:
    """The text of each item of a `.json` list. Items are cut apart here and parsed one by one
    (specbuild.infra.records), so an item that cannot be read is one reject; only a file whose list
    itself is broken (an item with no end, a missing comma) fails as a whole."""
    text = read_text_any(path)
    decoder = json.JSONDecoder()
    pos = _WS.match(text).end()
    try:
        if not text.startswith("[", pos):
            if pos < len(text):
                kind = {"{": "dict", '"': "str"}.get(text[pos], "JSON scalar")
                raise ValueError(
                    f"{path}:1: a .json dataset must hold a JSON list of records, not a "
                    f"{kind}; for one record a line, name the file .jsonl"
                )
            raise json.JSONDecodeError("Expecting value", text, pos)
        pos = _WS.match(text, pos + 1).end()
        closed = text.startswith("]", pos)
        while not closed:
            try:
                end = decoder.raw_decode(text, pos)[1]
            except json.JSONDecodeError:
                raise
            except (RecursionError, ValueError):
                end = _value_end(text, pos)
            yield text[pos:end]
            pos = _WS.match(text, end).end()
            if text.startswith(",", pos):
                pos = _WS.match(text, pos + 1).end()
            elif text.startswith("]", pos):
                closed = True
            else:
                raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
        pos = _WS.match(text, pos + 1).end()
        if pos < len(text):
            raise json.JSONDecodeError("Extra data", text, pos)
    except json.JSONDecodeError as err:
        raise _list_error(path, err) from None


def _list_item_bytes(item: str) -> bytes:
    """An item's bytes as the shard digest sees them: its canonical JSON (sorted keys), so
    reformatting the file reruns nothing; an item that cannot be read keeps its own text, for
    the shard to reject with the reason."""
    try:
        value = parse_record(item)
    except RecordError:
        return item.encode("utf-8")
    return json.dumps(value, sort_keys=True, ensure_ascii=False).encode()


def iter_raw_records(path: str | os.PathLike) -> Iterator[RawRecord]:
    """Every record of a `.jsonl` file (non-blank lines) or of a `.json` list, as raw bytes."""
    path = Path(path)
    name = path.name.lower().removesuffix(GZIP_SUFFIX)
    suffix = Path(name).suffix
    if suffix not in JSONL_SUFFIXES + JSON_LIST_SUFFIXES:
        raise ValueError(
            f"{path}: cannot tell by the name whether this is JSONL or a JSON list; name it "
            f"{' or '.join(JSONL_SUFFIXES)} (one JSON object a line) or .json (a JSON list), "
            f"with {GZIP_SUFFIX} after it when gzipped"
        )
    if suffix in JSON_LIST_SUFFIXES:
        for i, item in enumerate(_json_list_items(path)):
            yield RawRecord(i, i + 1, _list_item_bytes(item))
        return
    index = 0
    for lineno, line in iter_utf8_lines(path):
        if not line.strip():
            continue
        yield RawRecord(index, lineno, line)
        index += 1


def record_digests(
    path: str | os.PathLike,
    *,
    shard_size: int,
    limit: int | None = None,
    id_key: str | None = None,
) -> list[str]:
    """sha256 of each shard's raw slice, in shard order (the last shard may be partial).

    With `id_key`, a shard's digest also covers the ids of every record before it: they decide
    which of its records are duplicates. Appending records still changes no earlier digest.
    A shard whose raw records mention tool calls also covers TOOL_CALL_ROWS, the rows version
    that keeps them: such shards rebuild once after that change, every other keeps its digest.
    """
    digests: list[str] = []
    h = None
    tools = False  # whether a record of the shard mentions tool calls
    ids_before = hashlib.sha256()

    def close(h) -> str:
        if tools:
            h.update(b"rows version: %d\n" % TOOL_CALL_ROWS)
        return h.hexdigest()

    for rec in iter_raw_records(path):
        if limit is not None and rec.index >= limit:
            break
        if rec.index % shard_size == 0:
            if h is not None:
                digests.append(close(h))
            h, tools = hashlib.sha256(), False
            if id_key is not None:
                h.update(b"ids before: " + ids_before.hexdigest().encode() + b"\n")
        h.update(rec.raw + b"\n")
        tools = tools or b"tool_calls" in rec.raw
        if id_key is not None:
            ids_before.update(repr(_peek_id(rec, dataset="", id_key=id_key)).encode() + b"\n")
    if h is not None:
        digests.append(close(h))
    return digests


def record_id(obj, *, dataset: str, index: int, id_key: str | None) -> str:
    """`<dataset>-<id_key value>` with `id_key`, else `<dataset>-<record index>` (7 digits).
    A value holding ANSWER_SEPARATOR is refused: generate's answer ids would collide with it."""
    if id_key is None:
        return f"{dataset}-{index:07d}"
    if not isinstance(obj, dict):
        raise SampleError(f"record is {type(obj).__name__}, expected a JSON object")
    if id_key not in obj:
        raise SampleError(f"missing id field `{id_key}`")
    value = obj[id_key]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SampleError(
            f"id field `{id_key}` is {type(value).__name__}: expected a string or integer"
        )
    if isinstance(value, str) and not value.strip():
        raise SampleError(f"id field `{id_key}` is empty")
    if isinstance(value, str) and ANSWER_SEPARATOR in value:
        # id `q~1` would be the second answer of sample `q` (answers > 1): one row, two ids
        raise SampleError(
            f"id {value!r} holds {ANSWER_SEPARATOR!r}, which generate uses to number a "
            f"prompt's answers (<id>{ANSWER_SEPARATOR}1, <id>{ANSWER_SEPARATOR}2, ...)"
        )
    return f"{dataset}-{value}"


def _peek_id(rec: RawRecord, *, dataset: str, id_key: str) -> str | None:
    """The id of a raw record, or None where it has none (it is rejected in its own shard)."""
    try:
        obj = parse_record(rec.raw)
    except RecordError:
        return None
    try:
        return record_id(obj, dataset=dataset, index=rec.index, id_key=id_key)
    except SampleError:
        return None


def _text(value, where: str) -> str:
    if not isinstance(value, str):
        raise SampleError(f"{where}: content is {type(value).__name__}, expected a string")
    if not value.strip():
        raise SampleError(f"{where}: empty content")
    return value


def _from_messages(turns, key: str) -> list[dict]:
    if not isinstance(turns, list) or not turns:
        raise SampleError(f"`{key}` must be a non-empty list")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise SampleError(f"{key}[{i}] is not an object")
        # `conversations` holds ShareGPT turns (from/value) or, as SpecForge writes them,
        # OpenAI turns (role/content): told apart per turn by its keys
        if key == "conversations" and "role" not in turn:
            speaker = turn.get("from")
            role = SHAREGPT_ROLES.get(str(speaker).lower()) if speaker is not None else None
            if role is None:
                raise SampleError(f"{key}[{i}]: unknown speaker {speaker!r}")
            content = turn.get("value")
        else:
            role = turn.get("role")
            if role not in ROLES:
                raise SampleError(
                    f"{key}[{i}]: unknown role {role!r} (allowed: {', '.join(ROLES)})"
                )
            content = turn.get("content")
        calls = _tool_calls(turn, role, f"{key}[{i}]")
        # a turn that only calls a tool has no text (OpenAI writes null)
        empty = calls and (content is None or content == "")
        msg = {"role": role, "content": "" if empty else _text(content, f"{key}[{i}]")}
        if calls:
            msg["tool_calls"] = calls
        reasoning = turn.get("reasoning_content")
        if role == "assistant" and isinstance(reasoning, str) and reasoning.strip():
            msg["reasoning_content"] = reasoning
        messages.append(msg)
    return messages


def _tool_calls(turn: dict, role: str, where: str) -> list[dict] | None:
    """An assistant turn's `tool_calls`, kept with its text: the chat template renders them
    (tokenize rejects a row whose template cannot), so the drafter never learns a turn that
    ends where its call was. A call in another form, or on another turn, is refused."""
    if turn.get("function_call"):
        raise SampleError(f"{where}: a function_call (OpenAI's older form): write it as tool_calls")
    calls = turn.get("tool_calls")
    if calls is None or calls == []:
        return None
    if role != "assistant":
        raise SampleError(f"{where}: a {role} turn holds tool_calls; only an assistant turn calls")
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise SampleError(f"{where}: tool_calls must be a list of objects")
    return calls


def _check_order(messages: list[dict]) -> None:
    roles = [m["role"] for m in messages]
    if "system" in roles[1:]:
        raise SampleError("a system message may only come first")
    if "user" not in roles:
        raise SampleError("no user turn")
    if roles[-1] == "system":
        raise SampleError("conversation ends with a system message")


def normalize_sample(obj, *, fmt: str = "auto", prompt_key: str = "prompt") -> list[dict]:
    """One raw record to OpenAI-style messages, or SampleError with the reason."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    if not isinstance(obj, dict):
        raise SampleError(f"record is {type(obj).__name__}, expected a JSON object")
    if fmt == "auto":
        fmt = next(
            (
                f
                for f, k in (
                    ("messages", "messages"),
                    ("sharegpt", "conversations"),
                    ("prompt", prompt_key),
                )
                if k in obj
            ),
            None,
        )
        if fmt is None:
            raise SampleError(
                f"cannot detect format: no `messages`, `conversations` or `{prompt_key}` field"
            )
    if fmt == "prompt":
        if prompt_key not in obj:
            raise SampleError(f"missing field `{prompt_key}`")
        messages = [{"role": "user", "content": _text(obj[prompt_key], prompt_key)}]
    else:
        key = "messages" if fmt == "messages" else "conversations"
        if key not in obj:
            raise SampleError(f"missing field `{key}`")
        messages = _from_messages(obj[key], key)
    _check_order(messages)
    return messages


def repair_conversation(messages: list[dict]) -> tuple[list[dict], list[str]]:
    """(`messages` with the assistant turns before the first user turn dropped, what was
    changed). A system prompt stays first."""
    head = messages[:1] if messages[0]["role"] == "system" else []
    body = messages[len(head) :]
    lead = next(i for i, m in enumerate(body) if m["role"] == "user")  # _check_order: one is
    dropped = sum(m["role"] == "assistant" for m in body[:lead])
    if not dropped:
        return messages, []
    kept = head + [m for m in body[:lead] if m["role"] != "assistant"] + body[lead:]
    return kept, [f"dropped {dropped} assistant turn(s) before the first user turn"]


def _parse(rec: RawRecord):
    try:
        return parse_record(rec.raw)
    except RecordError as err:
        raise SampleError(str(err)) from None


def split_prompt(messages: list[dict]) -> tuple[list[dict], dict | None]:
    """(prompt up to the last user turn, trailing assistant turn or None): what `generate`
    sends the target and what it replaces."""
    if messages[-1]["role"] == "assistant":
        return messages[:-1], messages[-1]
    return messages, None


class PromptLength:
    """Tokens of the prompt `generate` sends for a conversation, counted as the hf backend does
    (the target's tokenizer and chat template, generation prompt added).

    A prompt the target cannot take must be refused here, with its file and line: `generate`
    would try to allocate for it (a 5 MB line asked for 623 GB) and take its shard down.
    """

    def __init__(self, target_dir: str | os.PathLike, max_tokens: int) -> None:
        self.tok = load_tokenizer(target_dir)
        self.max_tokens = max_tokens
        # No token stands for more characters than its vocabulary entry has (byte-level BPE
        # spells each byte as one character, SentencePiece each character as itself), so a text
        # longer than max_tokens * the longest entry cannot fit: refused without tokenizing it
        # (tokenizing 5 MB takes seconds).
        self.max_chars = max_tokens * max(len(t) for t in self.tok.get_vocab())

    def check(self, messages: list[dict]) -> int:
        """The prompt's token count, or SampleError when it is over `max_tokens` or the chat
        template cannot render the conversation (`generate` and `tokenize` would fail on it)."""
        prompt, _ = split_prompt(messages)
        try:
            self.tok.apply_chat_template(messages, tokenize=False)
            text = self.tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        except Exception as err:  # a template's own raise_exception, or a jinja error
            raise SampleError(
                f"the target's chat template cannot render this conversation "
                f"({type(err).__name__}: {str(err)[:300]})"
            ) from None
        if len(text) > self.max_chars:
            raise SampleError(
                f"prompt too long: {len(text):,} characters cannot fit in max_prompt_tokens "
                f"{self.max_tokens}"
            )
        n = len(self.tok(text, add_special_tokens=False)["input_ids"])  # the template has them
        if n > self.max_tokens:
            raise SampleError(
                f"prompt too long: {n:,} tokens > max_prompt_tokens {self.max_tokens}"
            )
        return n


@dataclass(frozen=True, kw_only=True)
class SampleSettings:
    """How a dataset's records are read (its `datasets.<name>` settings). Each default is the
    schema's; tests/unit/config/test_schema.py keeps them equal."""

    fmt: str = "auto"  # one of FORMATS; auto detects per record
    prompt_key: str = "prompt"  # the text of a plain-prompt record
    id_key: str | None = None  # the record's own id (None: its position)
    # longer prompts are rejected (needs the target); None: no check. No default: the
    # schema's 8192 would need a target wherever one is not given
    max_prompt_tokens: int | None


def write_sample_shard(
    *,
    raw: str | os.PathLike,
    files: ShardFiles,
    dataset: str,
    start: int,
    stop: int,
    settings: SampleSettings,
    target_dir: str | os.PathLike | None = None,
) -> tuple[int, int]:
    """Normalize records [start, stop) of `raw` into `files.out`; rejects go to
    `files.rejected`, the numbers to `files.counts`. Returns (kept, rejected).

    Ids are `<dataset>-<record index>` (stable when records are appended), or
    `<dataset>-<value of settings.id_key>`; a record whose id an earlier record of the file
    already has is rejected (so with `id_key` the records before `start` are read for their
    ids). With `target_dir` (the target's folder), a record whose text holds one of its special
    tokens is rejected (specbuild.eagle.special_text), and `settings.max_prompt_tokens` rejects
    longer prompts.
    """
    fmt, prompt_key, id_key = settings.fmt, settings.prompt_key, settings.id_key
    max_prompt_tokens = settings.max_prompt_tokens
    if max_prompt_tokens is not None and target_dir is None:
        raise ValueError("max_prompt_tokens needs target_dir (its tokenizer)")
    length = None if max_prompt_tokens is None else PromptLength(target_dir, max_prompt_tokens)
    tokenizer = None
    if target_dir is not None:
        tokenizer = length.tok if length is not None else load_tokenizer(target_dir)
    kept, bad = [], []
    first_line: dict[str, int] = {}  # id -> line of the first record with it
    for rec in iter_raw_records(raw):
        if rec.index >= stop:
            break
        if rec.index < start:
            if id_key is not None:
                rid = _peek_id(rec, dataset=dataset, id_key=id_key)
                if rid is not None:
                    first_line.setdefault(rid, rec.line)
            continue
        where = {"file": str(raw), "line": rec.line}
        sid = f"{dataset}-{rec.index:07d}"  # until the record's own id is known
        try:
            obj = _parse(rec)
            sid = record_id(obj, dataset=dataset, index=rec.index, id_key=id_key)
            if sid in first_line:
                raise SampleError(f"duplicate id {sid!r} (first at line {first_line[sid]})")
            first_line[sid] = rec.line
            messages, repairs = repair_conversation(
                normalize_sample(obj, fmt=fmt, prompt_key=prompt_key)
            )
            forged = tokenizer is not None and special_text_fault(tokenizer, messages)
            if forged:
                raise SampleError(forged)
            if length is not None:
                length.check(messages)
        except SampleError as err:
            bad.append(
                {
                    "id": sid,
                    **where,
                    "reason": str(err),
                    "raw": rec.raw[:2000].decode("utf-8", "replace"),
                }
            )
            log.warning("rejected %s:%d: %s", raw, rec.line, err)
            continue
        for what in repairs:
            log.info("repaired %s:%d: %s", raw, rec.line, what)
        kept.append({"id": sid, "messages": messages, "source": where, "repairs": repairs})
    n_in = len(kept) + len(bad)
    if n_in == 0:
        raise ValueError(f"{raw}: no records in [{start}, {stop}); the shard list is out of date")
    publish_shard(
        files,
        rows=kept,
        bad=bad,
        n_in=n_in,
        label=f"samples {dataset} [{start}, {stop})",
        detail=f" ({sum(bool(r['repairs']) for r in kept)} repaired)",
        log_rejects=False,  # logged above with file and line
    )
    return len(kept), len(bad)
