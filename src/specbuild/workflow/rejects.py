"""Which shards carry rejected rows, and the limit each is judged by (rules/rejects.smk)."""

from __future__ import annotations

from collections.abc import Mapping

from specbuild.workflow.datasets import is_synthetic
from specbuild.workflow.shards import ShardIndex

__all__ = ["REJECT_STAGES", "reject_counts_files", "reject_limit", "reject_limits"]

# Results folders whose shards carry rejected rows, and the config section of each limit.
REJECT_STAGES = {"samples": "samples", "generated": "generate", "tokenized": "tokenize"}


def reject_limit(config: Mapping, stage: str, dataset: str) -> dict:
    """The rejected-share limit of one stage's shards of a dataset and the key that sets it."""
    if stage == "samples" and is_synthetic(config, dataset):
        return {
            "limit": config["datasets"][dataset]["synthesize"]["max_rejected_fraction"],
            "setting": f"datasets.{dataset}.synthesize.max_rejected_fraction",
        }
    section = REJECT_STAGES[stage]
    return {
        "limit": config[section]["max_rejected_fraction"],
        "setting": f"{section}.max_rejected_fraction",
    }


def reject_limits(config: Mapping) -> dict[str, dict]:
    """Every limit, by "{stage}/{dataset}": the params of the reject table."""
    return {
        f"{stage}/{dataset}": reject_limit(config, stage, dataset)
        for stage in REJECT_STAGES
        for dataset in config["datasets"]
    }


def reject_counts_files(shards: ShardIndex) -> list[str]:
    return [
        f
        for stage in REJECT_STAGES
        for f in shards.expand(f"results/{stage}/{{dataset}}/{{shard}}.counts.json")
    ]
