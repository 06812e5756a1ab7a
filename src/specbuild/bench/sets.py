"""Benchmark prompt sets: a config entry (path, format, key, limit, turns) to rendered prompts.

A set is any JSONL file (UTF-8, UTF-16/32 by its BOM, gzipped when named .gz) whose rows hold
user turns in one of three formats:

  prompt    one user turn under `key` (default "prompt"); GSM8K `question`, HumanEval `prompt`
  turns     a list of user turns under `key` (default "turns"); MT-Bench
  messages  an OpenAI `messages` list under `key` (default "messages"); only the user turns are
            kept, since every assistant turn is the target's own answer at bench time

Rows keep input order; `limit` takes the first N rows and `turns` the first N user turns of each.
Adding a set is a config entry only. A bad file fails once, naming every bad line and the fix;
a row whose text holds one of the target's special tokens is a bad row (bench and tuning read
sets with the target's tokenizer), so no prompt benched forges a turn.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specbuild.eagle.special_text import special_text_fault
from specbuild.infra.io import iter_utf8_lines
from specbuild.infra.records import RecordError, parse_record

__all__ = ["BenchPrompt", "SET_FORMATS", "read_bench_prompts", "read_bench_set", "render_prompt"]

# The field each format reads when the config gives no `key`.
SET_FORMATS = {"prompt": "prompt", "turns": "turns", "messages": "messages"}
# Report at most this many bad lines; a wrong `key` makes every line bad.
MAX_LISTED_FAULTS = 10


@dataclass(frozen=True)
class BenchPrompt:
    id: str  # the row's `id_key` value, else its 0-based row index
    turns: tuple[str, ...]  # user turns, in order


def _user_turns(row: dict, fmt: str, key: str) -> list[str] | str:
    """The row's user turns, or a message saying what is wrong with it."""
    if key not in row:
        return f"no key {key!r} (keys: {sorted(row)})"
    value = row[key]
    if fmt == "prompt":
        turns = [value]
    elif fmt == "turns":
        if not isinstance(value, list):
            return f"{key!r} is {type(value).__name__}, expected a list of strings"
        turns = value
    else:
        if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
            return f"{key!r} is not a list of {{role, content}} objects"
        turns = [m.get("content") for m in value if m.get("role") == "user"]
    if not turns:
        return f"{key!r} holds no user turn"
    if not all(isinstance(t, str) and t.strip() for t in turns):
        return f"{key!r} holds an empty or non-string user turn"
    return turns


def read_bench_prompts(
    path: str | os.PathLike,
    *,
    format: str,
    key: str | None = None,
    id_key: str | None = None,
    limit: int | None = None,
    turns: int | None = None,
    tokenizer=None,
) -> list[BenchPrompt]:
    """The first `limit` prompts of a set, each cut to its first `turns` user turns. With the
    target's `tokenizer`, a turn holding one of its special tokens as text is a bad row
    (specbuild.eagle.special_text)."""
    if format not in SET_FORMATS:
        raise ValueError(
            f"{path}: unknown set format {format!r}; choose one of {list(SET_FORMATS)}"
        )
    key = key or SET_FORMATS[format]
    prompts: list[BenchPrompt] = []
    faults: list[str] = []
    seen: dict[str, int] = {}  # id -> its line
    for lineno, line in iter_utf8_lines(path):
        if limit is not None and len(prompts) + len(faults) >= limit:
            break
        if not line.strip():
            continue
        try:
            row = parse_record(line)
        except RecordError as err:
            faults.append(f"{path}:{lineno}: {err}")
            continue
        if not isinstance(row, dict):
            faults.append(f"{path}:{lineno}: a row must be a JSON object")
            continue
        found = _user_turns(row, format, key)
        if isinstance(found, str):
            faults.append(f"{path}:{lineno}: {found}")
            continue
        found = found[:turns] if turns else found
        forged = tokenizer is not None and special_text_fault(
            tokenizer, [{"role": "user", "content": t} for t in found]
        )
        if forged:
            faults.append(f"{path}:{lineno}: {forged}")
            continue
        if id_key is not None and id_key not in row:
            faults.append(f"{path}:{lineno}: no id key {id_key!r}")
            continue
        pid = str(row[id_key]) if id_key is not None else str(lineno - 1)
        if pid in seen:  # rows are keyed by (set, id, turn): a repeat would blur two
            faults.append(f"{path}:{lineno}: id {pid!r} repeats line {seen[pid]}")
            continue
        seen[pid] = lineno
        prompts.append(BenchPrompt(id=pid, turns=tuple(found)))
    if faults:
        shown = "\n  ".join(faults[:MAX_LISTED_FAULTS])
        more = len(faults) - MAX_LISTED_FAULTS
        raise ValueError(
            f"{path}: {len(faults)} bad row(s) for format {format!r}, key {key!r}:\n  {shown}"
            + (f"\n  ... and {more} more" if more > 0 else "")
            + "\nFix the file or the set's `format`/`key`/`id_key` in config `bench.sets`."
        )
    if not prompts:
        raise ValueError(f"{Path(path)}: no prompts read (empty file?)")
    return prompts


def read_bench_set(spec: dict, *, limit: int | None = None, tokenizer=None) -> list[BenchPrompt]:
    """The prompts of one `bench.sets` config entry; `limit`, when given, replaces the
    entry's own; `tokenizer` as in read_bench_prompts."""
    return read_bench_prompts(
        spec["path"],
        format=spec["format"],
        key=spec.get("key"),
        id_key=spec.get("id_key"),
        limit=limit if limit is not None else spec.get("limit"),
        turns=spec.get("turns"),
        tokenizer=tokenizer,
    )


def render_prompt(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Token ids of a conversation rendered with the target's chat template, ready to answer."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    # The template already wrote every special token; adding BOS again would change the prompt.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
