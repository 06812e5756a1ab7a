"""Dataset records as JSON values: the one parser every reader of a user's records calls.

A dataset is untrusted input: one record must never stop a reader, nor change meaning without a
word. `parse_record` turns a record's bytes into a JSON value or raises `RecordError` whose
message is the reason a reader keeps beside the record's file and line:

- not UTF-8, or not JSON (the decoder's message and column); a line of a UTF-16/32 file its
  codec cannot decode (specbuild.infra.io.UndecodableLine);
- nested deeper than MAX_DEPTH: Python's decoder recurses once a level and a record a few KB
  long nested ~1,000 deep raised `RecursionError` (at workflow parse time with `id_key`);
- a key twice in one object: the decoder keeps the last silently, so a record's `prompt` or
  `id` could be replaced with no trace; rejected with the key named;
- `NaN`, `Infinity`, a number past float range (1e999 reads as inf), or an integer with more
  digits than Python converts (ValueError): nothing downstream writes them back as JSON;
- a lone surrogate escape (`"\\ud800"`): valid JSON, but no UTF-8 file can hold it, and the
  shard's writer would fail on it after the whole shard was read.
"""

from __future__ import annotations

import json
import math
from typing import Any

from specbuild.infra.io import UndecodableLine

__all__ = ["MAX_DEPTH", "RecordError", "parse_record"]

# Far past any chat record (a record whose tools carry JSON schemas is ~10 deep), far below
# Python's recursion limit (1,000), which the decoder, the encoder and jinja share.
MAX_DEPTH = 64
_SHOWN = 40  # characters of a key or number quoted in a reason


class RecordError(ValueError):
    """A record that cannot be read; the message is the reason kept with it."""


def _quoted(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise RecordError(f"duplicate key {_quoted(dup)}")
    return obj


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RecordError(f"number {_quoted(text)} is out of range")
    return value


def _constant(name: str) -> float:
    raise RecordError(f"{name} is not a JSON number")


def _check_value(value: Any) -> None:
    """Depth and strings of a decoded value, walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
            continue
        if depth > MAX_DEPTH:
            raise RecordError(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            for key in item:
                _check_text(key)
            item = item.values()
        stack.extend((c, depth + 1) for c in item if isinstance(c, (dict, list, str)))


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise RecordError(
            f"a string holds a lone surrogate (\\u{ord(text[err.start]):04x}), which no "
            "UTF-8 text can"
        ) from None


def parse_record(raw: bytes | str) -> Any:
    """The JSON value of one record, or RecordError with the reason (module docstring)."""
    if isinstance(raw, UndecodableLine):
        raise RecordError(raw.fault)
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise RecordError(
                f"not UTF-8 (byte {err.start}: {raw[err.start : err.start + 1]!r})"
            ) from None
    try:
        value = json.loads(
            raw, object_pairs_hook=_unique_keys, parse_float=_finite, parse_constant=_constant
        )
    except RecordError:
        raise
    except json.JSONDecodeError as err:
        hint = ""
        if err.msg == "Extra data" and "\r" in raw[: err.pos]:
            # old Mac line ends: the whole file reads as one line of many records
            hint = " (records end at \\r here; lines end at \\n only: save the file with \\n ends)"
        # after a comma: some messages end in "at" themselves ("Invalid control character at")
        raise RecordError(f"malformed JSON: {err.msg}, column {err.colno}{hint}") from None
    except RecursionError:
        raise RecordError(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:  # an integer past Python's digit limit
        raise RecordError(f"unreadable number ({str(err)[:200]})") from None
    if isinstance(value, (dict, list, str)):
        _check_value(value)
    return value
