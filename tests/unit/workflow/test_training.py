import pytest

from specbuild.config import train_variants
from specbuild.workflow.shards import ShardIndex
from specbuild.workflow.training import (
    eval_set_shards,
    train_cadence,
    train_hparams,
    train_init_files,
    variant_shards,
    vocab_datasets,
    vocab_file,
    vocab_stats_file,
)


def test_a_variants_hparams_are_its_whole_recipe_but_its_datasets(default_config):
    default_config["train"]["variants"] = {"fast": {"lr": 1e-3, "datasets": ["chat"]}}
    variants = train_variants(default_config)
    hparams = train_hparams(variants, "fast")
    assert hparams["lr"] == 1e-3 and "datasets" not in hparams
    assert train_hparams(variants, "base")["lr"] == default_config["train"]["lr"]


def test_logging_and_checkpoint_cadence_are_resources_of_the_job_not_its_params(default_config):
    default_config["train"]["variants"] = {"slow_log": {"log_interval": 500}}
    variants = train_variants(default_config)
    for variant in variants:
        assert not {"log_interval", "save_interval"} & train_hparams(variants, variant).keys()
    assert train_hparams(variants, "slow_log") == train_hparams(variants, "base")
    assert train_cadence(variants, "log_interval", "slow_log") == "500"
    assert train_cadence(variants, "save_interval", "base") == str(
        default_config["train"]["save_interval"]
    )
    with pytest.raises(ValueError, match="not a cadence key"):
        train_cadence(variants, "lr", "base")


def test_a_key_added_later_enters_the_params_only_away_from_its_neutral_value(default_config):
    """A build made before acceptance_weight existed stays up to date; setting it reruns."""
    default_config["train"]["variants"] = {"lk": {"acceptance_weight": 0.5}}
    variants = train_variants(default_config)
    assert variants["base"]["acceptance_weight"] == 0.0  # the schema's default, filled in
    assert "acceptance_weight" not in train_hparams(variants, "base")
    assert train_hparams(variants, "lk")["acceptance_weight"] == 0.5


@pytest.mark.parametrize("key,value", [("norm_output", True), ("draft_attention", "mla")])
def test_the_mla_and_eagle31_keys_enter_the_params_only_when_set(default_config, key, value):
    """`auto` keeps Llama targets' drafters as they were, and norm_output off trains as before:
    a build made before either key existed reruns nothing; setting one reruns its variant."""
    default_config["train"]["variants"] = {"set": {key: value}}
    variants = train_variants(default_config)
    assert key not in train_hparams(variants, "base")
    assert train_hparams(variants, "set")[key] == value


def test_a_variant_trains_on_the_hidden_shards_of_its_own_datasets(default_config):
    default_config["train"]["variants"] = {"chat_only": {"datasets": ["chat"]}}
    shards = ShardIndex({"gsm8k": ["a", "b"], "chat": ["c"]})
    variants = train_variants(default_config)
    assert variant_shards(default_config, shards, variants, "chat_only") == [
        "results/hidden/chat/00000.safetensors"
    ]
    assert len(variant_shards(default_config, shards, variants, "base")) == 3


def test_a_warm_start_reads_the_drafter_folder_files(default_config):
    default_config["train"]["variants"] = {"warm": {"init_from": "elsewhere/drafter/"}}
    variants = train_variants(default_config)
    assert train_init_files(variants, "base") == []
    assert train_init_files(variants, "warm") == [
        "elsewhere/drafter/config.json",
        "elsewhere/drafter/model.safetensors",
    ]


def test_the_held_out_set_is_neither_in_the_vocab_nor_trained_on(default_config):
    shards = ShardIndex({"gsm8k": ["a"], "chat": ["c"]})
    assert eval_set_shards(default_config, shards) == []
    default_config["train"]["eval_set"] = "chat"
    assert vocab_datasets(default_config) == ["gsm8k"]
    assert eval_set_shards(default_config, shards) == ["results/hidden/chat/00000.safetensors"]


def test_a_variant_on_other_datasets_counts_its_own_vocabulary(default_config):
    default_config["datasets"]["chat"] = dict(default_config["datasets"]["gsm8k"])
    default_config["train"]["datasets"] = ["gsm8k"]
    default_config["train"]["variants"] = {
        "more": {"datasets": ["gsm8k", "chat"]},
        "same": {"datasets": ["gsm8k"], "lr": 1e-3},
        "faster": {"lr": 1e-3},
    }
    variants = train_variants(default_config)
    assert vocab_file(default_config, variants, "more") == "results/vocab/more/vocab.safetensors"
    for shared in ("base", "same", "faster"):
        assert vocab_file(default_config, variants, shared) == "results/vocab/vocab.safetensors"
    assert (
        vocab_stats_file(default_config, variants, "more") == "results/vocab/more/vocab_stats.json"
    )
    assert vocab_stats_file(default_config, variants, "base") == "results/vocab/vocab_stats.json"
