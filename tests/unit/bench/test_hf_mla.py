"""The PyTorch bench engine with an MLA drafter over a DeepSeek-V3 target: lossless, and
drafting what training-time test trained.

The target is a random DeepSeek-V3 small enough for a CPU (transformers' own model: MLA with
YaRN, a dense first layer, then routed experts); the drafter an exported
`Eagle3DeepseekV2ForCausalLM` folder, loaded as the engine loads any drafter folder. Losslessness
holds whatever a drafter proposes, so the second test pins what it proposes: the engine's
chain (MLA's cache of keys narrower in values than in queries, EAGLE-3.1's post-norm hidden fed
back) equals training's unrolled prediction.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specbuild.bench.hf import HFBaseline, HFSpecDecoder, load_drafter
from specbuild.eagle.chain import Chain

VOCAB = 96
EOS = VOCAB - 1
YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "beta_fast": 32,
    "beta_slow": 1,
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def deepseek():
    """(a random 4-layer DeepSeek-V3 in transformers, its config.json as a dict)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=12,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        max_position_embeddings=256,
        rope_parameters={"rope_theta": 10000.0, **YARN},
        eos_token_id=EOS,
        bos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(config).eval()
    with torch.no_grad():  # wider than the 0.02 init, so that greedy decoding is no constant
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
    return model, config.to_dict()


def export_mla_drafter(target_cfg: dict, out, *, norm_output: bool) -> None:
    from specbuild.drafter.model import DrafterConfig, Eagle3Drafter
    from specbuild.drafter.state import save_drafter
    from specbuild.export import export_for_sglang

    cfg = DrafterConfig.from_target(
        target_cfg, draft_vocab_size=48, attention="mla", norm_output=norm_output
    )
    torch.manual_seed(1)
    drafter = Eagle3Drafter(cfg)
    drafter.d2t.copy_(torch.arange(48))  # draft id i is target id 2i: d2t is no identity
    drafter.t2d.zero_()
    drafter.t2d[torch.arange(48) * 2] = True
    meta = {"drafter_config": cfg.to_dict(), "layer_ids": [0, 1, 2], "target_config": target_cfg}
    save_drafter(out / "best.safetensors", drafter.export_state(), meta)
    export_for_sglang(checkpoint=out / "best.safetensors", out_dir=out / "drafter", dtype="float32")


@pytest.mark.parametrize("norm_output", [False, True])
def test_an_mla_drafter_decodes_a_deepseek_target_losslessly(deepseek, tmp_path, norm_output):
    target, target_cfg = deepseek
    export_mla_drafter(target_cfg, tmp_path, norm_output=norm_output)
    drafter, layer_ids = load_drafter(tmp_path / "drafter", target, target_cfg)
    assert drafter.config.mla and drafter.config.norm_output is norm_output
    assert drafter.config.rope_scaling["rope_type"] == "yarn"  # the target's YaRN, as served
    assert layer_ids == [0, 1, 2]
    base = HFBaseline(target, eos_ids={EOS})
    g = torch.Generator().manual_seed(2)
    for chain in ("3-1-4", "5-1-6"):
        spec = HFSpecDecoder(
            target,
            drafter,
            layer_ids=layer_ids,
            chain=Chain.parse(chain),
            eos_ids={EOS},
            drafter_name="mla",
        )
        for n in (5, 17, 40):  # prompts past YaRN's original length too, with max_new
            prompt = torch.randint(1, EOS, (n,), generator=g).tolist()
            want = base.complete(prompt, 40).token_ids
            got = spec.complete(prompt, 40)
            assert got.token_ids == want
            assert got.verify_steps >= 1 and len(set(want)) > 3  # no constant output


@pytest.mark.parametrize("norm_output", [False, True])
def test_the_engine_drafts_what_training_unrolls_for_an_mla_drafter(deepseek, norm_output):
    """At index t, training's unrolled steps 0..2 (token x[t+1+i] at position t+i beside g_t,
    then its own fed-back hidden) give the logits of the engine's chain d1, d2, d3."""
    from specbuild.drafter.model import DrafterCache, DrafterConfig, Eagle3Drafter

    _, target_cfg = deepseek
    cfg = DrafterConfig.from_target(
        target_cfg, draft_vocab_size=VOCAB, attention="mla", norm_output=norm_output
    )
    torch.manual_seed(0)
    drafter = Eagle3Drafter(cfg).eval()
    drafter.embed_tokens.weight.normal_(std=1.0)
    seen: list[torch.Tensor] = []
    forward = drafter.forward

    def recording_forward(*args, **kwargs):
        hidden, logits = forward(*args, **kwargs)
        seen.append(logits[0, -1])
        return hidden, logits

    drafter.forward = recording_forward
    spec = HFSpecDecoder(
        SimpleNamespace(device=torch.device("cpu")),
        drafter,
        layer_ids=[0, 1, 2],
        chain=Chain.parse("3-1-4"),
        eos_ids={0},
        drafter_name="tiny",
    )
    t = 70  # past YaRN's original 64 positions
    x = torch.randint(1, VOCAB, (t + 2,)).tolist()
    aux = torch.randn(1, t + 3, 3 * 64)
    with torch.inference_mode():
        drafts = spec._draft(x[1:], aux[:, : t + 1], DrafterCache())
        u = torch.tensor([x[1:] + drafts[:2]])
        outs = drafter.unroll(u, aux, torch.arange(t + 3)[None], steps=3)
    trained = torch.stack([drafter.logits(h[0, t]) for h in outs])
    assert trained.argmax(-1).tolist() == drafts
    torch.testing.assert_close(torch.stack(seen), trained, atol=1e-5, rtol=1e-5)
