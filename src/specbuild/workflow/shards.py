"""Every dataset's shards, fixed at parse time: their ids and the content digest of each.

A shard reruns only when its own records change (its digest is a param of `samples`), never
because records were appended after it. A synthetic shard has no raw records: its index range
(and its params) say everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from specbuild.samples import record_digests
from specbuild.workflow.datasets import dataset_size_limit, is_synthetic

__all__ = [
    "MANY_SHARDS",
    "DatasetFaults",
    "ShardIndex",
    "earlier_samples",
    "shard_advice",
    "shard_digests",
]

# Shards of one dataset above which planning itself costs: Snakemake plans several jobs per
# shard, and 7,813 shards (500,000 records at the default 64) took 4.5 min and 1.5 GB to plan.
MANY_SHARDS = 2000
# The shard count the advice aims at: well under MANY_SHARDS, still shards enough to spread.
ADVISED_SHARDS = 1000


class DatasetFaults(Exception):
    """Datasets whose file cannot be read or holds no record, one line per dotted key."""

    def __init__(self, faults: list[str]) -> None:
        super().__init__("; ".join(faults))
        self.faults = faults


def shard_digests(config: Mapping, dataset: str) -> list[str]:
    """One digest per shard of `dataset`, in shard order."""
    cfg, limit = config["datasets"][dataset], dataset_size_limit(config, dataset)
    if is_synthetic(config, dataset):
        size = cfg["shard_size"]
        return [f"synthetic {a}-{min(a + size, limit)}" for a in range(0, limit, size)]
    return record_digests(
        cfg["path"], shard_size=cfg["shard_size"], limit=limit, id_key=cfg["id_key"]
    )


class ShardIndex:
    """{dataset: [digest of each shard]}, in config order; shard ids are zero-padded indices."""

    def __init__(self, digests: Mapping[str, list[str]]) -> None:
        self.digests = dict(digests)

    @classmethod
    def read(cls, config: Mapping) -> ShardIndex:
        """Digest every dataset's shards; raise DatasetFaults naming each dataset whose file
        cannot be read or holds no record (a config fault, like the schema's)."""
        digests, faults = {}, []
        for name in config["datasets"]:
            try:
                digests[name] = shard_digests(config, name)
            except (OSError, ValueError) as err:
                faults.append(f"datasets.{name}.path: {err}")
                continue
            if not digests[name] and not is_synthetic(config, name):
                path = config["datasets"][name]["path"]
                faults.append(f"datasets.{name}.path: {path!r} holds no records")
        if faults:
            raise DatasetFaults(faults)
        return cls(digests)

    def ids(self, dataset: str) -> list[str]:
        return [f"{i:05d}" for i in range(len(self.digests[dataset]))]

    def digest(self, dataset: str, shard: str) -> str:
        return self.digests[dataset][int(shard)]

    def expand(self, pattern: str, datasets: Iterable[str] | None = None) -> list[str]:
        """`pattern` formatted with every (dataset, shard) of `datasets` (default: all)."""
        return [
            pattern.format(dataset=d, shard=s)
            for d in (self.digests if datasets is None else datasets)
            for s in self.ids(d)
        ]


def earlier_samples(config: Mapping, shards: ShardIndex, dataset: str, shard: str) -> list[str]:
    """The samples shards before this one of its dataset, which near-duplicate removal checks
    this shard's prompts against ([] when it is off). Each shard reads only earlier ones, so
    appending records never reruns a shard (the DAG holds k inputs for shard k)."""
    if config["datasets"][dataset]["near_duplicate_threshold"] is None:
        return []
    before = shards.ids(dataset)[: int(shard)]
    return [f"results/samples/{dataset}/{s}.jsonl" for s in before]


def shard_advice(config: Mapping, shards: ShardIndex) -> list[str]:
    """One line per dataset of more than MANY_SHARDS shards: the count, and a shard_size that
    makes about ADVISED_SHARDS of them."""
    lines = []
    for name, digests in shards.digests.items():
        n, size = len(digests), config["datasets"][name]["shard_size"]
        if n <= MANY_SHARDS:
            continue
        advised = -(-n * size // ADVISED_SHARDS)  # ceiling: at most ADVISED_SHARDS shards
        lines.append(
            f"datasets.{name}: {n:,} shards (shard_size {size}): Snakemake plans several jobs a "
            f"shard, so planning alone takes minutes and gigabytes; raise "
            f"datasets.{name}.shard_size (e.g. to {advised}: {-(-n * size // advised):,} "
            "shards). A new shard_size cuts the records anew: every shard of the dataset is "
            "rebuilt once"
        )
    return lines
