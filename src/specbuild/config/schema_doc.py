"""docs/configuration.md, written from config/config.schema.yaml's descriptions.

The schema is the one definition of every key (type, allowed values, default, what it does);
this renders it as Markdown so the page cannot say something the checks do not. A test
compares the committed page with this output.

    python -m specbuild.config.schema_doc > docs/configuration.md     # rewrite the page
    python -m specbuild.config.schema_doc --check docs/configuration.md
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["render", "main"]

SCHEMA = Path(__file__).resolve().parents[3] / "config" / "config.schema.yaml"
REGENERATE = "python -m specbuild.config.schema_doc > docs/configuration.md"

_HEADER = f"""\
# Configuration

Every key of a specbuild config: its type or allowed values, its default and what it does.
This page is generated from `config/config.schema.yaml` (`{REGENERATE}`); edit the schema's
descriptions, not this page.

A config is one complete YAML file: `config/config.yaml` is the embedded CPU default, the
GPU examples are in `config/examples/`. `make run CONFIG=my.yaml` (or
`snakemake --configfile my.yaml`) uses `my.yaml` instead of the default, never merged with
it; `--config` alone changes keys of the default (`snakemake --config 'train={{lr: 5e-4}}'`).
Unknown keys, wrong types and values out of range stop the build before any job starts, one
line per fault naming the dotted key. Keys of earlier releases stop it with a line naming
their new place. So do a key given twice in one mapping of a file (YAML would keep the last),
and a key YAML reads as no string: `no:` is false, `2024:` an integer; quote it (`'no':`).

Every value a job depends on reaches it through `params:`, so changing a key reruns exactly
the jobs that use it. The `max_rejected_fraction` limits are checks, not inputs: changing one
reruns only the reject table and the checks that had failed.

`<name>` in a key stands for a name you choose (a dataset, a bench set, a variant, a flag).
"""


def _one_line(text: str) -> str:
    """One Markdown line: `|` escaped for tables, `<` escaped outside code spans (so
    `results/train/<name>/` shows as written, not as an HTML tag)."""
    parts = " ".join(str(text).split()).split("`")
    parts[::2] = [p.replace("<", "\\<") for p in parts[::2]]
    return "`".join(parts).replace("|", "\\|")


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) and value else json.dumps(value, ensure_ascii=False)


def _kind(spec: Mapping) -> str:
    """The allowed values of a key, briefly: its enum, else its type(s) with their bounds."""
    if "enum" in spec:
        return " \\| ".join(f"`{_scalar(v)}`" for v in spec["enum"])
    types = spec.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    if "array" in types and isinstance(spec.get("items"), Mapping):
        items = spec["items"]
        inner = _kind(items) if ("enum" in items or "type" in items) else "any"
        types = [f"list of {inner}" if t == "array" else t for t in types]
    out = " or ".join("mapping" if t == "object" else t for t in types) or "any"
    bounds = [
        f"{sign} {spec[key]}"
        for key, sign in (
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
        )
        if key in spec
    ]
    if "pattern" in spec:
        bounds.append("matching `" + spec["pattern"].replace("|", "\\|") + "`")
    return out + (f" ({', '.join(bounds)})" if bounds else "")


def _default(spec: Mapping) -> str:
    if "default" not in spec:
        return "required" if spec.get("_required") else ""
    value = spec["default"]
    if isinstance(value, Mapping) and value and all(isinstance(v, Mapping) for v in value.values()):
        return ", ".join(f"`{k}`" for k in value)
    return f"`{_scalar(value)}`"


def _rows(spec: Mapping, path: str) -> Iterator[tuple[str, Mapping]]:
    """(dotted key, its schema) for `spec` and every key below it, in schema order."""
    yield path, spec
    required = set(spec.get("required", []))
    for name, child in (spec.get("properties") or {}).items():
        child = {**child, "_required": name in required}
        yield from _rows(child, f"{path}.{name}")
    extra = spec.get("additionalProperties")
    if isinstance(extra, Mapping) and (extra.get("properties") or extra.get("description")):
        yield from _rows(extra, f"{path}.<name>")


def _section(name: str, spec: Mapping, required: bool) -> list[str]:
    lines = [f"## `{name}`", ""]
    if spec.get("description"):
        lines += [_one_line(spec["description"]).replace("\\|", "|"), ""]
    if required:
        lines += ["Required.", ""]
    rows = list(_rows(spec, name))[1:]
    if not rows:
        return lines
    lines += ["| key | allowed | default | what it does |", "|---|---|---|---|"]
    for key, child in rows:
        kind = "mapping" if child.get("properties") else _kind(child)
        extra = child.get("additionalProperties")
        if isinstance(extra, Mapping) and not extra.get("properties"):
            kind = f"mapping of name to {_kind(extra)}"
        desc = _one_line(child.get("description", ""))
        lines.append(f"| `{key}` | {kind} | {_default(child)} | {desc} |")
    lines.append("")
    return lines


def render(schema_path: str | Path = SCHEMA) -> str:
    """The whole page for the schema at `schema_path` (read as the workflow reads it)."""
    with open(schema_path, encoding="utf-8") as fh:
        schema = yaml.safe_load(fh)
    required = set(schema.get("required", []))
    lines = [_HEADER]
    for name, spec in schema["properties"].items():
        lines += _section(name, spec, name in required)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schema", default=str(SCHEMA))
    parser.add_argument("--check", metavar="PAGE", help="exit 1 if PAGE differs from the output")
    args = parser.parse_args(argv)
    text = render(args.schema)
    if args.check:
        if Path(args.check).read_text(encoding="utf-8") != text:
            print(f"{args.check} is out of date with {args.schema}: run `{REGENERATE}`")
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
