"""The schema's front end: load config.schema.yaml, read scalars as its types, fill its
defaults, and say each fault in one line naming the dotted key.

Contract: `schema_faults` fills defaults in place exactly as `snakemake.utils.validate` does
(so params, and what reruns, are unchanged) and returns one 'dotted.key: what is wrong' line per
fault; `ConfigError` puts them in one short message:

    config/my.yaml: 2 problems (keys and allowed values: config/config.schema.yaml)
      generate.temprature: unknown key; did you mean 'temperature'?
      datasets.gsm8k.path: no such file 'resources/prompts/gsm8k.jsonl' (in /work)

Scalars given as strings are read as the schema's type first (`coerce_scalars`): PyYAML
(YAML 1.1) reads `5e-4` as a string, and `snakemake --config` hands every nested value over
as one. Why not `snakemake.utils.validate`: its error repeats the whole schema and the whole
config (2,228 lines for one typo) and names only the first fault.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
import re
import reprlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, ValidationError, validators

from specbuild.infra.credential_patterns import names_a_secret

__all__ = [
    "HIDDEN",
    "MAX_LISTED",
    "VARIANT_FIXED",
    "ConfigError",
    "coerce_scalars",
    "did_you_mean",
    "fault_key",
    "load_schema",
    "mapping",
    "schema_faults",
]

# Faults listed in full; the rest are counted, so one broken file cannot flood the terminal.
MAX_LISTED = 12
# train keys a variant cannot change: the held-out set decides the shared vocabulary
VARIANT_FIXED = ("eval_set", "variants")
# YAML 1.1 spellings of booleans and null (what --config values arrive as, being strings).
_BOOLEANS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_NULLS = {"null", "~", "none", ""}
_TYPE_NAMES = {
    "number": "a number",
    "integer": "an integer",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping (key: value)",
    "array": "a list",
    "null": "null",
}

# What a fault shows instead of a value whose key marks a secret (`sglang.api_key_env`,
# `sglang.env.HF_TOKEN`): the console and CI logs are no place for a key pasted there.
HIDDEN = "(value not shown: the key's name marks a secret)"

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxlist = 4
_short.maxdict = 3
_short.maxlevel = 2


class ConfigError(ValueError):
    """A config with faults; `faults` holds one 'dotted.key: what is wrong' line each."""

    def __init__(self, source: str, faults: list[str], schema: str | os.PathLike) -> None:
        self.source = source
        self.faults = faults
        n = len(faults)
        where = _display(schema)
        lines = [f"{source}: {n} problem{'s' * (n != 1)} (keys and allowed values: {where})"]
        lines += [f"  {f}" for f in faults[:MAX_LISTED]]
        if n > MAX_LISTED:
            lines.append(f"  ... and {n - MAX_LISTED} more")
        super().__init__("\n".join(lines))


def _display(path: str | os.PathLike) -> str:
    """`path` relative to the working directory when it lies below it, else absolute."""
    full = Path(path).resolve()
    try:
        return str(full.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(full)


def fault_key(fault: str) -> str:
    """The dotted key a fault line names (the part before its first ': ')."""
    return fault.split(": ", 1)[0]


def mapping(value: Any) -> Mapping:
    """`value` if it is a mapping, else {}: a section of the wrong type is the schema's fault,
    reported there, so the checks across keys read it as empty."""
    return value if isinstance(value, Mapping) else {}


def did_you_mean(word: Any, choices: Iterable[Any]) -> str:
    """'; did you mean 'x'?' for the closest of `choices`, or '' when none is close."""
    # str(): a key YAML read as a number or a boolean is still compared by its spelling
    close = difflib.get_close_matches(str(word), list(map(str, choices)), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def load_schema(path: str | os.PathLike) -> dict:
    """The schema at `path`, with `train.variants.<name>` checked like the train keys."""
    # libyaml's parser where PyYAML has it: the same safe constructors, a tenth of the time
    # (every parse of the workflow loads this ~800-line schema)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as fh:
        schema = yaml.load(fh, Loader=loader)
    _add_variant_schema(schema)
    return schema


def _add_variant_schema(schema: dict) -> None:
    """Each `train.variants.<name>` is checked against the train keys themselves (types, ranges,
    choices), without their defaults: a variant holds only what it changes."""
    train = schema.get("properties", {}).get("train", {}).get("properties", {})
    if "variants" not in train:
        return
    keys = {
        k: {f: v for f, v in spec.items() if f != "default"}
        for k, spec in train.items()
        if k not in VARIANT_FIXED
    }
    train["variants"]["additionalProperties"] = {
        "type": "object",
        "additionalProperties": False,
        "properties": keys,
    }


# Scalars written as strings ---------------------------------------------------------------


def _types(schema: Mapping) -> set[str]:
    t = schema.get("type", [])
    return {t} if isinstance(t, str) else set(t)


def _from_string(value: str, types: set[str]) -> Any:
    """`value` as the first non-string type of `types` that reads it; else unchanged."""
    text = value.strip().lower()
    if types & {"number", "integer"}:
        try:
            number = float(text)
        except ValueError:
            number = None
        if number is not None and math.isfinite(number):
            if "integer" in types and number.is_integer():
                return int(number)
            if "number" in types:
                return number
    if "boolean" in types and text in _BOOLEANS:
        return _BOOLEANS[text]
    if "null" in types and text in _NULLS:
        return None
    return value


def coerce_scalars(value: Any, schema: Mapping) -> Any:
    """Convert, in place, strings under keys whose schema type excludes strings: `"5e-4"`
    under a number key becomes 0.0005, `"1e3"` under an integer key 1000, `"true"` under a
    boolean key True. Integral floats under integer-only keys become ints (`64.0` -> 64).
    Values that do not read as the type are left for the schema check to report."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key in list(value):
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                value[key] = coerce_scalars(value[key], sub)
        return value
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            value[:] = [coerce_scalars(v, items) for v in value]
        return value
    types = _types(schema)
    if isinstance(value, str) and types and "string" not in types:
        return _from_string(value, types)
    if (
        isinstance(value, float)
        and value.is_integer()
        and types & {"integer", "number"} == {"integer"}
    ):
        return int(value)
    return value


# The schema, with defaults filled ----------------------------------------------------------


def _with_defaults(validator_class):
    """A validator that fills `default`s of absent properties as it descends (the jsonschema
    FAQ recipe, as snakemake.utils.validate uses it), skipping instances that are no mapping."""
    check_properties = validator_class.VALIDATORS["properties"]

    def properties(validator, props, instance, schema):
        if isinstance(instance, dict):
            for key, sub in props.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from check_properties(validator, props, instance, schema)

    return validators.extend(validator_class, {"properties": properties})


_Validator = _with_defaults(Draft202012Validator)


def schema_faults(config: dict, schema: Mapping) -> list[str]:
    """Fill defaults into `config` and return one line per schema fault, sorted by key."""
    errors = sorted(_Validator(schema).iter_errors(config), key=lambda e: list(map(str, e.path)))
    faults: list[str] = []
    for error in errors:
        for line in _describe(error):
            if line not in faults:
                faults.append(line)
    return faults


def _key(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _child(path: Iterable[Any], key: str) -> str:
    return _key([*path, key])


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
        type(value), "list" if isinstance(value, list) else "mapping"
    )


def _describe(error: ValidationError) -> Iterator[str]:
    path, value, kind, expected = error.absolute_path, error.instance, error.validator, None
    schema = error.schema
    secret = names_a_secret(path)
    shown = HIDDEN if secret else _short.repr(value)
    if "propertyNames" in error.absolute_schema_path:
        why = schema.get("description")
        hint = _name_hint(value) or (f" ({why})" if why else "")
        yield f"{_key(path)}: name {value!r} must match {error.validator_value!r}{hint}"
    elif kind == "pattern" and secret:
        yield f"{_key(path)}: must match {error.validator_value!r} {HIDDEN}"
    elif kind == "pattern" and _name_hint(value):
        yield f"{_key(path)}: {value!r} must match {error.validator_value!r}{_name_hint(value)}"
    elif kind == "additionalProperties" and error.validator_value is False:
        known = schema.get("properties", {})
        patterns = schema.get("patternProperties", {})
        for extra in map(str, value):
            if extra not in known and not any(re.search(p, extra) for p in patterns):
                yield f"{_child(path, extra)}: unknown key{did_you_mean(extra, known)}"
    elif kind == "required":
        for name in error.validator_value:
            if isinstance(value, dict) and name not in value:
                yield f"{_child(path, name)}: missing (required)"
    elif kind == "type":
        want = error.validator_value
        types = [want] if isinstance(want, str) else list(want)
        expected = " or ".join(_TYPE_NAMES.get(t, t) for t in types)
        yield f"{_key(path)}: expected {expected}, got {_type_name(value)} {shown}"
    elif kind == "enum":
        allowed = ", ".join(map(repr, error.validator_value))
        hint = (
            did_you_mean(value, map(str, error.validator_value))
            if isinstance(value, str) and not secret
            else ""
        )
        yield f"{_key(path)}: {shown} is not one of {allowed}{hint}"
    elif kind in ("oneOf", "anyOf"):
        yield f"{_key(path)}: {_alternatives(value, error.validator_value, shown)}"
    elif secret:  # jsonschema's own message quotes the value
        yield f"{_key(path)}: fails the schema's {kind} {error.validator_value!r} {HIDDEN}"
    else:
        message = error.message.replace(repr(value), shown)
        yield f"{_key(path)}: {message}"


def _name_hint(value: Any) -> str:
    """Why a name that becomes a path component would leave its folder, or ''."""
    if not isinstance(value, str):
        return ""
    if value and set(value) == {"."}:
        return " (dots alone name the folder itself or one above it, not one inside it)"
    if "/" in value or "\\" in value:
        return " (a slash makes it a path: a name stays in its folder)"
    if "\0" in value or not value:
        return " (an empty name, or one with a NUL byte, names no file)"
    return ""


def _alternatives(value: Any, branches: list[Mapping], shown: str) -> str:
    """oneOf/anyOf: a dataset's `path` or `synthesize`; else the forms, compactly."""
    if all(set(b) == {"required"} for b in branches) and isinstance(value, dict):
        names = [n for b in branches for n in b["required"]]
        given = [n for n in names if n in value]
        which = " and ".join(given) if given else "neither"
        return f"give exactly one of {' or '.join(names)} (found {which})"
    forms = " or ".join(_form(b) for b in branches)
    return f"{shown} is none of the allowed forms: {forms}"


def _form(branch: Mapping) -> str:
    """A oneOf branch in words: sizes of lists spelled out, other keywords as written."""
    low, high = branch.get("minItems", 0), branch.get("maxItems")
    if set(branch) <= {"minItems", "maxItems"} and high is not None:
        return (
            "an empty list"
            if high == 0
            else (f"a list of {high}" if low == high else f"a list of {low} to {high}")
        )
    return "{" + ", ".join(f"{k}: {v}" for k, v in branch.items() if k != "description") + "}"
