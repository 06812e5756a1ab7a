"""Which bench jobs exist and what each reads: one job per engine, drafter and chain (a
drafting shape, or the baseline), every set in it. A drafter is one of our variants (bench.variants)
or one built elsewhere (bench.drafters); the baseline has none:
results/bench/{engine}/none/baseline.jsonl, once per engine. Chains the engines cannot run
are config faults (specbuild.config), caught at parse time.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping

from specbuild.config import bench_drafter_names
from specbuild.config.views import train_variants
from specbuild.eagle.chain import BASELINE, NGRAM_DRAFTER, NO_DRAFTER, block_chain
from specbuild.workflow.paths import (
    bench_row_file,
    drafter_folder_files,
    target_file,
    variant_drafter_folder,
)

__all__ = [
    "SERVED_ENGINES",
    "bench_concurrency",
    "bench_drafter_files",
    "bench_drafter_regex",
    "bench_drafters",
    "bench_engines",
    "bench_inputs",
    "bench_options",
    "bench_prompt_limit",
    "bench_row_files",
    "bench_runs",
    "drafter_chains",
    "bench_sets",
    "served_drafter",
    "serve_rows",
    "sweeps",
    "variant_bench_rows",
]

SERVED_ENGINES = ("sglang", "openai")


def bench_engines(config: Mapping) -> list[str]:
    return list(config["bench"]["engines"]) if config["bench"]["enabled"] else []


def bench_drafters(config: Mapping, variants: Collection[str]) -> dict[str, str]:
    """{name: exported folder} of every drafter the hf and sglang engines bench, ours first."""
    folders = {v: variant_drafter_folder(v) for v in variants}
    folders |= {k: os.path.normpath(v) for k, v in config["bench"]["drafters"].items()}
    return {name: folders[name] for name in bench_drafter_names(config)}


def drafter_chains(config: Mapping, drafter: str) -> list[str]:
    """The chains a drafter is benched and served at: bench.chains, or for a block variant
    (train family dflash or dspark) the one chain its blocks were trained for."""
    variant = train_variants(config).get(drafter)
    if variant and variant.get("family", "eagle3") != "eagle3":
        return [block_chain(int(variant["block_drafts"]))]
    return list(config["bench"]["chains"])


def bench_runs(config: Mapping, variants: Collection[str], engine: str) -> list[tuple[str, str]]:
    """(drafter, config) pairs one engine is benched at: the baseline (if on) and each drafter
    at every chain; an existing endpoint (openai) only at what it serves."""
    b = config["bench"]
    if engine == "openai":
        serves = b["openai"]["serves"]
        return [(NO_DRAFTER if serves == BASELINE else b["openai"]["drafter"], serves)]
    runs = [(NO_DRAFTER, BASELINE)] if b["baseline"] else []
    drafters = bench_drafters(config, variants)
    runs += [(d, c) for d in drafters for c in drafter_chains(config, d)]
    if engine == "sglang" and b["ngram"]:  # the floor without training, at each chain
        runs += [(NGRAM_DRAFTER, c) for c in b["chains"]]
    return runs


def bench_row_files(config: Mapping, variants: Collection[str]) -> list[str]:
    return [
        bench_row_file(e, d, c)
        for e in bench_engines(config)
        for d, c in bench_runs(config, variants, e)
    ]


def bench_drafter_files(config: Mapping, variants: Collection[str], drafter: str) -> list[str]:
    """The files of a drafter's folder (our variant's: its export rule's outputs)."""
    folder = bench_drafters(config, variants).get(drafter, variant_drafter_folder(drafter))
    return drafter_folder_files(folder)


def bench_drafter_regex(config: Mapping, variants: Collection[str]) -> str:
    """Wildcard constraint of `drafter`: the baseline's `none` or a benched drafter's name."""
    names = [NO_DRAFTER, *bench_drafters(config, variants)]
    if config["bench"]["ngram"]:
        names.append(NGRAM_DRAFTER)
    if "openai" in bench_engines(config):
        names.append(config["bench"]["openai"]["drafter"])
    return "|".join(dict.fromkeys(names))


def variant_bench_rows(config: Mapping, variants: Collection[str]) -> list[str]:
    """Row files of our benched variants by the engines that count verify steps (hf, sglang),
    at every chain: the measured columns of the variants table."""
    return [
        bench_row_file(e, d, c)
        for e in bench_engines(config)
        if e != "openai"
        for d, c in bench_runs(config, variants, e)
        if d in variants
    ]


def bench_inputs(
    config: Mapping, variants: Collection[str], engine: str, drafter: str, chain: str
) -> dict:
    """Target fingerprint and every set's file; the drafter's files for a chain we serve."""
    if (drafter == NO_DRAFTER) != (chain == BASELINE):
        raise ValueError(
            f"{bench_row_file(engine, drafter, chain)}: the baseline is "
            f"{NO_DRAFTER}/{BASELINE}.jsonl, a drafter's runs are its chains"
        )
    inputs = {
        "fp": target_file(config, "fingerprint.json"),
        "sets": [s["path"] for s in config["bench"]["sets"].values()],
    }
    if chain != BASELINE and engine != "openai" and drafter != NGRAM_DRAFTER:
        inputs["drafter"] = bench_drafter_files(config, variants, drafter)
    return inputs


def bench_sets(config: Mapping) -> dict[str, dict]:
    """Every set's config entry as a plain dict (schema defaults filled in), in config order."""
    return {name: dict(spec) for name, spec in config["bench"]["sets"].items()}


def bench_options(config: Mapping, server: dict, engine: str) -> dict:
    """The engine's own settings (its opener's `options` in specbuild.bench); `server` is the
    SGLang server options param (specbuild.workflow.engine_settings)."""
    b = config["bench"]
    if engine == "hf":
        return {k: b["hf"][k] for k in ("dtype", "device", "threads", "workers")}
    if engine == "sglang":
        return {"server": server}
    keys = ("endpoint", "api_key_env", "served_model", "name", "request_timeout_s")
    return {k: b["openai"][k] for k in keys}


def bench_prompt_limit(config: Mapping, engine: str) -> int | None:
    return config["bench"]["hf"]["limit"] if engine == "hf" else None


def sweeps(config: Mapping, engine: str, drafter: str) -> bool:
    """A served engine sweeps concurrency for the baseline and the drafters of
    bench.sweep_drafters (null: all); the hf engine serves one request at a time."""
    swept = config["bench"]["sweep_drafters"]
    chosen = drafter == NO_DRAFTER or swept is None or drafter in swept
    return engine in SERVED_ENGINES and chosen and bool(config["bench"]["concurrency"])


def bench_concurrency(config: Mapping, engine: str, drafter: str) -> list[int]:
    if sweeps(config, engine, drafter):
        return list(config["bench"]["concurrency"])
    return []


def served_drafter(config: Mapping, variants: Collection[str]) -> str:
    """The drafter `make serve` and a tuning chain serve: the first benched one (bench.variants,
    `base` unless it says otherwise); `base`, always built, where none is benched."""
    return next(iter(bench_drafters(config, variants)), "base")


def serve_rows(config: Mapping, variants: Collection[str]) -> list[str]:
    """The sglang engine's rows of the served drafter at each chain, which `make serve` picks
    the fastest from."""
    if "sglang" not in bench_engines(config):
        return []
    drafter = served_drafter(config, variants)
    return [bench_row_file("sglang", drafter, c) for c in drafter_chains(config, drafter)]
