from specbuild.workflow.rejects import (
    REJECT_STAGES,
    reject_counts_files,
    reject_limit,
    reject_limits,
)
from specbuild.workflow.shards import ShardIndex


def test_self_written_samples_are_judged_by_their_datasets_own_limit(default_config):
    default_config["samples"]["max_rejected_fraction"] = 0.1
    assert reject_limit(default_config, "samples", "chat") == {
        "limit": 0.6,
        "setting": "datasets.chat.synthesize.max_rejected_fraction",
    }
    assert reject_limit(default_config, "samples", "gsm8k") == {
        "limit": 0.1,
        "setting": "samples.max_rejected_fraction",
    }
    assert reject_limit(default_config, "tokenized", "chat")["setting"] == (
        "tokenize.max_rejected_fraction"
    )


def test_the_reject_table_knows_every_stages_limit_of_every_dataset(default_config):
    limits = reject_limits(default_config)
    assert set(limits) == {f"{s}/{d}" for s in REJECT_STAGES for d in ("gsm8k", "chat")}


def test_every_shard_of_every_stage_has_a_counts_file():
    files = reject_counts_files(ShardIndex({"d": ["a", "b"]}))
    assert files[:2] == [
        "results/samples/d/00000.counts.json",
        "results/samples/d/00001.counts.json",
    ]
    assert len(files) == 2 * len(REJECT_STAGES)
