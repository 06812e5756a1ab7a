"""A dataset's settings as a job of it sees them: sampling, turns, record ranges."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "answers_per_prompt",
    "conversation_turns",
    "dataset_size_limit",
    "dataset_setting",
    "datasets_regex",
    "follow_up_sampling",
    "is_synthetic",
    "sampling_params",
    "shard_range",
    "synthesize_sampling",
]


def dataset_setting(config: Mapping, key: str, dataset: str) -> Any:
    """One key of a dataset's config (the schema fills defaults)."""
    return config["datasets"][dataset][key]


def is_synthetic(config: Mapping, dataset: str) -> bool:
    """A dataset whose user prompts the target writes itself (`synthesize`), not a file."""
    return "synthesize" in config["datasets"][dataset]


def datasets_regex(config: Mapping, synthetic: bool) -> str:
    """Wildcard constraint for the rule that builds samples of file or of synthetic datasets."""
    names = [d for d in config["datasets"] if is_synthetic(config, d) == synthetic]
    return "|".join(names) if names else "(?!)"  # (?!) matches nothing


def synthesize_sampling(config: Mapping, dataset: str) -> dict:
    """SamplingParams fields of the self-written prompts (request i is seeded seed + i), and
    `openers` when the dataset has some. Folded in here, and only when set, so that shards
    written without openers keep their params and stay up to date."""
    cfg = config["datasets"][dataset]["synthesize"]
    fields = {
        "max_new_tokens": cfg["max_tokens"],
        "temperature": cfg["temperature"],
        "top_p": cfg["top_p"],
        "seed": cfg["seed"],
    }
    if cfg.get("openers"):
        fields["openers"] = list(cfg["openers"])
    return fields


def conversation_turns(config: Mapping, dataset: str) -> int:
    """Answers per conversation: `synthesize.turns` of a self-written dataset, else 1."""
    if not is_synthetic(config, dataset):
        return 1
    return config["datasets"][dataset]["synthesize"]["turns"]


def follow_up_sampling(config: Mapping, dataset: str) -> dict:
    """SamplingParams fields of the follow-up user turns the target writes (turns > 1): the
    dataset's synthesize settings. {} when there are none, so their changes rerun nothing.
    """
    if conversation_turns(config, dataset) == 1:
        return {}
    fields = synthesize_sampling(config, dataset)
    fields.pop("openers", None)  # a follow-up is written freely: openers start first prompts
    return fields


def answers_per_prompt(config: Mapping, dataset: str) -> dict:
    """{"answers": n} for a dataset answering each prompt n > 1 times, else {}. Not the bare
    n: Snakemake compares a job's params as a set of values, names dropped, so an int could
    equal another param's (turns, rows_version) and hide a change; {} (follow_up's value
    under one turn too) keeps jobs built before the key existed as they are."""
    n = config["datasets"][dataset]["answers"]
    return {"answers": n} if n > 1 else {}


def sampling_params(config: Mapping, dataset: str, shard: str) -> dict:
    """SamplingParams fields (the dataset's own max_new_tokens and temperature over generate's);
    the seed is offset per shard so shards sample independently."""
    gen = config["generate"]
    return {
        "max_new_tokens": _own_or(config, dataset, "max_new_tokens"),
        "temperature": _own_or(config, dataset, "temperature"),
        "top_p": gen["top_p"],
        "seed": gen["seed"] + int(shard),
    }


def _own_or(config: Mapping, dataset: str, key: str) -> Any:
    """The dataset's own generate setting `key`, or generate's where it has none (null)."""
    own = config["datasets"][dataset].get(key)
    return config["generate"][key] if own is None else own


def dataset_size_limit(config: Mapping, dataset: str) -> int | None:
    """Records used: `limit` (null: all) of a file, `synthesize.count` of a synthetic dataset."""
    cfg = config["datasets"][dataset]
    return cfg["synthesize"]["count"] if is_synthetic(config, dataset) else cfg["limit"]


def shard_range(config: Mapping, dataset: str, shard: str) -> list[int]:
    """[start, stop) record indices of a shard; the last shard stops at the dataset's limit."""
    size = config["datasets"][dataset]["shard_size"]
    limit = dataset_size_limit(config, dataset)
    start = int(shard) * size
    return [start, start + size if limit is None else min(start + size, limit)]
