"""benchmarks/h200/random_deepseek.py, the writer of the DeepSeek-V3 example's target: its folder
is what transformers and the target stage read as a DeepSeek-V3 checkpoint (no weight
missing or unexpected), and its Kimi-K2.5 layout moves every tensor under `language_model.`."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from specbuild.eagle.target_info import read_target_info


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


def test_the_kimi_layout_gives_sglang_its_vision_config_and_processor(kimi_target, tokenizer):
    """What SGLang 0.5.17 reads from a Kimi-K2.5 folder before any text runs: the projector's
    widths from `vision_config` (vt_hidden_size, merge_kernel_size, text_hidden_size at the
    text model's width), and the remote-code processor's media_proc_cfg and tokenizer."""
    from transformers import AutoProcessor

    config = json.loads((kimi_target / "config.json").read_text())
    vision, text = config["vision_config"], config["text_config"]
    assert vision["text_hidden_size"] == text["hidden_size"]
    assert vision["vt_hidden_size"] == vision["mm_hidden_size"]
    assert len(vision["merge_kernel_size"]) == 2
    processor = AutoProcessor.from_pretrained(kimi_target, trust_remote_code=True)
    cfg = processor.media_processor.media_proc_cfg
    for key in ("patch_size", "merge_kernel_size", "in_patch_limit", "patch_limit_on_one_side"):
        assert isinstance(cfg[key], int), key
    assert len(cfg["image_mean"]) == len(cfg["image_std"]) == 3
    ids = processor(text="Name three colours.")["input_ids"]
    assert ids == tokenizer("Name three colours.")["input_ids"]
    with pytest.raises(ValueError, match="no vision weights"):
        processor(text="a picture", images=[object()])
    assert read_target_info(kimi_target / "fingerprint.json").trust_remote_code
