"""Config files stay data: read as plain values, of bounded size and depth, before Snakemake
loads them.

Snakemake loads every `--configfile` through YTE with PyYAML's FullLoader: `__use_yte__: true`
turns `?`-expressions and `__definitions__` into Python run at load time, `!!python/name:`
tags become Python objects, and an alias bomb (a few lines of anchors) expands into billions of
values when Snakemake merges the file into its config. So each file is first read here as a
stream of YAML events (never built into objects): a top-level `__use_yte__`, a tag other than
the plain ones, nesting deeper than MAX_DEPTH or more than MAX_VALUES values with aliases
expanded are faults naming the file, line and dotted key.

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
from dataclasses import dataclass
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
_YTE = "__use_yte__"
_PLAIN_TYPES = (str, int, float, bool, type(None))
_DATA = "a config holds strings, numbers, booleans, lists and mappings only"
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


def _path(stack: list[_Node], root: str = "") -> str:
    out = root
    for node in stack:
        if node.mapping:
            if node.items % 2 == 1:  # reading a value: its key is part of the path
                out += f".{node.key}" if out else node.key
        else:
            out += f"[{node.items}]"
    return out or "(top level)"


def _events_faults(events: Iterator[yaml.Event], where: str, root: str = "") -> list[str]:
    """Faults of a YAML event stream, in order; stops at the first size or depth fault. Keys
    are named under `root` (a --config entry's key)."""
    stack: list[_Node] = []
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (values, height)
    faults: list[str] = []

    def at(event: yaml.Event) -> str:
        return f"{where}, line {event.start_mark.line + 1}: {_path(stack, root)}"

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
        if isinstance(event, yaml.ScalarEvent):
            key_of_top = len(stack) == 1 and stack[0].mapping and stack[0].items % 2 == 0
            if key_of_top and event.value == _YTE:
                faults.append(
                    f"{where}, line {event.start_mark.line + 1}: {_YTE}: YTE templates run Python "
                    "while Snakemake loads the file (`?`-expressions, __definitions__); write "
                    "the values out"
                )
            if event.anchor:
                anchors[event.anchor] = (1, 0)
            done(1, 0, event.value)
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append(_Node(isinstance(event, yaml.MappingStartEvent), event.anchor))
            if len(stack) > MAX_DEPTH:
                return faults + [f"{at(event)}: nested deeper than {MAX_DEPTH} levels; {_DATA}"]
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            node = stack.pop()
            if node.anchor:
                anchors[node.anchor] = (node.values, node.height)
            done(node.values, node.height)
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
    return faults


def _line_of(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    return f", line {mark.line + 1}" if mark is not None else ""


def configfile_faults(path: str | os.PathLike) -> list[str]:
    """Faults of the config file at `path` as plain data (see the module docstring); [] when it
    is fine or does not exist (Snakemake says so)."""
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as err:
        return [f"{where}: cannot be read as UTF-8 text ({err})"]
    try:  # Snakemake reads JSON first, without YTE
        return [f"{where}: {f}" for f in value_faults(json.loads(text))]
    except RecursionError:
        return [f"{where}: nested deeper than {MAX_DEPTH} levels; {_DATA}"]
    except ValueError:
        pass
    try:
        return _events_faults(yaml.parse(text, Loader=yaml.SafeLoader), where)
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


def value_faults(value: Any) -> list[str]:
    """'dotted.key: what' faults of a loaded config: a value of another type than plain data
    (a Python object from a tag), a number that is not finite (YAML's .nan and .inf pass every
    minimum and maximum, since NaN compares false: `align.min_cosine: .nan` passed any layer),
    nesting deeper than MAX_DEPTH, more than MAX_VALUES values (shared or cyclic references
    counted each time they are reached, as every walk of the config reaches them). Stops at
    the first."""
    count = 0
    stack: list[tuple[str, Any, int]] = [("", value, 1)]
    while stack:
        key, item, depth = stack.pop()
        count += 1
        shown = key or "(top level)"
        if count > MAX_VALUES:
            return [f"{shown}: more than {MAX_VALUES:,} values (an alias bomb?); {_DATA}"]
        if isinstance(item, Mapping):
            children = [(f"{key}.{k}" if key else str(k), v) for k, v in item.items()]
        elif isinstance(item, list | tuple):
            children = [(f"{key}[{i}]", v) for i, v in enumerate(item)]
        elif isinstance(item, float) and not math.isfinite(item):
            return [f"{shown}: {item} is not a finite number"]
        elif isinstance(item, _PLAIN_TYPES):
            continue
        else:
            return [f"{shown}: a Python {type(item).__name__}, not a value; {_DATA}"]
        if children and depth >= MAX_DEPTH:
            return [f"{shown}: nested deeper than {MAX_DEPTH} levels; {_DATA}"]
        stack.extend((k, v, depth + 1) for k, v in reversed(children))
    return []
