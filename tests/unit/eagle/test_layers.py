"""EAGLE-3 layer ids: specbuild's layer-output ids against the eagle_config ids SGLang 0.5.17's
model families turn into `layers_to_capture` (read from its deepseek_v2.py, llama.py and
gpt_oss.py; the gpu-marked tests check the same on the loaded models)."""

from __future__ import annotations

import pytest

from specbuild.eagle.layers import (
    architecture_of,
    capture_layers,
    eagle_layer_ids,
    output_layer_ids,
)

LLAMA, DEEPSEEK, KIMI, GPT_OSS = (
    "LlamaForCausalLM",
    "DeepseekV3ForCausalLM",
    "KimiK25ForConditionalGeneration",
    "GptOssForCausalLM",
)


def test_llama_always_captures_the_input_of_layer_id_plus_one():
    assert capture_layers(LLAMA, [1, 14, 26], 30) == [2, 15, 27]
    assert capture_layers(LLAMA, [2, 14, 26], 30) == [3, 15, 27]
    assert eagle_layer_ids(LLAMA, [0, 14, 26], 30) == [0, 14, 26]


@pytest.mark.parametrize("arch", [DEEPSEEK, KIMI, "DeepseekV2ForCausalLM"])
def test_deepseek_shifts_only_when_the_first_id_is_one(arch):
    assert capture_layers(arch, [1, 3, 4], 8) == [2, 4, 5]
    assert capture_layers(arch, [2, 4, 5], 8) == [2, 4, 5]
    # layer outputs 1, 3, 4 (the default for 8 layers) are reached with the ids as they are
    assert eagle_layer_ids(arch, [1, 3, 4], 8) == [1, 3, 4]
    # layer outputs 2, 4, 6 need ids already shifted, since a first id of 2 is not shifted
    assert eagle_layer_ids(arch, [2, 4, 6], 8) == [3, 5, 7]
    assert output_layer_ids(arch, [3, 5, 7], 8) == [2, 4, 6]


def test_deepseek_cannot_reach_the_output_of_layer_zero_and_says_why():
    with pytest.raises(ValueError, match=r"hidden.layer_ids \[0, 3, 4\].*first id is 1"):
        eagle_layer_ids(DEEPSEEK, [0, 3, 4], 8)


def test_gpt_oss_takes_ids_ending_at_the_depth_as_capture_indices():
    assert capture_layers(GPT_OSS, [2, 12, 24], 24) == [2, 12, 24]
    assert capture_layers(GPT_OSS, [1, 11, 20], 24) == [2, 12, 21]
    assert eagle_layer_ids(GPT_OSS, [1, 11, 23], 24) == [1, 11, 23]


@pytest.mark.parametrize("arch", [LLAMA, DEEPSEEK, KIMI, GPT_OSS, "Qwen3ForCausalLM"])
@pytest.mark.parametrize("ids", [[1, 3, 4], [2, 4, 6], [3, 5, 7]])
def test_the_chosen_eagle_ids_serve_exactly_the_trained_layers(arch, ids):
    assert output_layer_ids(arch, eagle_layer_ids(arch, ids, 8), 8) == ids


def test_the_architecture_is_the_folders_top_level_class():
    assert architecture_of({"architectures": [KIMI], "text_config": {}}) == KIMI
    assert architecture_of({}) == ""


def test_the_default_layer_ids_of_a_30_layer_target_are_1_14_26():
    from specbuild.eagle.layers import default_layer_ids

    assert default_layer_ids(30) == [1, 14, 26]
