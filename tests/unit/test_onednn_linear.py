"""oneDNN linears (specbuild.onednn_linear): the same products as nn.Linear up to float32
rounding, in every shape the stages use, and only where they apply (CPU, float32)."""

import pytest
import torch

from specbuild.onednn_linear import OneDNNLinear, use_onednn_linears


@pytest.mark.parametrize("shape", [(1, 1, 576), (1, 4, 576), (32, 1, 576), (3, 300, 576), (7, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_linear_matches_nn_linear_in_every_shape(shape, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(576, 1536, bias=bias)
    x = torch.randn(*shape)
    want = linear(x)
    got = OneDNNLinear(linear)(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_the_target_runs_its_linears_through_onednn_with_the_same_greedy_tokens(target_dir):
    from transformers import AutoModelForCausalLM

    from specbuild.target import load_target_model

    model = load_target_model(target_dir)
    assert isinstance(model.lm_head, OneDNNLinear)
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    plain = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()  # MKL's products
    ids = torch.arange(100, 164)[None]
    with torch.no_grad():
        got, want = model(ids).logits, plain(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_bfloat16_models_keep_their_linears():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8)).to(torch.bfloat16)
    assert use_onednn_linears(model) == 0
    assert type(model[0]) is torch.nn.Linear
