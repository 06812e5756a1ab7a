"""What `rule all` builds: every final output of the configured pipeline."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from specbuild.workflow.paths import HIDDEN_SHARD, drafter_folder_files, variant_drafter_folder
from specbuild.workflow.report_plan import report_paths
from specbuild.workflow.shards import ShardIndex

__all__ = ["all_outputs"]


def all_outputs(config: Mapping, shards: ShardIndex, variants: Collection[str]) -> list[str]:
    return (
        shards.expand(HIDDEN_SHARD)
        + ["results/vocab/vocab.safetensors", "results/align/report.json"]
        + ["results/tables/rejects.md"]
        + [f for v in variants for f in drafter_folder_files(variant_drafter_folder(v))]
        + ["results/tables/variants.md"]
        + report_paths(config, variants)
        + ["results/serve.sh"]
    )
