"""Block drafters' export: the folder SGLang 0.5.17 loads as DFlashDraftModel / DSparkDraftModel,
and a refusal for each way its loaders would take a wrong folder without a word (a missing,
renamed or misplaced tensor, the Markov keys only under dspark_config, a layer id SGLang
never captures, a mask token past the vocabulary)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from specbuild.block_export import block_faults, config_from_export
from specbuild.drafter.block import BlockConfig, BlockDrafter, load_block_drafter
from specbuild.drafter.state import save_drafter
from specbuild.export import ExportError, check_export, export_faults, export_for_sglang

TARGET = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 8,
    "vocab_size": 50,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "max_position_embeddings": 2048,
    "eos_token_id": 2,
}


def _checkpoint(tmp_path, family: str):
    cfg = BlockConfig.from_target(
        TARGET,
        family=family,
        drafts=3,
        num_layers=2,
        mask_token_id=7,
        mask_token="<mask>",
        markov_rank=4 if family == "dspark" else 0,
    )
    torch.manual_seed(0)
    model = BlockDrafter(cfg)
    meta = {
        "drafter_config": cfg.to_dict(),
        "layer_ids": [1, 3, 5],
        "eagle_layer_ids": None,
        "target_fingerprint": "t",
        "target_config": TARGET,
        "family": family,
    }
    path = tmp_path / f"{family}.safetensors"
    save_drafter(path, model.export_state(), meta)
    return path, model


@pytest.fixture(params=["dflash", "dspark"])
def exported(request, tmp_path):
    ckpt, model = _checkpoint(tmp_path, request.param)
    out = tmp_path / "drafter"
    export_for_sglang(checkpoint=ckpt, out_dir=out, dtype="float32")
    return request.param, out, model


def test_block_export_is_the_form_sglang_loads(exported):
    family, out, model = exported
    hf = json.loads((out / "config.json").read_text())
    assert hf["architectures"] == [
        {"dflash": "DFlashDraftModel", "dspark": "DSparkDraftModel"}[family]
    ]
    # DFlash's block holds the last token and 3 drafts; DSpark's gamma is the drafts
    assert hf["block_size"] == hf["dflash_config"]["block_size"] == (4 if family == "dflash" else 3)
    assert hf["dflash_config"]["target_layer_ids"] == [1, 3, 5]
    assert (
        hf["dflash_config"]["mask_token_id"] == 7 and hf["dflash_config"]["mask_token"] == "<mask>"
    )
    assert hf["num_hidden_layers"] == 2 and hf["num_target_layers"] == 8
    if family == "dspark":  # read at the top level only
        assert (hf["markov_rank"], hf["markov_head_type"], hf["mask_token_id"]) == (4, "vanilla", 7)
    names = set(load_file(str(out / "model.safetensors")))
    assert "embed_tokens.weight" not in names and "lm_head.weight" not in names
    assert ("markov_head.markov_w1.weight" in names) == (family == "dspark")
    assert export_faults(out) == []
    # and it reloads into the very drafter that was saved
    back = load_block_drafter(
        out, config_from_export(hf), model.embed_tokens.weight, model.lm_head.weight
    )
    for k, v in model.export_state().items():
        assert torch.equal(back.state_dict()[k], v), k


def _tamper(out, change) -> None:
    path = out / "model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def test_a_missing_renamed_or_misplaced_tensor_is_refused(exported, tmp_path):
    family, out, _ = exported
    cases = {
        "missing tensor 'layers.1.self_attn.k_norm.weight'": lambda t: t.pop(
            "layers.1.self_attn.k_norm.weight"
        ),
        "unexpected tensor 'fcx.weight'": lambda t: t.__setitem__("fcx.weight", t.pop("fc.weight")),
        # a layer's weight under another layer's name: shapes agree, the count does not
        "unexpected tensor 'layers.2.mlp.up_proj.weight'": lambda t: t.__setitem__(
            "layers.2.mlp.up_proj.weight", t.pop("layers.1.mlp.up_proj.weight")
        ),
    }
    for message, change in cases.items():
        copy = tmp_path / "case"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(out, copy)
        _tamper(copy, change)
        with pytest.raises(ExportError, match=message.replace("(", r"\(").replace(".", r"\.")):
            check_export(copy)


def test_config_keys_sglang_reads_silently_wrong_are_refused(exported):
    family, out, _ = exported
    hf = json.loads((out / "config.json").read_text())
    last = dict(hf, dflash_config={**hf["dflash_config"], "target_layer_ids": [1, 3, 7]})
    assert any("never captures" in f for f in block_faults(last))
    past = dict(hf, dflash_config={**hf["dflash_config"], "mask_token_id": 50})
    assert any("mask_token_id is 50" in f for f in block_faults(past))
    if family == "dspark":
        nested = {k: v for k, v in hf.items() if k not in ("markov_rank", "markov_head_type")}
        nested["dspark_config"] = {"markov_rank": 4, "markov_head_type": "vanilla"}
        faults = block_faults(nested)
        assert any("markov_rank missing at the top level" in f for f in faults), faults
