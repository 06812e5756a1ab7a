"""The drafter module: serving-style cached drafting computes what training-time test trains.

If the unrolled training attention and the KV-cache path disagree, a drafter trains well and
drafts garbage when served; these tests pin them to each other and to the target's RoPE.
"""

from __future__ import annotations

import pytest
import torch

from specbuild.drafter.model import (
    DrafterCache,
    DrafterConfig,
    Eagle3Drafter,
    rope_inv_freq,
)


def tiny_config(**kw) -> DrafterConfig:
    base = dict(
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=50,
        draft_vocab_size=20,
        target_hidden_size=32,
        rope_theta=10000.0,
    )
    return DrafterConfig(**(base | kw))


@pytest.fixture
def drafter() -> Eagle3Drafter:
    torch.manual_seed(0)
    model = Eagle3Drafter(tiny_config()).eval()
    with torch.no_grad():
        model.embed_tokens.weight.normal_()
        for p in model.parameters():  # norms away from 1 so a swapped norm would show
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model


def test_unrolled_step_equals_cached_drafting_at_every_position(drafter):
    B, L = 2, 9
    ids = torch.randint(0, 50, (B, L))
    aux = torch.randn(B, L, 96)
    pos = torch.arange(L).expand(B, L)
    with torch.no_grad():
        h0, h1, h2 = drafter.unroll(ids, aux, pos, steps=3)
        for t in range(L - 2):
            cache = DrafterCache()
            # prefix with target features: indices 0..t, as after a verify step
            hp, _ = drafter(
                ids[:, : t + 1], drafter.project(aux[:, : t + 1]), pos[:, : t + 1], cache
            )
            assert torch.allclose(hp[:, t], h0[:, t], atol=1e-5)
            # chain two drafts from position t: own hidden fed back, token shifted by one each
            d1, _ = drafter(ids[:, t + 1 : t + 2], hp[:, t : t + 1], pos[:, t : t + 1] + 1, cache)
            assert torch.allclose(d1[:, 0], h1[:, t], atol=1e-5)
            d2, _ = drafter(ids[:, t + 2 : t + 3], d1, pos[:, t : t + 1] + 2, cache)
            assert torch.allclose(d2[:, 0], h2[:, t], atol=1e-5)
            assert cache.length == t + 3


def test_crop_rolls_the_cache_back_to_an_identical_state(drafter):
    ids, hid = torch.randint(0, 50, (1, 6)), torch.randn(1, 6, 32)
    pos = torch.arange(6)[None]
    with torch.no_grad():
        cache = DrafterCache()
        drafter(ids[:, :4], hid[:, :4], pos[:, :4], cache)
        _, want = drafter(ids[:, 4:], hid[:, 4:], pos[:, 4:], cache)
        cache.crop(4)
        assert cache.length == 4
        _, again = drafter(ids[:, 4:], hid[:, 4:], pos[:, 4:], cache)
    assert torch.equal(want, again)
    with pytest.raises(ValueError, match="outside the cache"):
        cache.crop(7)


def test_later_positions_never_change_earlier_outputs(drafter):
    ids, aux = torch.randint(0, 50, (1, 8)), torch.randn(1, 8, 96)
    pos = torch.arange(8)[None]
    with torch.no_grad():
        full = drafter.unroll(ids, aux, pos, steps=2)
        ids2, aux2 = ids.clone(), aux.clone()
        ids2[:, 6:], aux2[:, 6:] = 3, 0.0
        cut = drafter.unroll(ids2, aux2, pos, steps=2)
    assert torch.allclose(full[0][:, :6], cut[0][:, :6])
    assert torch.allclose(full[1][:, :5], cut[1][:, :5])  # step 1 at t reads token t+1


def test_config_from_smollm2_keeps_the_targets_rope_and_heads(target_dir):
    import json

    cfg = DrafterConfig.from_target(
        json.loads((target_dir / "config.json").read_text()), draft_vocab_size=1000
    )
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (576, 9, 3)
    assert (cfg.head_dim, cfg.rope_theta, cfg.rope_scaling) == (64, 100000.0, None)
    assert (cfg.vocab_size, cfg.max_position_embeddings) == (49152, 8192)


def test_llama3_rope_scaling_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    ours = rope_inv_freq(
        tiny_config(head_dim=128, hidden_size=512, rope_theta=500000.0, rope_scaling=scaling)
    )
    hf = LlamaConfig(
        hidden_size=512,
        num_attention_heads=4,
        head_dim=128,
        rope_parameters={"rope_theta": 500000.0, **scaling},
    )
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    assert torch.allclose(ours, theirs.float(), rtol=1e-6)


def test_unsupported_rope_type_is_rejected_by_name():
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        tiny_config(rope_scaling={"rope_type": "yarn", "factor": 4.0})


def test_fc_norm_normalizes_each_aux_state_separately():
    model = Eagle3Drafter(tiny_config(fc_norm=True))
    keys = set(model.export_state())
    assert {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"} <= keys
    aux = torch.randn(1, 3, 96)
    scaled = aux.clone()
    scaled[..., 32:64] *= 100.0  # one layer 100x louder: per-layer norm hides it
    with torch.no_grad():
        assert torch.allclose(model.project(aux), model.project(scaled), atol=1e-4)


def test_draft_to_target_adds_the_offset():
    model = Eagle3Drafter(tiny_config())
    model.d2t.copy_(torch.arange(20) * 2)  # draft i -> target 3i
    assert model.draft_to_target(torch.tensor([0, 1, 7])).tolist() == [0, 3, 21]
