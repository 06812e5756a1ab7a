"""Config checks: one short error that lists every fault of a config by its dotted key.

Contract: `check_config` fills the schema's defaults in place, exactly as
`snakemake.utils.validate` did (so params, and what reruns, are unchanged), and raises
`ConfigError` once, one line per fault, each naming the dotted key and what was expected:

    config/my.yaml: 2 problems (keys and allowed values: config/config.schema.yaml)
      generate.temprature: unknown key; did you mean 'temperature'?
      datasets.gsm8k.path: no such file 'resources/prompts/gsm8k.jsonl' (relative to /work)

Beyond the schema it checks what the schema cannot say (a dataset's file exists, a chain is
one the engine can run, the openai backend has an endpoint), so no such fault surfaces later
as a stack trace. Scalars given as strings are read as the schema's type first: PyYAML (YAML
1.1) reads `5e-4` as a string, and `snakemake --config` hands every nested value over as one.

Why not `snakemake.utils.validate`: its error repeats the whole schema and the whole config
(2,228 lines for one typo) and names only the first fault.
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

from specbuild.bench.chain import BASELINE, NO_DRAFTER, Chain
from specbuild.bench.drafter_fit import external_drafter_faults

__all__ = [
    "RESERVED_DRAFTER_NAMES",
    "VARIANT_FIXED",
    "bench_drafter_names",
    "sglang_server_args",
    "train_datasets",
    "train_variants",
    "ConfigError",
    "check_config",
    "coerce_scalars",
    "load_schema",
    "moved_faults",
    "rule_faults",
    "schema_faults",
]

# Faults listed in full; the rest are counted, so one broken file cannot flood the terminal.
MAX_LISTED = 12
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


# train keys a variant cannot change: the held-out set decides the shared vocabulary
VARIANT_FIXED = ("eval_set", "variants")
# names a variant (or a bench.drafters entry) cannot take: the bench's no-drafter run
# (results/bench/<engine>/none/baseline.jsonl, `drafter` "none" in its rows)
RESERVED_DRAFTER_NAMES = (NO_DRAFTER, BASELINE)


def load_schema(path: str | os.PathLike) -> dict:
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


def train_variants(config: Mapping) -> dict[str, dict]:
    """{variant: its full train config}: `base` is train as given, every other variant the same
    with its own keys changed (`train.variants`)."""
    train = {k: v for k, v in config["train"].items() if k != "variants"}
    variants = {"base": train}
    for name, changes in (config["train"].get("variants") or {}).items():
        variants[name] = {**train, **changes}
    return variants


def sglang_server_args(config: Mapping) -> dict[str, Any]:
    """sglang.server_args plus `trust_remote_code` from target.trust_remote_code, the flag's
    one source (sglang.server_args may not set it: `rule_faults`)."""
    args = dict(config["sglang"]["server_args"])
    if config["target"].get("trust_remote_code"):
        args["trust_remote_code"] = True
    return args


def train_datasets(config: Mapping, train: Mapping) -> list[str]:
    """Datasets a train recipe (`train` or a variant's merged keys) trains on: its `datasets`,
    else every dataset but the held-out eval_set, in config order."""
    if train.get("datasets"):
        return list(train["datasets"])
    return [d for d in config["datasets"] if d != config["train"].get("eval_set")]


def bench_drafter_names(config: Mapping) -> list[str]:
    """Every drafter the hf and sglang engines bench: our variants in `bench.variants` (null:
    all, `base` first) and then each of `bench.drafters`."""
    bench = config["bench"]
    ours = list(train_variants(config)) if bench.get("variants") is None else bench["variants"]
    return list(ours) + list(bench.get("drafters") or {})


def check_config(
    config: dict,
    *,
    schema: str | os.PathLike,
    source: str,
    workdir: str | os.PathLike = ".",
) -> None:
    """Coerce scalars, fill defaults, and raise `ConfigError` listing every fault.

    `source` names the config in the message (its file, plus any --config overrides);
    relative paths in the config are checked against `workdir`.
    """
    schema_doc = load_schema(schema)
    coerce_scalars(config, schema_doc)
    moved = moved_faults(config)
    faults = [f for f in schema_faults(config, schema_doc) if not _is_moved(f, moved)] + moved
    faulty = {f.split(": ", 1)[0] for f in faults}  # one fault per key is enough
    faults += [f for f in rule_faults(config, Path(workdir)) if f.split(": ")[0] not in faulty]
    if faults:
        raise ConfigError(source, faults, schema)


def _display(path: str | os.PathLike) -> str:
    """`path` relative to the working directory when it lies below it, else absolute."""
    full = Path(path).resolve()
    try:
        return str(full.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(full)


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


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
        type(value), "list" if isinstance(value, list) else "mapping"
    )


def _describe(error: ValidationError) -> Iterator[str]:
    path, value, kind, expected = error.absolute_path, error.instance, error.validator, None
    schema = error.schema
    if "propertyNames" in error.absolute_schema_path:
        yield f"{_key(path)}: name {value!r} must match {error.validator_value!r}"
    elif kind == "additionalProperties" and error.validator_value is False:
        known = schema.get("properties", {})
        patterns = schema.get("patternProperties", {})
        for extra in value:
            if extra not in known and not any(re.search(p, extra) for p in patterns):
                yield f"{_child(path, extra)}: unknown key{_suggest(extra, known)}"
    elif kind == "required":
        for name in error.validator_value:
            if isinstance(value, dict) and name not in value:
                yield f"{_child(path, name)}: missing (required)"
    elif kind == "type":
        want = error.validator_value
        types = [want] if isinstance(want, str) else list(want)
        expected = " or ".join(_TYPE_NAMES.get(t, t) for t in types)
        yield f"{_key(path)}: expected {expected}, got {_type_name(value)} {_short.repr(value)}"
    elif kind == "enum":
        allowed = ", ".join(map(repr, error.validator_value))
        hint = _suggest(value, map(str, error.validator_value)) if isinstance(value, str) else ""
        yield f"{_key(path)}: {_short.repr(value)} is not one of {allowed}{hint}"
    elif kind in ("oneOf", "anyOf"):
        yield f"{_key(path)}: {_alternatives(value, error.validator_value)}"
    else:
        message = error.message.replace(repr(value), _short.repr(value))
        yield f"{_key(path)}: {message}"


def _alternatives(value: Any, branches: list[Mapping]) -> str:
    """oneOf/anyOf: a dataset's `path` or `synthesize`; else the forms, compactly."""
    if all(set(b) == {"required"} for b in branches) and isinstance(value, dict):
        names = [n for b in branches for n in b["required"]]
        given = [n for n in names if n in value]
        which = " and ".join(given) if given else "neither"
        return f"give exactly one of {' or '.join(names)} (found {which})"
    forms = " or ".join(_form(b) for b in branches)
    return f"{_short.repr(value)} is none of the allowed forms: {forms}"


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


# Keys of earlier releases ------------------------------------------------------------------

# The serving bench became the bench stage's sglang engine (one stage for every engine):
# each old key and where its value goes now.
MOVED = {
    "sglang.bench": {
        "enabled": "add sglang to bench.engines",
        "chains": "bench.chains",
        "baseline": "bench.baseline",
        "sets": "bench.sets",
        "max_new_tokens": "bench.max_new_tokens",
        "concurrency": "bench.concurrency",
        "sweep_min_requests": "bench.sweep_min_requests",
    },
    "bench.backend": "bench.engines (a list of hf, sglang, openai)",
    "bench.dtype": "bench.hf.dtype",
    "bench.device": "bench.hf.device",
    "bench.threads": "bench.hf.threads",
    "bench.exclusive": "bench.hf.exclusive",
    # the bench measures every variant: our drafters by name, others' by folder
    "bench.drafter": (
        "bench.variants (which of ours to bench; each variant's results/drafter/<name> by "
        "default) and bench.drafters (name: folder, a drafter built elsewhere)"
    ),
    "bench.drafter_name": (
        "the rows' `drafter` (each variant's name, each bench.drafters key, bench.openai.drafter)"
    ),
}


def moved_faults(config: Mapping) -> list[str]:
    """One line per key of an earlier release, naming the key(s) that replace it."""
    faults = []
    for key, where in MOVED.items():
        section, name = key.split(".")
        value = _mapping(config.get(section)).get(name)
        if value is None:
            continue
        if isinstance(where, dict):
            parts = [f"{k} -> {where.get(k, 'gone')}" for k in _mapping(value)]
            where = "bench (one stage for every engine): " + ("; ".join(parts) or "nothing set")
        faults.append(f"{key}: moved to {where}")
    return faults


def _is_moved(fault: str, moved: list[str]) -> bool:
    key = fault.split(": ", 1)[0]
    return any(
        key == m.split(": ", 1)[0] or key.startswith(m.split(": ", 1)[0] + ".") for m in moved
    )


# What the schema cannot say ----------------------------------------------------------------


def _mapping(value: Any) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def _file_fault(key: str, path: Any, workdir: Path) -> list[str]:
    if not isinstance(path, str):
        return []  # a type fault, reported by the schema
    full = workdir / path
    if full.is_file():
        return []
    what = "is a directory, not a file" if full.is_dir() else "no such file"
    return [f"{key}: {what} {path!r} (in {workdir.resolve()})"]


def _sets_faults(prefix: str, sets: Any, workdir: Path) -> list[str]:
    return [
        fault
        for name, spec in _mapping(sets).items()
        for fault in _file_fault(f"{prefix}.{name}.path", _mapping(spec).get("path"), workdir)
    ]


def _chain_fault(key: str, name: Any, *, hf: bool) -> list[str]:
    """A config name that is no chain (the caller allows the baseline where it may be one), or
    a tree (topk > 1) where the hf engine must run it."""
    if not isinstance(name, str):
        return []
    try:
        chain = Chain.parse(name)
    except ValueError as err:
        return [f"{key}: {err}"]
    if hf and not chain.is_chain:
        return [
            f"{key}: chain {name!r}: the hf engine drafts chains only (topk 1); bench trees "
            "with engines [sglang]"
        ]
    return []


def _positive_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        return int(str(value)) >= 1
    except ValueError:
        return False


def _eval_set_faults(config: Mapping) -> list[str]:
    """train.eval_set names a dataset, leaves one to train on, and replaces eval_fraction."""
    train, datasets = _mapping(config.get("train")), _mapping(config.get("datasets"))
    name = train.get("eval_set")
    if not isinstance(name, str):
        return []
    if name not in datasets:
        return [
            f"train.eval_set: {name!r} is no dataset (datasets: {', '.join(datasets)}); declare "
            f"the held-out prompts under `datasets` and name them here{_suggest(name, datasets)}"
        ]
    if len(datasets) == 1:
        return [f"train.eval_set: {name!r} is the only dataset; nothing would be trained on"]
    if train.get("eval_fraction"):
        return [
            f"train.eval_fraction: must be 0 with train.eval_set {name!r} (the eval set is held "
            "out instead; a fraction would hold out training samples that nothing evaluates)"
        ]
    return []


def _train_datasets_faults(key: str, train: Mapping, config: Mapping) -> list[str]:
    """A recipe's `datasets` are datasets of the config, and not the held-out eval_set."""
    names = train.get("datasets")
    if not isinstance(names, list):
        return []
    datasets = _mapping(config.get("datasets"))
    held_out = _mapping(config.get("train")).get("eval_set")
    faults = []
    for name in names:
        if name not in datasets:
            faults.append(
                f"{key}: {name!r} is no dataset (datasets: {', '.join(datasets)})"
                f"{_suggest(str(name), datasets)}"
            )
        elif name == held_out:
            faults.append(f"{key}: {name!r} is train.eval_set, held out: never trained on")
    return faults


def _bench_drafters_faults(bench: Mapping, variants: list[str]) -> list[str]:
    """bench.variants names variants, bench.drafters takes no variant's name (both are folders
    under results/bench/<engine>/), and bench.sweep_drafters names benched drafters."""
    faults = []
    chosen = bench.get("variants")
    ours = variants if not isinstance(chosen, list) else chosen
    for i, name in enumerate(chosen if isinstance(chosen, list) else []):
        if name not in variants:
            faults.append(
                f"bench.variants[{i}]: {name!r} is no variant (variants: {', '.join(variants)})"
                f"{_suggest(str(name), variants)}"
            )
    others = _mapping(bench.get("drafters"))
    for name in others:
        if name in variants or name in RESERVED_DRAFTER_NAMES:
            what = "a variant's" if name in variants else "the no-drafter run's"
            faults.append(f"bench.drafters.{name}: the name is {what}; give this drafter another")
    benched = [*ours, *others]
    sweep = bench.get("sweep_drafters")
    for i, name in enumerate(sweep if isinstance(sweep, list) else []):
        if name not in benched:
            faults.append(
                f"bench.sweep_drafters[{i}]: {name!r} is not benched (bench.variants and "
                f"bench.drafters: {', '.join(benched) or 'none'}){_suggest(str(name), benched)}"
            )
    return faults


def rule_faults(config: Mapping, workdir: Path) -> list[str]:
    """Faults across keys and on disk: input files that are missing, chains the engines
    cannot run, a backend without its endpoint, a tensor-parallel size that is no integer."""
    faults: list[str] = []
    for name, spec in _mapping(config.get("datasets")).items():
        spec = _mapping(spec)
        if "synthesize" not in spec:
            faults += _file_fault(f"datasets.{name}.path", spec.get("path"), workdir)

    faults += _eval_set_faults(config)
    train = _mapping(config.get("train"))
    variants = _mapping(train.get("variants"))
    if "base" in variants:
        faults.append(
            "train.variants.base: `base` is the recipe of `train` itself, always built; give "
            "this variant another name"
        )
    for name in variants:
        if name in RESERVED_DRAFTER_NAMES:
            faults.append(
                f"train.variants.{name}: the name is the bench's no-drafter run; give this "
                "variant another name"
            )
    for name, changes in {"": {}, **variants}.items():
        merged = {**train, **_mapping(changes)}
        key = f"train.variants.{name}" if name else "train"
        if merged.get("init") not in (None, "random") and merged.get("init_from"):
            faults.append(
                f"{key}.init: {merged['init']!r} with {key}.init_from {merged['init_from']!r}: a "
                "warm start replaces every weight; give one of them"
            )
        faults += _train_datasets_faults(f"{key}.datasets", merged, config)

    bench = _mapping(config.get("bench"))
    engines = bench.get("engines") if isinstance(bench.get("engines"), list) else []
    sglang = _mapping(config.get("sglang"))
    tuning = _mapping(sglang.get("tuning"))
    if bench.get("enabled") or (tuning.get("enabled") and tuning.get("points")):
        faults += _sets_faults("bench.sets", bench.get("sets"), workdir)
    chains = bench.get("chains")
    for i, chain in enumerate(chains if isinstance(chains, list) else []):
        faults += _chain_fault(f"bench.chains[{i}]", chain, hf="hf" in engines)
    openai = _mapping(bench.get("openai"))
    if openai.get("serves") not in (None, BASELINE):
        faults += _chain_fault("bench.openai.serves", openai["serves"], hf=False)
    if bench.get("enabled") and "openai" in engines and not openai.get("endpoint"):
        faults.append(
            "bench.openai.endpoint: bench.engines has openai; give the endpoint's base URL "
            "(e.g. http://host:8000/v1)"
        )
    faults += _bench_drafters_faults(bench, ["base", *variants])
    target = _mapping(config.get("target"))
    if (
        bench.get("enabled")
        and {"hf", "sglang"} & set(engines)
        and isinstance(target.get("source"), str)
    ):
        faults += external_drafter_faults(
            _mapping(bench.get("drafters")),
            workdir=workdir,
            target_name=str(target.get("name")),
            source=target["source"],
        )
    if tuning.get("chain") not in (None, BASELINE):
        faults += _chain_fault("sglang.tuning.chain", tuning["chain"], hf=False)

    if _mapping(config.get("generate")).get("backend") == "openai" and not sglang.get("endpoint"):
        faults.append(
            "sglang.endpoint: generate.backend openai needs the server's base URL here "
            "(e.g. http://host:30000/v1)"
        )
    args = _mapping(sglang.get("server_args"))
    for flag in ("trust_remote_code", "trust-remote-code"):
        if flag in args:
            faults.append(
                f"sglang.server_args.{flag}: set target.trust_remote_code instead (every "
                "tokenizer, config and model load reads it; SGLang jobs get the flag from it)"
            )
    for flag in ("tp_size", "tp"):
        tp = args.get(flag)
        if tp is not None and not _positive_int(tp):
            faults.append(
                f"sglang.server_args.{flag}: expected an integer >= 1 (GPUs per server), got {tp!r}"
            )
    return faults
