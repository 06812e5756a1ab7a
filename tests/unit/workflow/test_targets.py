from specbuild.workflow.shards import ShardIndex
from specbuild.workflow.targets import all_outputs


def test_all_builds_every_hidden_shard_every_variants_drafter_and_serve(default_config):
    outputs = all_outputs(
        default_config, ShardIndex({"gsm8k": ["a"], "chat": ["b"]}), ("base", "v")
    )
    assert outputs[:2] == [
        "results/hidden/gsm8k/00000.safetensors",
        "results/hidden/chat/00000.safetensors",
    ]
    assert "results/drafter/v/model.safetensors" in outputs
    assert outputs[-1] == "results/serve.sh" and len(outputs) == len(set(outputs))
