"""A dataset of thousands of shards makes planning itself slow (500,000 records at the default
shard size took 4.5 min and 1.5 GB): the real `snakemake` says so in one line at parse time,
naming the key to raise and a size, before it plans any job."""

from __future__ import annotations

import json

from workflow_helpers import copy_workflow, snakemake, tiny_config, write_config


def test_a_dataset_of_thousands_of_shards_is_told_its_shard_size_once(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    raw = workdir / "raw" / "tiny.jsonl"
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(2001)))
    config = tiny_config()
    config["datasets"]["tiny"]["shard_size"] = 1
    write_config(workdir, config)
    # --list-rules parses the workflow as every run does, without planning the 2,001 shards
    proc = snakemake(workdir, "--list-rules", timeout=300)
    advice = [line for line in proc.stderr.splitlines() if "shards (shard_size" in line]
    assert advice == [
        "datasets.tiny: 2,001 shards (shard_size 1): Snakemake plans several jobs a shard, so "
        "planning alone takes minutes and gigabytes; raise datasets.tiny.shard_size (e.g. to "
        "3: 667 shards). A new shard_size cuts the records anew: every shard of the dataset is "
        "rebuilt once"
    ]
    config["datasets"]["tiny"]["shard_size"] = 3
    write_config(workdir, config)
    assert "shards (shard_size" not in snakemake(workdir, "--list-rules", timeout=300).stderr
