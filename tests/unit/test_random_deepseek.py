"""benchmarks/h200/random_deepseek.py, the writer of the DeepSeek-V3 example's target: its folder
is what transformers and the target stage read as a DeepSeek-V3 checkpoint (no weight
missing or unexpected), and its Kimi-K2.5 layout moves every tensor under `language_model.`."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from specbuild.target import read_target_info


def test_the_target_loads_in_transformers_with_every_weight_named_as_deepseeks(deepseek_target):
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(deepseek_target, output_loading_info=True)
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    assert not any(info.values()), info  # missing, unexpected, mismatched: none
    target = read_target_info(deepseek_target / "fingerprint.json")
    assert (target.num_hidden_layers, target.hidden_size, target.vocab_size) == (8, 2048, 49152)


@pytest.mark.slow  # writes a full-width checkpoint (200M parameters), as deepseek_target does
def test_the_kimi_layout_wraps_the_same_text_model(tmp_path, target_dir, random_deepseek):
    config, _, params = random_deepseek.write_target(
        tmp_path, target_dir, layers=2, wrapper=True, **random_deepseek.TEST_WIDTHS
    )
    assert config["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert config["text_config"]["architectures"] == ["DeepseekV3ForCausalLM"]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert all(name.startswith("language_model.") for name in index)
    assert "language_model.model.layers.1.mlp.experts.7.down_proj.weight" in index
    assert "language_model.lm_head.weight" in index
    with safe_open(str(tmp_path / index["language_model.lm_head.weight"]), "pt") as f:
        assert list(f.get_slice("language_model.lm_head.weight").get_shape()) == [49152, 2048]
    assert params > 200_000_000  # embedding and lm_head alone: 2 x 49152 x 2048
