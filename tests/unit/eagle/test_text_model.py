"""specbuild.eagle.text_model finds a target's text model, wrapper or not, and every stage reading
the target's tensors (teacher, drafter init) reads them through it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from specbuild.drafter.teacher import read_target_weights
from specbuild.eagle.text_model import find_text_model

TEXT = {"model_type": "llama", "hidden_size": 4, "vocab_size": 8, "num_hidden_layers": 1}


def _folder(tmp_path, names, *, wrapped=True):
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["W"], "text_config": TEXT} if wrapped else dict(TEXT)
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = {n: torch.full((8, 4), float(i)) for i, n in enumerate(names)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


@pytest.mark.parametrize(
    "names, decoder, head",
    [
        # Kimi-K2.5: the whole causal LM under language_model.
        (
            ["language_model.model.embed_tokens.weight", "language_model.lm_head.weight"],
            "language_model.model.",
            "language_model.lm_head.weight",
        ),
        # transformers' Llava and kin: the decoder inside model., the head at the top
        (
            ["model.language_model.embed_tokens.weight", "lm_head.weight"],
            "model.language_model.",
            "lm_head.weight",
        ),
        # a plain causal LM, head tied to the embedding
        (["model.embed_tokens.weight"], "model.", None),
    ],
)
def test_the_text_model_is_found_under_whatever_prefix_the_folder_uses(
    tmp_path, names, decoder, head
):
    text = find_text_model(_folder(tmp_path, [*names, "vision_tower.proj.weight"]))
    assert (text.decoder_prefix, text.head) == (decoder, head)
    assert (text.hidden_size, text.vocab_size, text.num_hidden_layers) == (4, 8, 1)
    assert text.tensor_name("model.norm.weight") == decoder + "norm.weight"
    assert text.tensor_name("lm_head.weight") == (head or decoder + "embed_tokens.weight")
    assert text.plain_name("vision_tower.proj.weight") is None


def test_two_embeddings_are_told_apart_by_the_final_norm_beside_one(tmp_path):
    names = [
        "language_model.model.embed_tokens.weight",
        "language_model.model.norm.weight",
        "vision.model.embed_tokens.weight",
    ]
    assert find_text_model(_folder(tmp_path, names)).decoder_prefix == "language_model.model."


def test_a_folder_without_an_embedding_names_what_it_looked_for(tmp_path):
    with pytest.raises(ValueError, match="embed_tokens.weight under prefixes none"):
        find_text_model(_folder(tmp_path, ["transformer.wte.weight"], wrapped=False))


def test_the_teacher_reads_a_kimi_layout_targets_tensors_by_their_plain_names(
    target_dir, kimi_layout_target
):
    names = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    ours = read_target_weights(kimi_layout_target, names)
    smol = read_target_weights(target_dir, names)  # tied: its lm_head is the embedding
    for name in names:
        assert torch.equal(ours[name], smol[name]), name


def test_the_hf_backend_runs_a_wrappers_text_model_as_the_plain_folder_does(
    target_dir, target_model, kimi_layout_target, caplog
):
    from specbuild.target import load_target_model

    with caplog.at_level("INFO", logger="specbuild"):
        wrapped = load_target_model(kimi_layout_target)
    # the line benchmarks/engine_loads.py counts a load by
    assert "loaded the target's text model with transformers on cpu (float32)" in caplog.text
    assert type(wrapped) is type(target_model)
    ids = torch.tensor([[1, 42, 7, 99, 3]])
    with torch.no_grad():
        assert torch.allclose(wrapped(ids).logits, target_model(ids).logits, atol=1e-5)


def test_drafter_init_and_export_take_a_wrappers_text_model_shapes_and_layer(
    target_dir, kimi_layout_target
):
    from specbuild.drafter.config import DrafterConfig
    from specbuild.drafter.model import Eagle3Drafter
    from specbuild.drafter.target_init import init_from_target_layer
    from specbuild.export import hf_config

    wrapper = json.loads((kimi_layout_target / "config.json").read_text())
    assert "hidden_size" not in wrapper  # only text_config has the shapes
    cfg = DrafterConfig.from_target(wrapper, draft_vocab_size=32)
    model = Eagle3Drafter(cfg)
    lines = init_from_target_layer(model, kimi_layout_target)
    assert len(lines) == 9 and "model.layers.29.mlp.down_proj.weight" in lines[-1]
    (smol,) = read_target_weights(target_dir, ["model.layers.29.mlp.down_proj.weight"]).values()
    assert torch.equal(model.midlayer.mlp.down_proj.weight, smol.float())
    exported = hf_config(cfg, layer_ids=[1, 14, 26], target_config=wrapper, dtype="bfloat16")
    assert (exported["target_hidden_size"], exported["vocab_size"]) == (576, 49152)
    assert exported["eos_token_id"] == wrapper["text_config"]["eos_token_id"]


@pytest.mark.slow  # decodes with the real SmolLM2
def test_the_hf_generation_backend_decodes_a_wrapper_as_the_plain_folder(
    target_dir, kimi_layout_target
):
    from specbuild.backends.base import GenerationRequest, SamplingParams
    from specbuild.backends.hf import HFBackend

    wrapped = HFBackend(kimi_layout_target, device="cpu", batch_size=1)
    # the folder's generation_config.json: its end-of-turn id stops decoding
    assert wrapped.lm.generation_config.eos_token_id in wrapped.stop_ids
    ids = [1, 4093, 2]  # raw ids: both tokenizers share them, unlike their chat templates
    request = [GenerationRequest(id="r", prompt=ids)]
    sampling = SamplingParams(max_new_tokens=6)
    ours = wrapped.generate(request, sampling)[0]
    plain = HFBackend(target_dir, device="cpu", batch_size=1).generate(request, sampling)[0]
    assert ours.completion_tokens > 0
    assert (ours.content, ours.completion_tokens) == (plain.content, plain.completion_tokens)


def test_a_wrapped_deepseek_v3_runs_as_its_plain_twin(deepseek_target, kimi_target):
    """benchmarks/h200/random_deepseek.py's two layouts of the same draws: Kimi-K2.5's wrapper
    around DeepSeek-V3 (MLA + MoE) and the plain folder give the same logits on the CPU."""
    from specbuild.target import load_target_model

    assert find_text_model(kimi_target).decoder_prefix == "language_model.model."
    ids = torch.tensor([[1, 42, 7, 99, 3]])
    with torch.no_grad():
        ours = load_target_model(kimi_target)(ids).logits
        plain = load_target_model(deepseek_target)(ids).logits
    assert torch.allclose(ours, plain, atol=1e-5)
