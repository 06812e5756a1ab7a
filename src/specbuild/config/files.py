"""Config files stay data: read as plain values, of bounded size and depth, before Snakemake
loads them.

Snakemake loads every `--configfile` through YTE with PyYAML's FullLoader: `__use_yte__: true`
turns `?`-expressions and `__definitions__` into Python run at load time, `!!python/name:` tags
become Python objects, and an alias bomb (a few lines of anchors) expands into billions of
values when Snakemake merges the file into its config. So each file is first read here as a
stream of YAML events (never built into objects): a YTE keyword (`__use_yte__`,
`__definitions__`, `__variables__`) or a `?`-expression as any key or value, at any depth (a
merge key or an alias can carry it to the top level), a tag other than the plain ones, nesting
deeper than MAX_DEPTH or more than MAX_VALUES values with aliases expanded are faults naming
the file, line and dotted key. So are what a loader would take silently or fail on with a
traceback naming no file: a key given twice in one mapping (YAML keeps the last), a key YAML
reads as no string (`no:` is false, `2024:` an int, `~:` null: later code joins and matches
names as strings), a file that is empty, a list or a scalar rather than a mapping of sections,
and a path that does not exist.

Contract: `configfile_faults` reads one file and returns 'file, line N: key: what' lines;
`refuse_unsafe_configfiles` checks the files on Snakemake's command line and exits with them
(profiles/default/config.yaml calls it while Snakemake reads its profiles, before it loads the
config files); `value_faults` bounds and types an already loaded config (the Snakefile-level
check: `--config` values, a run with `--workflow-profile none`). docs/security.md says which
route each covers.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "MAX_DEPTH",
    "MAX_VALUES",
    "ConfigFileError",
    "check_configfiles",
    "config_value_faults",
    "config_values_of",
    "configfile_faults",
    "configfiles_of",
    "refuse_unsafe_configfiles",
    "value_faults",
]

# Far above any real config (the default has ~400 values, nested 6 deep at
# sglang.tuning.points.<name>.server_args.<flag>); far below what slows a parse: a bomb refused
# at this count is refused in milliseconds.
MAX_DEPTH = 16
MAX_VALUES = 100_000
# The tags a plain YAML value resolves to; any other builds an object (!!python/*) or fails
# later in Snakemake's loader with a misleading message (custom `!tags`).
_CORE = "tag:yaml.org,2002:"
PLAIN_TAGS = {_CORE + t for t in ("str", "int", "float", "bool", "null", "map", "seq")} | {"!"}
# YTE's keywords: the switch that makes a file a program, and the keys whose values it runs or
# binds. A merge key (`<<: {__use_yte__: true}`) or an alias used as a key brings any scalar
# written anywhere in the file to the top level after a check of the top-level keys alone, so
# every scalar is checked, wherever it stands and whatever brings it.
_YTE_WORDS = ("__use_yte__", "__definitions__", "__variables__")
_YTE_RUNS = (
    "YTE templates run Python while Snakemake loads the file (`?`-expressions, "
    "__definitions__); write the values out"
)
_CARRIED = " (a merge key `<<` or an alias can carry it to the top level, where YTE reads it)"
_PLAIN_TYPES = (str, int, float, bool, type(None))
_DATA = "a config holds strings, numbers, booleans, lists and mappings only"
_TOP = "a config is a mapping of sections at top level (target:, datasets:, ...)"
# What PyYAML makes of a plain (unquoted) key that is no string, by the tag it resolves to.
_RESOLVER = yaml.resolver.Resolver()
_NOT_STRING = {
    _CORE + "bool": "a boolean",
    _CORE + "int": "an integer",
    _CORE + "float": "a number",
    _CORE + "null": "null",
    _CORE + "timestamp": "a date",
}
_TRUE = {"yes", "true", "on"}
_SEE = "docs/security.md"


class ConfigFileError(ValueError):
    """Config files that are not plain data; `faults` holds one line each."""

    def __init__(self, faults: list[str]) -> None:
        self.faults = faults
        n = len(faults)
        lines = [f"{n} config problem{'s' * (n != 1)}: a config is data, never code ({_SEE})"]
        super().__init__("\n".join(lines + [f"  {f}" for f in faults]))


def _tag(tag: str) -> str:
    return "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag


@dataclass
class _Node:
    """An open mapping or sequence of the event stream."""

    mapping: bool
    anchor: str | None
    values: int = 1  # itself and everything under it, aliases expanded
    height: int = 1  # levels of collections under it, itself included
    items: int = 0  # completed children (a mapping: keys and values)
    key: str = "?"  # the key whose value is being read (mappings)
    lines: dict[str, int] = field(default_factory=dict)  # each string key's first line


def _path(stack: list[_Node], root: str = "") -> str:
    out = root
    for node in stack:
        if node.mapping:
            if node.items % 2 == 1:  # reading a value: its key is part of the path
                out += f".{node.key}" if out else node.key
        else:
            out += f"[{node.items}]"
    return out or "(top level)"


def _scalar_tag(event: yaml.ScalarEvent) -> str:
    """The tag PyYAML's composer gives a scalar: its own, else the one its text resolves to."""
    if event.tag not in (None, "!"):
        return event.tag
    return _RESOLVER.resolve(yaml.ScalarNode, event.value, event.implicit)


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _key_type_fault(written: str, tag: str) -> str:
    """Why the key written `written`, which YAML reads as `tag`, is refused, and the fix."""
    if not written:
        return "a key must be a string, and YAML reads an empty key as null; give it a name"
    what = _NOT_STRING[tag]
    if tag == _CORE + "bool":
        what = f"{'true' if written.lower() in _TRUE else 'false'} ({what})"
    quoted = _quoted(written)
    return f"a key must be a string, and YAML reads `{written}` as {what}; quote it: {quoted}"


def _root_kind(event: yaml.Event) -> str:
    if isinstance(event, yaml.SequenceStartEvent):
        return "a list"
    if isinstance(event, yaml.ScalarEvent):
        tag = _scalar_tag(event)
        if tag == _CORE + "null":
            return "nothing" if not event.value else "null"
        return _NOT_STRING.get(tag, "a string")
    return "an alias"


def _events_faults(
    events: Iterator[yaml.Event], where: str, root: str = "", *, configfile: bool = False
) -> list[str]:
    """Faults of a YAML event stream, in order; stops at the first size or depth fault. Keys
    are named under `root` (a --config entry's key). `configfile`: the stream is a whole
    config file, loaded with YAML's types: one document holding a mapping, string keys."""
    stack: list[_Node] = []
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (values, height)
    scalars: dict[str, yaml.ScalarEvent] = {}  # anchor -> its scalar (an alias used as a key)
    faults: list[str] = []
    documents = 0

    def at(event: yaml.Event) -> str:
        return f"{where}, line {event.start_mark.line + 1}: {_path(stack, root)}"

    def key_at(event: yaml.Event, key: str) -> str:
        parent = _path(stack, root)
        return f"{where}, line {event.start_mark.line + 1}: " + (
            key if parent == "(top level)" else f"{parent}.{key}"
        )

    def check_key(event: yaml.Event) -> None:
        """A key must be a string (in a config file), and is given once per mapping."""
        scalar = scalars.get(event.anchor) if isinstance(event, yaml.AliasEvent) else event
        if not isinstance(scalar, yaml.ScalarEvent):  # a mapping or a list as a key
            if configfile:
                faults.append(f"{key_at(event, '?')}: a key must be a string, not a collection")
            return
        tag = _scalar_tag(scalar)
        if tag in _NOT_STRING:
            if configfile:
                why = _key_type_fault(scalar.value, tag)
                faults.append(f"{key_at(event, scalar.value)}: {why}")
            return
        if tag != _CORE + "str":
            return  # `<<` (a merge) and the like: the loader's to read
        line, lines = event.start_mark.line + 1, stack[-1].lines
        if scalar.value in lines:
            faults.append(
                f"{key_at(event, scalar.value)}: repeated (first at line {lines[scalar.value]}); "
                "give each key once in a mapping (YAML keeps the last and drops the first)"
            )
        else:
            lines[scalar.value] = line

    def yte_faults(event: yaml.ScalarEvent) -> list[str]:
        """A YTE keyword or `?`-expression, as a key or a value at any depth (module comment
        at _YTE_WORDS: a merge or an alias moves it where YTE looks)."""
        text = event.value
        if text not in _YTE_WORDS and not text.startswith("?"):
            return []
        is_key = bool(stack) and stack[-1].mapping and stack[-1].items % 2 == 0
        named = key_at(event, text) if is_key else at(event)
        if text in _YTE_WORDS and not is_key:
            return [
                f"{named}: the value {text} is a YTE keyword, which an alias can make a key: "
                + _YTE_RUNS
            ]
        if text in _YTE_WORDS:
            return [f"{named}: {_YTE_RUNS}{'' if len(stack) == 1 else _CARRIED}"]
        what = "key" if is_key else "value"
        shown = _quoted(text if len(text) <= 40 else text[:37] + "...")
        return [
            f"{named}: the {what} {shown} starts with `?`, a Python expression YTE runs while "
            f"Snakemake loads the file; write the value out"
        ]

    def too_many(event: yaml.Event) -> str:
        return (
            f"{at(event)}: more than {MAX_VALUES:,} values with its aliases expanded (an alias "
            f"bomb?); {_DATA}"
        )

    def done(values: int, height: int, key: Any = None) -> None:
        if stack:
            top = stack[-1]
            if top.mapping and top.items % 2 == 0:
                top.key = str(key) if key is not None else "?"
            top.items += 1
            top.values += values
            top.height = max(top.height, height + 1)

    for event in events:
        tag = getattr(event, "tag", None)
        if tag is not None and tag not in PLAIN_TAGS:
            faults.append(
                f"{at(event)}: tag {_tag(tag)} builds a Python object or a custom type; {_DATA}"
            )
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if configfile and documents == 2:
                faults.append(
                    f"{where}, line {event.start_mark.line + 1}: a second YAML document (---); "
                    "a config file holds one"
                )
        node = isinstance(event, yaml.NodeEvent)  # a scalar, an alias, a mapping or a list
        if node and configfile and not stack and documents == 1:
            if not isinstance(event, yaml.MappingStartEvent):
                faults.append(f"{where}: {_TOP}; this file holds {_root_kind(event)}")
        if node and stack and stack[-1].mapping and stack[-1].items % 2 == 0:
            check_key(event)
        if isinstance(event, yaml.ScalarEvent):
            if configfile:
                faults += yte_faults(event)
            if event.anchor:
                anchors[event.anchor] = (1, 0)
                scalars[event.anchor] = event
            done(1, 0, event.value)
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append(_Node(isinstance(event, yaml.MappingStartEvent), event.anchor))
            if len(stack) > MAX_DEPTH:
                return faults + [f"{at(event)}: nested deeper than {MAX_DEPTH} levels; {_DATA}"]
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            closed = stack.pop()
            if closed.anchor:
                anchors[closed.anchor] = (closed.values, closed.height)
                scalars.pop(closed.anchor, None)
            done(closed.values, closed.height)
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor not in anchors:  # open: the value would contain itself
                return faults + [f"{at(event)}: alias *{event.anchor} refers to itself; {_DATA}"]
            values, height = anchors[event.anchor]
            if len(stack) + height > MAX_DEPTH:
                return faults + [
                    f"{at(event)}: alias *{event.anchor} nests deeper than {MAX_DEPTH} levels"
                ]
            if sum(n.values for n in stack) + values > MAX_VALUES:
                return faults + [too_many(event)]  # named at the alias, before it is counted
            done(values, height, "*" + event.anchor)
        if sum(n.values for n in stack) > MAX_VALUES:
            return faults + [too_many(event)]
    if configfile and not documents:
        faults.append(f"{where}: {_TOP}; this file is empty")
    return faults


def _line_of(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    return f", line {mark.line + 1}" if mark is not None else ""


def _json_faults(text: str, where: str) -> list[str] | None:
    """Faults of a config file that is JSON (as Snakemake reads it first); None when the text
    is no JSON."""
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict:
        keys = [k for k, _ in items]
        repeated.extend(k for i, k in enumerate(keys) if k in keys[:i])
        return dict(items)

    try:
        loaded = json.loads(text, object_pairs_hook=pairs)
    except RecursionError:
        return [f"{where}: nested deeper than {MAX_DEPTH} levels; {_DATA}"]
    except ValueError:
        return None
    faults = [f"{where}: {f}" for f in value_faults(loaded)]
    if not isinstance(loaded, dict):
        what = "a list" if isinstance(loaded, list) else _plain_kind(loaded)
        faults.append(f"{where}: {_TOP}; this file holds {what}")
    if repeated:
        try:  # JSON is YAML: its event walk names the line and the dotted key
            found = _events_faults(yaml.parse(text, Loader=yaml.SafeLoader), where)
            faults += [f for f in found if ": repeated (first at line" in f]
        except yaml.YAMLError:
            faults += [
                f"{where}: key {k!r} repeated in one mapping; give each key once (JSON keeps "
                "the last and drops the first)"
                for k in dict.fromkeys(repeated)
            ]
    return faults


def _plain_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        type(value), f"a Python {type(value).__name__}"
    )


def configfile_faults(path: str | os.PathLike) -> list[str]:
    """Faults of the config file at `path` as plain data (see the module docstring); [] when it
    is fine."""
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:  # Snakemake's own message is a traceback naming no option
        return [f"{where}: no such config file (--configfile)"]
    except (OSError, UnicodeDecodeError) as err:
        return [f"{where}: cannot be read as UTF-8 text ({err})"]
    faults = _json_faults(text, where)  # Snakemake reads JSON first, without YTE
    if faults is not None:
        return faults
    try:
        return _events_faults(yaml.parse(text, Loader=yaml.SafeLoader), where, configfile=True)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        return [f"{where}{_line_of(err)}: not valid YAML: {problem}"]


def check_configfiles(paths: Sequence[str | os.PathLike]) -> None:
    """Raise `ConfigFileError` listing the faults of every file of `paths`."""
    faults = [f for path in paths for f in configfile_faults(path)]
    if faults:
        raise ConfigFileError(faults)


def configfiles_of(argv: Sequence[str]) -> list[str]:
    """The files a Snakemake command line gives with --configfile/--configfiles (or an
    abbreviation Snakemake's parser accepts, `--configf`), in order."""
    files: list[str] = []
    taking = False
    for arg in argv:
        if arg == "--":
            break
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            taking = len(name) > len("--config") and "--configfiles".startswith(name)
            if taking and eq:
                files.append(value)
                taking = False
        elif taking:
            files.append(arg)
    return files


def config_values_of(argv: Sequence[str]) -> list[str]:
    """The `key=value` entries a Snakemake command line gives with --config (or -C)."""
    entries: list[str] = []
    taking = False
    for arg in argv:
        if arg == "--":
            break
        if arg.startswith("-"):
            taking = arg in ("--config", "-C")
        elif taking:
            entries.append(arg)
    return entries


def config_value_faults(entry: str) -> list[str]:
    """Faults of one --config `key=value`: Snakemake reads the value as YAML (base loader: no
    tags, no YTE) and merges it into its config, which expands aliases of mappings."""
    key, _, value = entry.partition("=")
    try:
        return _events_faults(yaml.parse(value, Loader=yaml.SafeLoader), "--config", key)
    except yaml.YAMLError:
        return []  # Snakemake reads it as a plain string then


def refuse_unsafe_configfiles(argv: Sequence[str] | None = None) -> None:
    """Exit with every fault of the config files (and --config values) on this Snakemake
    command line (`argv`, default sys.argv[1:]); return when there is none."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        check_configfiles(configfiles_of(argv))
        values = [f for entry in config_values_of(argv) for f in config_value_faults(entry)]
        if values:
            raise ConfigFileError(values)
    except ConfigFileError as err:
        sys.exit(str(err))


def _loaded_key_fault(key: Any) -> str:
    """Why a key of a loaded config that is no string is refused (the file's own spelling is
    gone by now; configfile_faults names it where a file is read)."""
    if isinstance(key, bool):
        what = f"the boolean {str(key).lower()}"
        how = "yes, no, on, off, true and false as booleans"
    elif isinstance(key, int | float):
        what, how = f"the number {key}", "numbers as numbers"
    elif key is None:
        what, how = "null", "~, null and an empty key as null"
    else:
        what, how = f"a Python {type(key).__name__}", "dates as dates"
    return f"a key must be a string, and this one is {what} (YAML reads unquoted {how}); quote it"


def value_faults(value: Any) -> list[str]:
    """'dotted.key: what' faults of a loaded config: a key that is no string (each one: YAML
    reads `no:` as false, and names are joined and matched as strings), a value of another type
    than plain data (a Python object from a tag), a number that is not finite (YAML's .nan and
    .inf pass every minimum and maximum, since NaN compares false: `align.min_cosine: .nan`
    passed any layer), nesting deeper than MAX_DEPTH, more than MAX_VALUES values (shared or
    cyclic references counted each time they are reached, as every walk of the config reaches
    them). Stops at the first fault but a key's."""
    count = 0
    keys: list[str] = []
    stack: list[tuple[str, Any, int]] = [("", value, 1)]
    while stack:
        key, item, depth = stack.pop()
        count += 1
        shown = key or "(top level)"
        if count > MAX_VALUES:
            return keys + [f"{shown}: more than {MAX_VALUES:,} values (an alias bomb?); {_DATA}"]
        if isinstance(item, Mapping):
            children = [(f"{key}.{k}" if key else str(k), v) for k, v in item.items()]
            keys += [
                f"{name}: {_loaded_key_fault(k)}"
                for k, (name, _) in zip(item, children, strict=True)
                if not isinstance(k, str)
            ]
        elif isinstance(item, list | tuple):
            children = [(f"{key}[{i}]", v) for i, v in enumerate(item)]
        elif isinstance(item, float) and not math.isfinite(item):
            return keys + [f"{shown}: {item} is not a finite number"]
        elif isinstance(item, _PLAIN_TYPES):
            continue
        else:
            return keys + [f"{shown}: a Python {type(item).__name__}, not a value; {_DATA}"]
        if children and depth >= MAX_DEPTH:
            return keys + [f"{shown}: nested deeper than {MAX_DEPTH} levels; {_DATA}"]
        stack.extend((k, v, depth + 1) for k, v in reversed(children))
    return keys
