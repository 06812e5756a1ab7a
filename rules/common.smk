"""Helpers for the rules: config validation, path helpers, params as plain builtins."""

from snakemake.utils import validate

from specbuild.samples import record_digests


validate(config, schema="../config/config.schema.yaml")


wildcard_constraints:
    dataset="[A-Za-z0-9_]+",
    shard="[0-9]{5}",


TARGET = config["target"]["name"]


def target_file(name):
    """A file of the materialized target folder."""
    return f"results/target/{TARGET}/{name}"


def dataset_config(dataset):
    return config["datasets"][dataset]


def _shard_digests(dataset):
    # Content digest of each shard's raw slice: a shard reruns only when its own records
    # change, never because records were appended after it.
    cfg = dataset_config(dataset)
    return record_digests(cfg["path"], shard_size=cfg["shard_size"], limit=cfg["limit"])


_DIGESTS = {name: _shard_digests(name) for name in config["datasets"]}


def shard_ids(dataset):
    return [f"{i:05d}" for i in range(len(_DIGESTS[dataset]))]


def shard_digest(wildcards):
    return _DIGESTS[wildcards.dataset][int(wildcards.shard)]


def shard_range(wildcards):
    size = dataset_config(wildcards.dataset)["shard_size"]
    start = int(wildcards.shard) * size
    return [start, start + size]


def per_shard(pattern):
    """Expand a results pattern over every (dataset, shard)."""
    return [
        pattern.format(dataset=d, shard=s) for d in config["datasets"] for s in shard_ids(d)
    ]


def aux_layer_ids():
    """hidden.layer_ids as configured: [] means the EAGLE-3 default, resolved at run time.

    Resolving [1, L//2-1, L-4] here would need the target's config.json, which does not exist
    at the first parse; the params would change between that parse and the next and rerun every
    hidden job. Passing the configured value keeps params stable; the job resolves it from
    fingerprint.json (an input, so a new target reruns it) and records the ids in the shard.
    """
    return list(config["hidden"]["layer_ids"])


def hidden_gpus():
    if config["hidden"]["backend"] == "sglang":
        return 1  # the serving engine runs on a GPU whatever `device` says
    return device_gpus(config["hidden"]["device"])


def all_outputs():
    return per_shard("results/hidden/{dataset}/{shard}.safetensors") + [
        "results/vocab/vocab.safetensors"
    ]
