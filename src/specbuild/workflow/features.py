"""The feature stages, hidden and align: the layer ids, the feature backend's options and
memory, and the fixed sample of shards align recomputes with the serving engine."""

from __future__ import annotations

from collections.abc import Mapping

from specbuild.config import sglang_server_args, train_datasets
from specbuild.engines.runtime import without_memory
from specbuild.workflow.engine_settings import sglang_env
from specbuild.workflow.paths import HIDDEN_SHARD
from specbuild.workflow.shards import ShardIndex
from specbuild.workflow.training import vocab_datasets

__all__ = [
    "align_shards",
    "aux_layer_ids",
    "backend_options",
    "engine_memory",
    "feature_sharing",
]


def aux_layer_ids(config: Mapping) -> list[int]:
    """hidden.layer_ids as configured: [] means the EAGLE-3 default, resolved at run time.

    Resolving [1, L//2-1, L-4] here would need the target's config.json, which does not exist
    at the first parse; the params would change between that parse and the next and rerun every
    hidden job. Passing the configured value keeps params stable; the job resolves it from
    fingerprint.json (an input, so a new target reruns it) and records the ids in the shard.
    """
    return list(config["hidden"]["layer_ids"])


def backend_options(config: Mapping, stage: str) -> dict:
    """Keyword options of the feature backend of `stage` (hidden or align): for sglang (run
    in-process) its server flags less its memory settings, which are the job's
    `engine_memory` resource; hf needs none beyond dtype/device."""
    if config[stage]["backend"] != "sglang":
        return {}
    return {
        "server_args": without_memory(sglang_server_args(config)),
        "env": sglang_env(config),
    }


def engine_memory(config: Mapping, stage: str) -> str:
    """sglang.hidden.mem_fraction_static as a resource of a feature job of `stage` ("" for
    hf): it sizes the KV pool and changes no output, so a change must not rerun finished
    shards."""
    if config[stage]["backend"] != "sglang":
        return ""
    return str(config["sglang"]["hidden"]["mem_fraction_static"])


def feature_sharing(config: Mapping) -> str:
    """hidden.share_idle_s as a resource of a hidden job: whether jobs share one engine
    changes no output, so a change must not rerun finished shards."""
    return str(config["hidden"]["share_idle_s"])


def align_shards(config: Mapping, shards: ShardIndex, variants: Mapping[str, Mapping]) -> list[str]:
    """The first hidden shard of each dataset but those only variants train on: a fixed sample
    that appending data never moves, and that a variant's own data (extracted by the same
    backend) never reruns, since every variant's training waits for this check."""
    variant_only = {
        d
        for name, train in variants.items()
        for d in train_datasets(config, train)
        if name != "base"
    } - set(vocab_datasets(config))
    return [
        HIDDEN_SHARD.format(dataset=d, shard=shards.ids(d)[0])
        for d in config["datasets"]
        if shards.ids(d) and d not in variant_only
    ]
