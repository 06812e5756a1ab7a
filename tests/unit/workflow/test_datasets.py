from specbuild.workflow.datasets import (
    answers_per_prompt,
    conversation_turns,
    dataset_setting,
    datasets_regex,
    follow_up_sampling,
    sampling_params,
    shard_range,
    synthesize_sampling,
)
from specbuild.workflow.shards import ShardIndex, earlier_samples


def test_each_shard_samples_with_its_own_seed(default_config):
    default_config["generate"]["seed"] = 10
    assert sampling_params(default_config, "gsm8k", "00003")["seed"] == 13


def test_a_datasets_own_max_new_tokens_wins_over_generates(default_config):
    default_config["datasets"]["gsm8k"]["max_new_tokens"] = 7
    assert sampling_params(default_config, "gsm8k", "00000")["max_new_tokens"] == 7
    assert (
        sampling_params(default_config, "chat", "00000")["max_new_tokens"]
        == (default_config["generate"]["max_new_tokens"])
    )


def test_a_datasets_own_temperature_wins_over_generates_and_null_changes_no_param(default_config):
    before = sampling_params(default_config, "chat", "00000")
    assert default_config["datasets"]["chat"]["temperature"] is None  # the schema's default
    default_config["generate"]["temperature"] = 0.0
    default_config["datasets"]["chat"]["temperature"] = 0.8
    assert sampling_params(default_config, "chat", "00000")["temperature"] == 0.8
    assert sampling_params(default_config, "gsm8k", "00000")["temperature"] == 0.0
    default_config["datasets"]["chat"]["temperature"] = None
    default_config["generate"]["temperature"] = before["temperature"]
    assert sampling_params(default_config, "chat", "00000") == before


def test_the_last_shard_stops_at_the_datasets_limit(default_config):
    default_config["datasets"]["gsm8k"].update(limit=70, shard_size=32)
    assert shard_range(default_config, "gsm8k", "00002") == [64, 70]
    default_config["datasets"]["gsm8k"]["limit"] = None
    assert shard_range(default_config, "gsm8k", "00002") == [64, 96]


def test_file_and_synthetic_datasets_are_told_apart_by_the_constraint(default_config):
    assert datasets_regex(default_config, synthetic=False) == "gsm8k"
    assert datasets_regex(default_config, synthetic=True) == "chat"
    del default_config["datasets"]["chat"]
    assert datasets_regex(default_config, synthetic=True) == "(?!)"


def test_follow_up_turns_sample_like_the_self_written_prompts_only_when_there_are_some(
    default_config,
):
    assert conversation_turns(default_config, "gsm8k") == 1
    assert follow_up_sampling(default_config, "chat") == {}
    default_config["datasets"]["chat"]["synthesize"]["turns"] = 3
    assert follow_up_sampling(default_config, "chat") == synthesize_sampling(default_config, "chat")


def test_openers_join_the_prompts_sampling_param_only_when_set_and_never_a_follow_ups(
    default_config,
):
    # without openers the param is what it was: shards already written stay up to date
    assert set(synthesize_sampling(default_config, "chat")) == {
        "max_new_tokens",
        "temperature",
        "top_p",
        "seed",
    }
    synth = default_config["datasets"]["chat"]["synthesize"]
    synth["openers"], synth["turns"] = ["Write", "Explain"], 2
    assert synthesize_sampling(default_config, "chat")["openers"] == ["Write", "Explain"]
    assert "openers" not in follow_up_sampling(default_config, "chat")


def test_near_duplicate_removal_reads_only_the_earlier_shards(default_config):
    shards = ShardIndex({"gsm8k": ["a", "b", "c"], "chat": ["x", "y"]})
    assert earlier_samples(default_config, shards, "gsm8k", "00002") == []  # off
    default_config["datasets"]["gsm8k"]["near_duplicate_threshold"] = 0.9
    assert earlier_samples(default_config, shards, "gsm8k", "00002") == [
        "results/samples/gsm8k/00000.jsonl",
        "results/samples/gsm8k/00001.jsonl",
    ]
    assert dataset_setting(default_config, "near_duplicate_threshold", "chat") == 0.8


def test_answers_per_prompt_is_a_param_no_other_generate_param_can_equal(default_config):
    # Snakemake compares params as a set of values: a bare 2 would be rows_version's 2
    assert answers_per_prompt(default_config, "gsm8k") == {}
    default_config["datasets"]["gsm8k"]["answers"] = 2
    assert answers_per_prompt(default_config, "gsm8k") == {"answers": 2}
    assert answers_per_prompt(default_config, "chat") == {}
