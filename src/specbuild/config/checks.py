"""What the schema cannot say: faults across keys and on disk, one line each naming the key.

Contract: `rule_faults` reads a config whose defaults are filled and returns one
'dotted.key: what is wrong' line per fault: an input file that is missing, a chain the engines
cannot run, a variant or drafter name that clashes, a backend without its endpoint, a drafter
folder built elsewhere that does not fit the target. A section of the wrong type reads as
empty here: the schema reports it. So no such fault surfaces later as a stack trace of a job.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specbuild.config.schema import did_you_mean, mapping
from specbuild.config.views import BASE_VARIANT
from specbuild.eagle.chain import BASELINE, NGRAM_DRAFTER, NO_DRAFTER, Chain
from specbuild.eagle.drafter_fit import external_drafter_faults
from specbuild.infra.hosts import is_loopback
from specbuild.infra.server_flags import RESERVED_FLAGS, cli_flag, flag_like_value, reserved_flag

__all__ = ["RESERVED_DRAFTER_NAMES", "rule_faults"]

# names a variant (or a bench.drafters entry) cannot take: the bench's no-drafter run
# (results/bench/<engine>/none/baseline.jsonl, `drafter` "none" in its rows)
RESERVED_DRAFTER_NAMES = (NO_DRAFTER, BASELINE, NGRAM_DRAFTER)


def _file_fault(key: str, path: Any, workdir: Path) -> list[str]:
    if not isinstance(path, str):
        return []  # a type fault, reported by the schema
    what = _not_a_file(workdir / path)
    if what is None:
        return []
    said = f"no such file {path!r}" if what == MISSING else f"{path!r} {what}"
    return [f"{key}: {said} (in {workdir.resolve()})"]


# What a path is when it is no regular file: a FIFO or a device would block or never end when
# read, so each is named for what it is, not reported as missing.
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


MISSING = "is missing"


def _not_a_file(full: Path) -> str | None:
    """Why `full` cannot be read as a file (MISSING, 'is a FIFO ...'), None if it can."""
    try:
        mode = full.stat().st_mode
    except FileNotFoundError:
        return "is a symlink to nothing" if full.is_symlink() else MISSING
    except OSError as err:
        return f"cannot be looked up ({err.strerror})"
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "something else")
    return f"is {kind}, not a regular file"


def _sets_faults(prefix: str, sets: Any, workdir: Path) -> list[str]:
    return [
        fault
        for name, spec in mapping(sets).items()
        for fault in _file_fault(f"{prefix}.{name}.path", mapping(spec).get("path"), workdir)
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


def _dataset_faults(config: Mapping, workdir: Path) -> list[str]:
    """Each file dataset's `path` is a file (a synthetic one has none)."""
    faults = []
    for name, spec in mapping(config.get("datasets")).items():
        spec = mapping(spec)
        if "synthesize" not in spec:
            faults += _file_fault(f"datasets.{name}.path", spec.get("path"), workdir)
    return faults


# Samples one generate job holds (a shard's records times their answers): the schema bounds
# each factor, this their product, far above real use and far below a job's memory.
MAX_SHARD_SAMPLES = 1_000_000


def _answers_faults(config: Mapping) -> list[str]:
    """A dataset answering each prompt more than once samples (greedy answers would be one
    answer N times) and regenerates (keep mode reuses the dataset's one answer), and its
    shards hold at most MAX_SHARD_SAMPLES answers."""
    generate = mapping(config.get("generate"))
    mode = generate.get("mode")
    faults = []
    for name, spec in mapping(config.get("datasets")).items():
        n = mapping(spec).get("answers")
        if not isinstance(n, int) or isinstance(n, bool) or n <= 1:
            continue
        size = mapping(spec).get("shard_size")
        if _positive_int(size) and int(size) * n > MAX_SHARD_SAMPLES:
            faults.append(
                f"datasets.{name}.answers: {n} answers to each of shard_size {size} records is "
                f"{int(size) * n:,} samples in one generate job, more than {MAX_SHARD_SAMPLES:,}; "
                f"lower datasets.{name}.shard_size or answers"
            )
        own = mapping(spec).get("temperature")
        temperature = generate.get("temperature") if own is None else own
        if temperature == 0:
            key = f"datasets.{name}.temperature" if own is not None else "generate.temperature"
            faults.append(
                f"datasets.{name}.answers: {n} answers per prompt need a temperature > 0, "
                f"and {key} is 0 (greedy decoding writes one answer {n} times); set "
                f"datasets.{name}.temperature above 0 or answers: 1"
            )
        if mode == "keep":
            faults.append(
                f"datasets.{name}.answers: {n} answers per prompt need generate.mode "
                "regenerate (keep reuses the dataset's one answer); set answers: 1 or mode "
                "regenerate"
            )
    return faults


def _eval_set_faults(config: Mapping) -> list[str]:
    """train.eval_set names a dataset, leaves one to train on, and replaces eval_fraction."""
    train, datasets = mapping(config.get("train")), mapping(config.get("datasets"))
    name = train.get("eval_set")
    if not isinstance(name, str):
        return []
    if name not in datasets:
        hint = did_you_mean(name, datasets)
        return [
            f"train.eval_set: {name!r} is no dataset (datasets: {', '.join(datasets)}); declare "
            f"the held-out prompts under `datasets` and name them here{hint}"
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
    datasets = mapping(config.get("datasets"))
    held_out = mapping(config.get("train")).get("eval_set")
    faults = []
    for name in names:
        if name not in datasets:
            faults.append(
                f"{key}: {name!r} is no dataset (datasets: {', '.join(datasets)})"
                f"{did_you_mean(str(name), datasets)}"
            )
        elif name == held_out:
            faults.append(f"{key}: {name!r} is train.eval_set, held out: never trained on")
    return faults


def _variant_faults(config: Mapping) -> list[str]:
    """Variant names clash with neither `base` nor the no-drafter run, and each recipe (train
    and every variant merged over it) is one a trainer can run."""
    train = mapping(config.get("train"))
    variants = mapping(train.get("variants"))
    faults = []
    if BASE_VARIANT in variants:
        faults.append(
            f"train.variants.{BASE_VARIANT}: `{BASE_VARIANT}` is the recipe of `train` itself, "
            "always built; give this variant another name"
        )
    for name in variants:
        if name in RESERVED_DRAFTER_NAMES:
            faults.append(
                f"train.variants.{name}: the name is the bench's no-drafter run; give this "
                "variant another name"
            )
    for name, changes in {"": {}, **variants}.items():
        merged = {**train, **mapping(changes)}
        key = f"train.variants.{name}" if name else "train"
        if merged.get("init") not in (None, "random") and merged.get("init_from"):
            faults.append(
                f"{key}.init: {merged['init']!r} with {key}.init_from {merged['init_from']!r}: a "
                "warm start replaces every weight; give one of them"
            )
        if merged.get("family", "eagle3") != "eagle3" and merged.get("init_from"):
            faults.append(
                f"{key}.init_from: {merged['init_from']!r} warm-starts EAGLE-3 drafters only, "
                f"and {key}.family is {merged['family']!r}"
            )
        faults += _train_datasets_faults(f"{key}.datasets", merged, config)
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
                f"{did_you_mean(str(name), variants)}"
            )
    others = mapping(bench.get("drafters"))
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
                f"bench.drafters: {', '.join(benched) or 'none'}){did_you_mean(str(name), benched)}"
            )
    return faults


def _bench_faults(config: Mapping, workdir: Path) -> list[str]:
    """The bench's sets exist, its chains are ones its engines run, the openai engine has its
    endpoint, and its drafters are named apart and fit the target."""
    bench = mapping(config.get("bench"))
    engines = bench.get("engines") if isinstance(bench.get("engines"), list) else []
    tuning = mapping(mapping(config.get("sglang")).get("tuning"))
    faults = []
    if bench.get("enabled") or (tuning.get("enabled") and tuning.get("points")):
        faults += _sets_faults("bench.sets", bench.get("sets"), workdir)
    chains = bench.get("chains")
    for i, chain in enumerate(chains if isinstance(chains, list) else []):
        faults += _chain_fault(f"bench.chains[{i}]", chain, hf="hf" in engines)
    openai = mapping(bench.get("openai"))
    if openai.get("serves") not in (None, BASELINE):
        faults += _chain_fault("bench.openai.serves", openai["serves"], hf=False)
    if bench.get("enabled") and "openai" in engines and not openai.get("endpoint"):
        faults.append(
            "bench.openai.endpoint: bench.engines has openai; give the endpoint's base URL "
            "(e.g. http://host:8000/v1)"
        )
    variants = mapping(mapping(config.get("train")).get("variants"))
    faults += _bench_drafters_faults(bench, [BASE_VARIANT, *variants])
    target = mapping(config.get("target"))
    if (
        bench.get("enabled")
        and {"hf", "sglang"} & set(engines)
        and isinstance(target.get("source"), str)
    ):
        faults += external_drafter_faults(
            mapping(bench.get("drafters")),
            workdir=workdir,
            target_name=str(target.get("name")),
            source=target["source"],
        )
    return faults


def _server_args_faults(key: str, args: Mapping) -> list[str]:
    """A flag that is or abbreviates one specbuild sets itself, and a value SGLang would read as
    a flag (infra.server_flags says why each reopens what specbuild closes)."""
    faults = []
    for name, value in args.items():
        flag = reserved_flag(str(name))
        if flag and cli_flag(str(name)) == cli_flag(flag):
            faults.append(
                f"{key}.{name}: set {RESERVED_FLAGS[flag]}, not this flag: specbuild sets "
                f"{cli_flag(flag)} itself"
            )
        elif flag:
            faults.append(
                f"{key}.{name}: {cli_flag(str(name))} abbreviates {cli_flag(flag)}, which "
                "specbuild sets itself (SGLang takes a unique prefix of a flag and keeps the last "
                f"value given); set {RESERVED_FLAGS[flag]}"
            )
        elif flag_like_value(value):
            faults.append(
                f"{key}.{name}: a value starting with '-' reads as a flag on SGLang's command "
                "line; give each flag under its own key"
            )
    return faults


def _sglang_faults(config: Mapping) -> list[str]:
    """The tuning sweep's chain is one SGLang serves; generate.backend openai has its endpoint;
    server_args (shared and each tuning point's) and the launcher leave the flags specbuild
    sets to the keys that set them and give a whole number of GPUs per server; a server bound
    beyond loopback has an API key for `make serve`."""
    sglang = mapping(config.get("sglang"))
    faults = []
    chain = mapping(sglang.get("tuning")).get("chain")
    if chain not in (None, BASELINE):
        faults += _chain_fault("sglang.tuning.chain", chain, hf=False)
    if mapping(config.get("generate")).get("backend") == "openai" and not sglang.get("endpoint"):
        faults.append(
            "sglang.endpoint: generate.backend openai needs the server's base URL here "
            "(e.g. http://host:30000/v1)"
        )
    args = mapping(sglang.get("server_args"))
    faults += _server_args_faults("sglang.server_args", args)
    points = mapping(mapping(sglang.get("tuning")).get("points"))
    for name, point in points.items():
        point_args = mapping(mapping(point).get("server_args"))
        faults += _server_args_faults(f"sglang.tuning.points.{name}.server_args", point_args)
    launcher = sglang.get("launcher")
    for i, word in enumerate(launcher if isinstance(launcher, list) else []):
        flag = reserved_flag(word) if isinstance(word, str) and word.startswith("--") else None
        if flag:
            faults.append(
                f"sglang.launcher[{i}]: {word.split('=', 1)[0]} is or abbreviates "
                f"{cli_flag(flag)}, which specbuild sets itself; set {RESERVED_FLAGS[flag]}"
            )
    host = sglang.get("host")
    if isinstance(host, str) and not is_loopback(host) and not sglang.get("serve_api_key_env"):
        faults.append(
            f"sglang.serve_api_key_env: sglang.host {host!r} is not loopback, so `make serve`'s "
            "server answers other machines: name the environment variable holding the API key "
            "its clients must send (results/serve.sh reads it when it runs), or bind 127.0.0.1"
        )
    for flag in ("tp_size", "tp"):
        tp = args.get(flag)
        if tp is not None and not _positive_int(tp):
            faults.append(
                f"sglang.server_args.{flag}: expected an integer >= 1 (GPUs per server), got {tp!r}"
            )
    return faults


def rule_faults(config: Mapping, workdir: Path) -> list[str]:
    """Faults across keys and on disk (relative paths read against `workdir`), in config order:
    datasets, train, bench, sglang."""
    return (
        _dataset_faults(config, workdir)
        + _answers_faults(config)
        + _eval_set_faults(config)
        + _variant_faults(config)
        + _bench_faults(config, workdir)
        + _sglang_faults(config)
    )
