"""Export gate: the folder SGLang loads holds exactly the weights the drafter was trained with.

SGLang skips unknown weight names silently and ties lm_head to the embedding when told to, so
the validator must catch a missing, extra or misshapen tensor before a server ever sees it,
and a reloaded export must compute bit-identical logits.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.synthetic import SyntheticSpec, make_workspace
from specbuild.drafter.model import DrafterConfig, Eagle3Drafter
from specbuild.drafter.state import read_drafter, save_drafter
from specbuild.drafter.train import TrainConfig, TrainFiles, train_drafter
from specbuild.export import ExportError, check_export, export_for_sglang

SGLANG_KEYS = {
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
    "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    ws = make_workspace(root / "ws", SyntheticSpec(samples=8, seq_len=16))
    train_drafter(
        files=TrainFiles(
            shards=ws["shards"],
            vocab=ws["vocab"],
            target_fingerprint=ws["target_fingerprint"],
            best_out=str(root / "best.safetensors"),
            metrics_out=str(root / "metrics.jsonl"),
            state_dir=str(root / "state"),
        ),
        threads=1,
        config=TrainConfig(
            epochs=1, token_budget=64, max_length=16, eval_fraction=0, ttt_steps=2, lr=1e-3
        ),
    )
    embed = load_file(str(root / "ws" / "target" / "model.safetensors"))[
        "model.embed_tokens.weight"
    ]
    return root / "best.safetensors", embed, ws


@pytest.fixture
def exported(trained, tmp_path):
    export_for_sglang(checkpoint=trained[0], out_dir=tmp_path / "drafter", dtype="bfloat16")
    return tmp_path / "drafter"


def trained_model(checkpoint, embed) -> Eagle3Drafter:
    tensors, meta = read_drafter(checkpoint)
    model = Eagle3Drafter(DrafterConfig.from_dict(meta["drafter_config"]))
    model.load_state_dict(tensors | {"embed_tokens.weight": embed.float()})
    return model.eval()


def test_export_holds_exactly_the_sglang_keys_and_passes_the_check(exported):
    assert sorted(p.name for p in exported.iterdir()) == ["config.json", "model.safetensors"]
    assert set(load_file(str(exported / "model.safetensors"))) == SGLANG_KEYS
    check_export(exported)


def test_config_carries_target_rope_layer_ids_and_an_untied_head(exported, trained):
    cfg = json.loads((exported / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 1 and cfg["tie_word_embeddings"] is False
    assert (cfg["draft_vocab_size"], cfg["vocab_size"], cfg["target_hidden_size"]) == (128, 256, 64)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == trained[2]["layer_ids"]
    assert (cfg["rope_theta"], cfg["max_position_embeddings"]) == (10000.0, 4096)
    assert cfg["torch_dtype"] == "bfloat16"


def _rewrite(folder, edit):
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def test_validator_fails_on_missing_d2t(exported):
    _rewrite(exported, lambda t: t.pop("d2t"))
    with pytest.raises(ExportError, match="missing tensor 'd2t'"):
        check_export(exported)


def test_validator_fails_on_an_extra_key(exported):
    _rewrite(exported, lambda t: t.update({"embed_tokens.weight": torch.zeros(256, 64)}))
    with pytest.raises(ExportError, match="unexpected tensor 'embed_tokens.weight'"):
        check_export(exported)


def test_validator_fails_on_a_wrong_shape(exported):
    _rewrite(exported, lambda t: t.update({"fc.weight": t["fc.weight"][:, :64].contiguous()}))
    with pytest.raises(ExportError, match=r"fc.weight has shape \[64, 64\], expected \[64, 192\]"):
        check_export(exported)


def test_validator_lists_every_fault_at_once(exported):
    def edit(t):
        t.pop("d2t")
        t["extra"] = torch.zeros(1)
        t["norm.weight"] = torch.ones(3, dtype=torch.bfloat16)

    _rewrite(exported, edit)
    cfg = json.loads((exported / "config.json").read_text())
    (exported / "config.json").write_text(json.dumps(cfg | {"tie_word_embeddings": True}))
    (exported / "notes.txt").write_text("x")
    with pytest.raises(ExportError) as err:
        check_export(exported)
    assert "tie_word_embeddings" in str(err.value) and "unexpected file notes.txt" in str(err.value)
    (exported / "notes.txt").unlink()
    (exported / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError) as err:
        check_export(exported)
    msg = str(err.value)
    assert "3 fault(s)" in msg and "'d2t'" in msg and "'extra'" in msg and "norm.weight" in msg


def test_validator_fails_on_nan_or_inf_weights(exported):
    def edit(t):
        t["fc.weight"][0, :3] = float("nan")
        t["lm_head.weight"][5, 5] = float("inf")

    _rewrite(exported, edit)
    with pytest.raises(ExportError) as err:
        check_export(exported)
    msg = str(err.value)
    assert "fc.weight holds 3 NaN/Inf" in msg and "lm_head.weight holds 1 NaN/Inf" in msg


def test_a_non_finite_checkpoint_is_refused_before_anything_is_written(trained, tmp_path):
    tensors, meta = read_drafter(trained[0])
    tensors["midlayer.mlp.up_proj.weight"][1, 2] = float("nan")
    bad = tmp_path / "best.safetensors"
    save_drafter(bad, tensors, meta)
    with pytest.raises(ExportError) as err:
        export_for_sglang(checkpoint=bad, out_dir=tmp_path / "drafter")
    msg = str(err.value)
    assert msg.startswith(f"{bad}: 1 of {len(tensors)} tensors hold NaN/Inf")
    assert "midlayer.mlp.up_proj.weight: 1" in msg and "snakemake --forcerun train" in msg
    assert not (tmp_path / "drafter").exists()


def test_a_float16_export_that_overflows_is_refused_naming_the_tensor(trained, tmp_path):
    tensors, meta = read_drafter(trained[0])
    tensors["fc.weight"][0, 0] = 1e6  # finite in float32, Inf in float16
    big = tmp_path / "best.safetensors"
    save_drafter(big, tensors, meta)
    with pytest.raises(
        ExportError, match=r"float16 overflows to Inf in fc.weight \(1 value\(s\)\)"
    ):
        export_for_sglang(checkpoint=big, out_dir=tmp_path / "drafter", dtype="float16")
    export_for_sglang(checkpoint=big, out_dir=tmp_path / "drafter", dtype="bfloat16")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reloaded_export_gives_identical_logits(trained, tmp_path, dtype):
    checkpoint, embed, _ = trained
    export_for_sglang(checkpoint=checkpoint, out_dir=tmp_path / dtype, dtype=dtype)
    reloaded = Eagle3Drafter.from_pretrained(tmp_path / dtype, embed.float())
    original = trained_model(checkpoint, embed).to(getattr(torch, dtype))
    torch.manual_seed(0)
    ids, aux = torch.randint(0, 256, (2, 7)), torch.randn(2, 7, 192)
    pos = torch.arange(7).expand(2, 7)
    with torch.no_grad():
        h_a, logits_a = original(ids, original.project(aux), pos)
        h_b, logits_b = reloaded(ids, reloaded.project(aux), pos)
    assert logits_a.dtype == getattr(torch, dtype)
    assert torch.equal(logits_a, logits_b) and torch.equal(h_a, h_b)


def test_from_pretrained_rejects_an_embedding_of_another_target(exported):
    with pytest.raises(ValueError, match="embed_tokens_weight shape"):
        Eagle3Drafter.from_pretrained(exported, torch.zeros(10, 64))


def _retarget(trained, tmp_path, **meta_changes):
    """The trained checkpoint with its metadata changed (another target's facts)."""
    tensors, meta = read_drafter(trained[0])
    path = tmp_path / "retargeted.safetensors"
    save_drafter(path, tensors, meta | meta_changes)
    return path


def test_eagle_ids_follow_sglangs_rule_for_a_deepseek_target(trained, tmp_path):
    # SGLang's DeepSeek-V3 shifts eagle ids only when the first is 1: layer outputs 1, 3, 5
    # take the ids as they are, layer outputs 2, 3, 5 need them shifted by hand
    _, meta = read_drafter(trained[0])
    deepseek = meta["target_config"] | {"architectures": ["DeepseekV3ForCausalLM"]}
    for layer_ids, eagle in (([1, 3, 5], [1, 3, 5]), ([2, 3, 5], [3, 4, 6])):
        ckpt = _retarget(
            trained, tmp_path, target_config=deepseek, layer_ids=layer_ids, eagle_layer_ids=None
        )
        export_for_sglang(checkpoint=ckpt, out_dir=tmp_path / "d", dtype="bfloat16")
        cfg = json.loads((tmp_path / "d" / "config.json").read_text())
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == eagle


def test_eagle_ids_recorded_by_the_hidden_stage_win(trained, tmp_path):
    assert read_drafter(trained[0])[1]["eagle_layer_ids"] == trained[2]["layer_ids"]  # via train
    ckpt = _retarget(trained, tmp_path, layer_ids=[2, 3, 5], eagle_layer_ids=[3, 4, 6])
    export_for_sglang(checkpoint=ckpt, out_dir=tmp_path / "d", dtype="bfloat16")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 4, 6]
