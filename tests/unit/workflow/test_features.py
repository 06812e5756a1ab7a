from specbuild.config import train_variants
from specbuild.workflow.features import (
    align_shards,
    aux_layer_ids,
    backend_options,
    engine_memory,
)
from specbuild.workflow.shards import ShardIndex


def test_layer_ids_pass_as_configured_so_params_do_not_change_between_parses(default_config):
    assert aux_layer_ids(default_config) == []
    default_config["hidden"]["layer_ids"] = [1, 5, 8]
    assert aux_layer_ids(default_config) == [1, 5, 8]


def test_the_sglang_feature_backend_gets_no_memory_flag_in_params(default_config):
    assert backend_options(default_config, "hidden") == {}
    assert engine_memory(default_config, "hidden") == ""
    default_config["hidden"]["backend"] = "sglang"
    default_config["sglang"]["server_args"] = {"mem_fraction_static": 0.9, "tp_size": 2}
    default_config["sglang"]["hidden"]["mem_fraction_static"] = 0.3
    assert backend_options(default_config, "hidden")["server_args"] == {"tp_size": 2}
    assert engine_memory(default_config, "hidden") == "0.3"
    assert backend_options(default_config, "align") == {}  # align's backend is still hf


def test_align_samples_the_first_shard_of_each_dataset_but_variant_only_ones(default_config):
    shards = ShardIndex({"gsm8k": ["a", "b"], "chat": ["c"], "extra": ["d"]})
    default_config["datasets"]["extra"] = dict(default_config["datasets"]["gsm8k"])
    default_config["train"]["datasets"] = ["gsm8k", "chat"]
    default_config["train"]["variants"] = {"more": {"datasets": ["gsm8k", "chat", "extra"]}}
    assert align_shards(default_config, shards, train_variants(default_config)) == [
        "results/hidden/gsm8k/00000.safetensors",
        "results/hidden/chat/00000.safetensors",
    ]
