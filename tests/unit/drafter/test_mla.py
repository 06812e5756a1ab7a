"""The EAGLE-3 drafter with the target's multi-latent attention (SGLang's
`Eagle3DeepseekV2ForCausalLM`), and EAGLE-3.1's `norm_output` for either attention.

What is pinned: MLA's attention computes what DeepSeek-V3's own (transformers') does on the same
weights, RoPE layout (interleaved or halves) and YaRN scaling; serving-style cached drafting
computes what training-time test trains, for MLA and for `norm_output`; `auto` picks MLA for
DeepSeek-V3 and Kimi-K2.5 targets and Llama's attention for every other; the fused (flex)
training attention agrees with the reference at MLA's widths (values narrower than keys).
"""

from __future__ import annotations

import pytest
import torch

from specbuild.drafter.config import (
    DrafterConfig,
    TrainConfig,
    draft_attention,
    rope_attention_factor,
    rope_inv_freq,
    softmax_scale,
)
from specbuild.drafter.model import DrafterCache, Eagle3Drafter, _cached_attend

# a tiny MLA: 4 heads, q_lora 24, kv_lora 16, nope 8, rope 8, v 6 (values narrower than keys)
MLA = {
    "q_lora_rank": 24,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "v_head_dim": 6,
}
# DeepSeek-V3's YaRN keys (its values but the lengths, cut to the test's positions)
YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 32,
    "mscale": 1.0,
    "mscale_all_dim": 0.7,  # below mscale: the softmax scale and cos/sin both move
    "beta_fast": 32,
    "beta_slow": 1,
}


def mla_config(**kw) -> DrafterConfig:
    base = dict(
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
        vocab_size=50,
        draft_vocab_size=20,
        target_hidden_size=16,
        rms_norm_eps=1e-6,
        max_position_embeddings=128,
        **MLA,
    )
    return DrafterConfig(**(base | kw))


def seeded(cfg: DrafterConfig) -> Eagle3Drafter:
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg).eval()
    with torch.no_grad():
        model.embed_tokens.weight.normal_()
        for p in model.parameters():  # norms away from 1 so a swapped norm would show
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model


def _unroll_equals_cached_drafting(drafter: Eagle3Drafter, target_hidden: int) -> None:
    B, L = 2, 9
    ids = torch.randint(0, 50, (B, L))
    aux = torch.randn(B, L, 3 * target_hidden)
    pos = torch.arange(L).expand(B, L) + 20  # past YaRN's original length, where it differs
    with torch.no_grad():
        h0, h1, h2 = drafter.unroll(ids, aux, pos, steps=3)
        for t in range(L - 2):
            cache = DrafterCache()
            hp, _ = drafter(
                ids[:, : t + 1], drafter.project(aux[:, : t + 1]), pos[:, : t + 1], cache
            )
            torch.testing.assert_close(hp[:, t], drafter.feedback(h0[:, t]), atol=1e-5, rtol=0)
            d1, logits = drafter(
                ids[:, t + 1 : t + 2], hp[:, t : t + 1], pos[:, t : t + 1] + 1, cache
            )
            torch.testing.assert_close(d1[:, 0], drafter.feedback(h1[:, t]), atol=1e-5, rtol=0)
            torch.testing.assert_close(logits[:, 0], drafter.logits(h1[:, t]), atol=1e-5, rtol=0)
            d2, _ = drafter(ids[:, t + 2 : t + 3], d1, pos[:, t : t + 1] + 2, cache)
            torch.testing.assert_close(d2[:, 0], drafter.feedback(h2[:, t]), atol=1e-5, rtol=0)
            assert cache.length == t + 3
    if drafter.config.mla:
        assert cache.k.shape[-1] == 16 and cache.v.shape[-1] == 6  # nope+rope, v


@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("scaling", [None, YARN], ids=["plain", "yarn"])
@pytest.mark.parametrize("norm_output", [False, True])
def test_mla_unrolled_steps_equal_cached_drafting(interleave, scaling, norm_output):
    cfg = mla_config(rope_interleave=interleave, rope_scaling=scaling, norm_output=norm_output)
    _unroll_equals_cached_drafting(seeded(cfg), 16)


def test_norm_output_feeds_the_next_step_the_normed_hidden_with_llama_attention_too():
    cfg = DrafterConfig(
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=50,
        draft_vocab_size=20,
        target_hidden_size=32,
        norm_output=True,
    )
    drafter = seeded(cfg)
    _unroll_equals_cached_drafting(drafter, 32)
    # it changes what step 1 reads, not step 0, nor how logits read a step's output
    ids, aux, pos = torch.randint(0, 50, (1, 6)), torch.randn(1, 6, 96), torch.arange(6)[None]
    plain = seeded(DrafterConfig(**(cfg.to_dict() | {"norm_output": False})))
    with torch.no_grad():
        a, b = drafter.unroll(ids, aux, pos, 2), plain.unroll(ids, aux, pos, 2)
    torch.testing.assert_close(a[0], b[0])
    assert (a[1] - b[1]).abs().max() > 1e-2


def _deepseek_attention(interleave: bool, scaling: dict | None):
    """transformers' DeepSeek-V3 attention at hidden 2H (the drafter's concatenated input)."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    hf = DeepseekV3Config(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        **MLA,
        rope_interleave=interleave,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_theta": 10000.0, **(scaling or {"rope_type": "default"})},
        vocab_size=50,
    )
    hf._attn_implementation = "eager"
    torch.manual_seed(1)
    attn = DeepseekV3Attention(hf, 0).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.uniform_(0.5, 1.5) if p.dim() == 1 else p.normal_(0, 0.2)
    return attn, DeepseekV3RotaryEmbedding(hf)


@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("scaling", [None, YARN], ids=["plain", "yarn"])
def test_mla_attention_is_deepseek_v3s_own(interleave, scaling):
    """The same weights in transformers' DeepseekV3Attention (its o_proj's first H rows ours,
    the rest zero) give the same outputs: projections, latent norms, the one shared RoPE key,
    RoPE's pair layout, YaRN's frequencies, its cos/sin factor and its softmax scale."""
    H, B, T = 16, 2, 11
    theirs, rotary = _deepseek_attention(interleave, scaling)
    drafter = Eagle3Drafter(mla_config(rope_interleave=interleave, rope_scaling=scaling))
    ours = drafter.midlayer.self_attn
    weights = theirs.state_dict()
    with torch.no_grad():
        for name, p in ours.state_dict().items():
            p.copy_(weights[name][:H] if name == "o_proj.weight" else weights[name])
    x = torch.randn(B, T, 2 * H)
    pos = (torch.arange(T) + 40).expand(B, T)
    causal = torch.full((T, T), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want = theirs(x, rotary(x, pos), causal)[0][..., :H]
        cos, sin = drafter.rope(pos)
        got = ours(x, cos, sin, _cached_attend(None, 4))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_yarn_moves_frequencies_cos_sin_and_the_softmax_scale_as_deepseeks():
    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = YARN | {"original_max_position_embeddings": 4096, "factor": 40.0}
    cfg = mla_config(
        qk_rope_head_dim=64,
        head_dim=8 + 64,
        rope_scaling=scaling,
        max_position_embeddings=4096 * 40,
    )
    hf = DeepseekV3Config(
        hidden_size=32,
        num_attention_heads=4,
        **(MLA | {"qk_rope_head_dim": 64}),
        max_position_embeddings=4096 * 40,
        rope_parameters={"rope_theta": 10000.0, **scaling},
    )
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    ours = rope_inv_freq(cfg)
    torch.testing.assert_close(ours, inv.float(), rtol=1e-6, atol=0)
    assert 0 < (ours == inv.float()).sum() < 32  # some dims extrapolated, some interpolated
    assert rope_attention_factor(cfg) == pytest.approx(factor)
    m = 0.1 * 0.7 * torch.log(torch.tensor(40.0)).item() + 1  # mscale(factor, mscale_all_dim)
    assert softmax_scale(cfg) == pytest.approx((8 + 64) ** -0.5 * m * m)
    plain = mla_config(qk_rope_head_dim=64, head_dim=8 + 64)
    assert (rope_attention_factor(plain), softmax_scale(plain)) == (1.0, (8 + 64) ** -0.5)


def test_an_mla_draft_refuses_what_sglangs_mla_would_serve_otherwise():
    with pytest.raises(ValueError, match="rope_type 'llama3' is not supported with multi-latent"):
        mla_config(rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ValueError, match="needs v_head_dim too"):
        mla_config(v_head_dim=None)
    with pytest.raises(ValueError, match="head_dim 64: multi-latent attention's query/key width"):
        mla_config(head_dim=64)
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported; supported"):
        DrafterConfig(
            **(mla_config().to_dict() | dict.fromkeys(MLA, None) | {"rope_scaling": YARN})
        )


# ---- which attention a target gets ---------------------------------------------------------


def deepseek_text(**kw) -> dict:
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 4,
        "vocab_size": 128,
        "rope_theta": 50000.0,
        "rope_scaling": None,
        "max_position_embeddings": 4096,
        **MLA,
    } | kw


def test_auto_is_mla_for_deepseek_and_kimi_targets_and_gqa_for_llama(target_dir):
    import json

    llama = json.loads((target_dir / "config.json").read_text())
    kimi = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": deepseek_text()}
    assert draft_attention("auto", llama) == "gqa"
    assert draft_attention("auto", deepseek_text()) == "mla"
    assert draft_attention("auto", kimi) == "mla"
    assert draft_attention("gqa", kimi) == "gqa"
    # DeepSeek-V2-Lite: MLA without a q_lora_rank, which SGLang's MLA draft requires
    assert draft_attention("auto", deepseek_text(q_lora_rank=None)) == "gqa"
    with pytest.raises(ValueError, match="gives no q_lora_rank, kv_lora_rank"):
        draft_attention("mla", llama)
    cfg = DrafterConfig.from_target(kimi, draft_vocab_size=32, attention="mla")
    assert (cfg.mla, cfg.q_lora_rank, cfg.head_dim, cfg.rope_interleave) == (True, 24, 16, True)
    assert (cfg.rope_theta, cfg.num_key_value_heads) == (50000.0, 4)
    assert not DrafterConfig.from_target(kimi, draft_vocab_size=32).mla  # gqa unless told


def test_the_train_keys_are_checked_up_front():
    with pytest.raises(ValueError, match="draft_attention 'latent': choose auto, gqa or mla"):
        TrainConfig.from_params({"draft_attention": "latent"})
    with pytest.raises(ValueError, match="family dflash: norm_output and draft_attention mla"):
        TrainConfig.from_params({"family": "dflash", "norm_output": True})
    TrainConfig.from_params({"family": "dflash", "draft_attention": "auto"})  # nothing to say


# ---- the fused training attention at MLA's widths --------------------------------------------


def test_unroll_with_flex_attention_trains_the_same_mla_drafter(monkeypatch):
    """Values narrower than keys and a YaRN softmax scale through the flex path: every step's
    hidden and every gradient equal the reference's (eager flex on CPU, its device check
    lifted as in test_fused_attention)."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    monkeypatch.setattr(flex, "_validate_device", lambda *a, **k: None)
    model = Eagle3Drafter(mla_config(rope_scaling=YARN, norm_output=True))
    B, L = 3, 21
    ids, aux = torch.randint(0, 50, (B, L)), torch.randn(B, L, 48)
    pos = torch.arange(L).expand(B, L).clone()
    pos[1, 15:] = 0  # right padding, as `Batch` clamps its -1 positions
    runs = {}
    for attention in ("reference", "flex"):
        model.zero_grad()
        outs = model.unroll(ids, aux, pos, steps=4, attention=attention)
        g = torch.Generator().manual_seed(1)
        sum((h * torch.randn(h.shape, generator=g)).sum() for h in outs).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        runs[attention] = [h.detach() for h in outs], grads
    (ref_h, ref_g), (flex_h, flex_g) = runs["reference"], runs["flex"]
    for a, b in zip(ref_h, flex_h, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert "midlayer.self_attn.kv_b_proj.weight" in ref_g and ref_g.keys() == flex_g.keys()
    for name in ref_g:
        torch.testing.assert_close(flex_g[name], ref_g[name], atol=2e-5, rtol=1e-5, msg=name)


# ---- FLOPs (the MFU numerator) ----------------------------------------------------------------


def test_mla_dense_parts_follow_six_times_parameters_times_rows():
    from specbuild.drafter.flops import StepWork, step_flops

    cfg = mla_config()
    model = Eagle3Drafter(cfg)
    layer = model.midlayer
    linears = [m for m in layer.self_attn.children() if isinstance(m, torch.nn.Linear)]
    dense = sum(m.weight.numel() for m in [*linears, *layer.mlp.children()])
    B, L = 2, 10
    parts = step_flops(cfg, StepWork(B, L, (5,), teacher_rows=5, full_vocab_rows=0))
    assert len(linears) == 5
    assert parts["projections"] + parts["mlp"] == 6 * dense * B * L
    pairs = L * (L + 1) // 2  # scores over nope+rope (16), values over v (6), 4 heads
    assert parts["attention"] == 3 * 2 * B * 4 * (16 + 6) * pairs


def test_mla_step_flops_equal_torch_flop_counter_but_for_extra_keys_and_masked_scores(tmp_path):
    from pathlib import Path

    from torch.utils.flop_counter import FlopCounterMode

    from benchmarks.synthetic import SyntheticSpec, make_workspace
    from specbuild.drafter.build import build_drafter
    from specbuild.drafter.data import ShardSet
    from specbuild.drafter.flops import step_flops
    from specbuild.drafter.objective import TTTObjective

    ws = make_workspace(tmp_path, SyntheticSpec(samples=4, seq_len=24, mla=(32, 16, 8, 8, 12)))
    model, teacher = build_drafter(
        TrainConfig(), Path(ws["target_fingerprint"]).parent, ws["vocab"], 256
    )
    assert model.config.mla
    steps = 3
    objective = TTTObjective(model, teacher, steps=steps, decay=0.8, amp=False)
    data = ShardSet(ws["shards"], hidden_size=64)
    batch = data.batch(data.refs[:3], 24)
    with FlopCounterMode(display=False) as counter:
        objective(batch).backward()
    parts = step_flops(model.config, objective.work)
    B, L = objective.work.batch, objective.work.length
    width = 4 * (16 + 12)  # nh * (nope+rope) for the scores, nh * v for the values
    masked = sum(3 * B * width * (L - i) * (L - i - 1) for i in range(steps))
    ours = sum(parts.values()) - parts["attention_extra_keys"]
    assert ours + masked == counter.get_total_flops()


@pytest.mark.gpu
def test_compiled_flex_at_kimis_mla_widths_is_as_close_to_exact_as_the_reference():
    """Kimi-K2.5's MLA on the compiled CUDA kernel, in bf16: 64 heads, scores over nope 128 +
    rope 64 = 192 dims, values over 128, YaRN's softmax scale. Each path is compared with the
    float64 reference; the fused one's error must be no worse than the reference's own (x2,
    plus one bf16 ulp of the largest value), as test_fused_attention asks at Llama's widths."""
    from specbuild.drafter.fused_attention import fused_ttt_attention
    from specbuild.drafter.model import ttt_attention

    B, nh, T, step, scale = 1, 64, 1000, 3, 192**-0.5 * 1.3
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to("cuda", torch.bfloat16).requires_grad_()

    q = rand(B, nh, T, 192)
    keys = [rand(B, nh, T + step - j, 192) for j in range(step + 1)]
    values = [rand(B, nh, T + step - j, 128) for j in range(step + 1)]
    exact_in = [t.detach().double().requires_grad_() for t in (q, *keys, *values)]
    n = len(keys)
    exact = ttt_attention(exact_in[0], exact_in[1 : 1 + n], exact_in[1 + n :], scale)
    up = torch.randn(exact.shape, generator=torch.Generator().manual_seed(1)).cuda()
    exact_g = torch.autograd.grad(exact, exact_in, up.double())
    fused = fused_ttt_attention(q, keys, values, segments=7, scale=scale)
    ref = ttt_attention(q, keys, values, scale)
    assert fused.shape == (B, nh, T, 128)
    pairs = [(fused, ref, exact)]
    pairs += zip(
        torch.autograd.grad(fused, [q, *keys, *values], up.bfloat16()),
        torch.autograd.grad(ref, [q, *keys, *values], up.bfloat16()),
        exact_g,
        strict=True,
    )
    for f, r, e in pairs:
        err_f = (f.double() - e).abs().max().item()
        err_r = (r.double() - e).abs().max().item()
        slack = 2**-8 * max(e.abs().max().item(), 1.0)
        assert err_f <= 2 * err_r + slack, (err_f, err_r)
