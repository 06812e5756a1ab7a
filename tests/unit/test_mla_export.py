"""An MLA drafter from training to the folder SGLang loads as `Eagle3DeepseekV2ForCausalLM`.

A synthetic DeepSeek-V3-shaped target (benchmarks.synthetic with MLA's config keys) gets an
MLA drafter from `train.draft_attention: auto`; it trains, its export holds exactly the tensor
names and shapes SGLang's MLA draft loads, with the keys its config reader needs, and a folder
SGLang would load wrongly without a word (a random head, a dropped down projection) is refused
by export's check and by the parse-time check of a folder built elsewhere, naming the fault.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.synthetic import SyntheticSpec, make_workspace, target_config, train_outputs
from specbuild.drafter.build import build_drafter, warm_start
from specbuild.drafter.train import TrainConfig, TrainFiles, train_drafter
from specbuild.eagle.drafter_fit import external_drafter_faults
from specbuild.export import ExportError, check_export, export_for_sglang

# q_lora 32, kv_lora 16, nope 8, rope 8, v 12 at hidden 64 and 4 heads
SPEC = SyntheticSpec(samples=16, seq_len=24, mla=(32, 16, 8, 8, 12))
ATTENTION_SHAPES = {
    "q_a_proj.weight": [32, 128],
    "q_a_layernorm.weight": [32],
    "q_b_proj.weight": [4 * 16, 32],
    "kv_a_proj_with_mqa.weight": [16 + 8, 128],
    "kv_a_layernorm.weight": [16],
    "kv_b_proj.weight": [4 * (8 + 12), 16],
    "o_proj.weight": [64, 4 * 12],
}


def train(ws, out, **cfg) -> dict:
    base = dict(epochs=12, token_budget=96, max_length=24, eval_fraction=0, ttt_steps=3, lr=3e-3)
    return train_drafter(
        files=TrainFiles(
            shards=ws["shards"],
            vocab=ws["vocab"],
            target_fingerprint=ws["target_fingerprint"],
            **train_outputs(out),
        ),
        config=TrainConfig(**(base | cfg)),
        threads=1,
        log_path=str(out / "train.log"),
    )


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("ws"), SPEC)


@pytest.fixture(scope="module")
def trained(ws, tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    best = train(ws, out)
    return out, best


@pytest.fixture(scope="module")
def checkpoint(ws, tmp_path_factory):
    """A short EAGLE-3.1 run (norm_output): what export writes, not how well it learns."""
    out = tmp_path_factory.mktemp("train31")
    train(ws, out, epochs=1, norm_output=True)
    return out / "best.safetensors"


@pytest.fixture
def exported(checkpoint, tmp_path):
    export_for_sglang(checkpoint=checkpoint, out_dir=tmp_path / "drafter")
    return tmp_path / "drafter"


def test_auto_trains_an_mla_drafter_for_a_deepseek_target(trained):
    out, best = trained
    assert "draft attention: mla (train.draft_attention auto)" in (out / "train.log").read_text()
    # the synthetic walk is learnt as the Llama drafter learns it (0.96 / 0.80 / 0.78 there)
    assert best["acc"][0] > 0.9 and min(best["acc"]) > 0.6
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["acceptance_length"] > rows[0]["acceptance_length"]


def test_export_holds_exactly_sglangs_mla_names_and_config_keys(exported):
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert config["num_hidden_layers"] == 1  # kimi_k25_eagle3.py refuses any other count
    assert config["draft_vocab_size"] == SPEC.draft_vocab_size  # SGLang keeps our head
    assert config["tie_word_embeddings"] is False
    mla = dict(zip(("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim"), SPEC.mla, strict=False))
    assert mla.items() <= config.items()
    assert (config["qk_rope_head_dim"], config["v_head_dim"], config["rope_interleave"]) == (
        8,
        12,
        True,
    )
    assert config["norm_output"] is True and "head_dim" not in config
    tensors = load_file(exported / "model.safetensors")
    attention = {
        k.removeprefix("midlayer.self_attn."): list(v.shape)
        for k, v in tensors.items()
        if k.startswith("midlayer.self_attn.")
    }
    assert attention == ATTENTION_SHAPES
    assert not any(k.endswith(("q_proj.weight", "k_proj.weight")) for k in tensors)


def test_transformers_reads_the_config_sglang_reads(exported):
    """SGLang reads the draft's config through transformers: the Llama config it builds keeps
    every MLA key kimi_k25_eagle3.py asks for."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(exported)
    assert cfg.architectures == ["Eagle3DeepseekV2ForCausalLM"]
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.v_head_dim, cfg.rope_interleave) == (
        32,
        16,
        12,
        True,
    )
    assert (cfg.num_hidden_layers, cfg.norm_output, cfg.draft_vocab_size) == (1, True, 128)


def _rewrite(folder, drop: str) -> None:
    tensors = load_file(folder / "model.safetensors")
    del tensors[drop]
    save_file(tensors, folder / "model.safetensors")


@pytest.mark.parametrize(
    "drop,reason",
    [
        ("lm_head.weight", "declares draft_vocab_size, so SGLang serves a random head"),
        ("midlayer.self_attn.q_a_proj.weight", "drops the lone one without a word"),
        ("midlayer.self_attn.kv_a_proj_with_mqa.weight", "drops the lone one without a word"),
    ],
)
def test_a_folder_sglang_would_load_wrongly_in_silence_is_refused_naming_why(
    exported, tmp_path, drop, reason
):
    _rewrite(exported, drop)
    with pytest.raises(ExportError) as err:
        check_export(exported)
    assert f"missing tensor {drop!r}" in str(err.value) and reason in str(err.value)
    # the same folder built elsewhere and named in bench.drafters: a parse-time config fault
    work = tmp_path / "work"
    shutil.copytree(exported, work / "theirs")
    faults = external_drafter_faults(
        {"mla": "theirs"}, workdir=work, target_name="t", source="nowhere"
    )
    assert any(drop in f and reason in f for f in faults), faults


def test_an_mla_folder_built_elsewhere_passes_the_parse_time_check(exported, ws, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(exported, work / "theirs")
    (work / "target").mkdir()
    (work / "target" / "config.json").write_text(json.dumps(target_config(SPEC)))
    faults = external_drafter_faults(
        {"mla": "theirs"}, workdir=work, target_name="t", source="target"
    )
    assert faults == []


def test_an_mla_drafter_warm_starts_from_its_export_and_a_llama_one_is_refused(ws, exported):
    target = Path(ws["target_fingerprint"]).parent
    model, _ = build_drafter(TrainConfig(norm_output=True), target, ws["vocab"], 256)
    assert model.config.mla
    assert warm_start(model, exported).startswith("draft vocabulary map reused")
    (want,) = [v for k, v in load_file(exported / "model.safetensors").items() if "kv_b" in k]
    assert torch.equal(model.midlayer.self_attn.kv_b_proj.weight.to(want.dtype), want)
    llama, _ = build_drafter(TrainConfig(draft_attention="gqa"), target, ws["vocab"], 256)
    with pytest.raises(ValueError, match=r"midlayer.self_attn.q_proj.weight: here, not there"):
        warm_start(llama, exported)


def _target_with_mla_layers(ws, folder, *, drop=None):
    """The workspace's target plus every decoder layer's weights under DeepSeek-V3's names
    (a dense MLP in each, as DeepSeek's first_k_dense_replace layers have)."""
    shutil.copytree(Path(ws["target_fingerprint"]).parent, folder)
    H, inter = SPEC.hidden_size, SPEC.intermediate_size
    shapes = {
        "input_layernorm.weight": [H],
        # the target's down projections read H, the drafter's 2H
        **{
            f"self_attn.{k}": [v[0], H] if "_a_proj" in k else v
            for k, v in ATTENTION_SHAPES.items()
        },
        "post_attention_layernorm.weight": [H],
        "mlp.gate_proj.weight": [inter, H],
        "mlp.up_proj.weight": [inter, H],
        "mlp.down_proj.weight": [H, inter],
    }
    g = torch.Generator().manual_seed(1)
    tensors = load_file(folder / "model.safetensors")
    for layer in range(SPEC.num_hidden_layers):
        for name, shape in shapes.items():
            if name != drop:
                tensors[f"model.layers.{layer}.{name}"] = torch.randn(shape, generator=g)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_target_last_layer_init_copies_the_targets_own_mla(ws, tmp_path):
    from specbuild.drafter.target_init import init_from_target_layer

    target = _target_with_mla_layers(ws, tmp_path / "target")
    model, _ = build_drafter(TrainConfig(), target, ws["vocab"], 256)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lines = init_from_target_layer(model, target)
    theirs = load_file(target / "model.safetensors")
    attn, H = model.midlayer.self_attn, SPEC.hidden_size
    last = "model.layers.7.self_attn."
    assert torch.equal(attn.q_a_proj.weight[:, :H], theirs[last + "q_a_proj.weight"])
    assert torch.equal(attn.kv_b_proj.weight, theirs[last + "kv_b_proj.weight"])
    assert torch.equal(attn.kv_a_layernorm.weight, theirs[last + "kv_a_layernorm.weight"])
    hidden_half = "midlayer.self_attn.kv_a_proj_with_mqa.weight"
    assert torch.equal(model.state_dict()[hidden_half][:, H:], before[hidden_half][:, H:])
    assert len(lines) == 12
    assert (
        "midlayer.self_attn.kv_a_proj_with_mqa.weight[:, :H] <- "
        "model.layers.7.self_attn.kv_a_proj_with_mqa.weight [24, 64]"
    ) in lines
    # a mixture-of-experts last layer (DeepSeek's, Kimi's) has no dense MLP to copy: refused
    moe = _target_with_mla_layers(ws, tmp_path / "moe", drop="mlp.up_proj.weight")
    with pytest.raises(ValueError, match=r"lack \['model.layers.7.mlp.up_proj.weight'\]"):
        init_from_target_layer(model, moe)
