"""oneDNN linears (specbuild.infra.onednn_linear): the same products as nn.Linear up to float32
rounding, in every shape the stages use, and only where they apply (CPU, float32)."""

import pytest
import torch

from specbuild.infra.onednn_linear import (
    OneDNNLinear,
    OneDNNTrainLinear,
    use_onednn_linears,
    use_onednn_training_linears,
)


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


@pytest.mark.slow  # runs the real SmolLM2, twice
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


def _twin(in_features: int, out_features: int) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    plain = torch.nn.Linear(in_features, out_features, bias=False)
    swapped = torch.nn.Sequential(torch.nn.Linear(in_features, out_features, bias=False))
    swapped[0].load_state_dict(plain.state_dict())
    assert use_onednn_training_linears(swapped) == 1
    return plain, swapped[0]


# the drafter's linears at the CPU default's shapes: fc, q/k/v, o, MLP, lm_head
@pytest.mark.parametrize(
    "in_features,out_features",
    [(1728, 576), (1152, 576), (1152, 192), (576, 576), (576, 1536), (1536, 576), (576, 4096)],
)
@pytest.mark.parametrize("shape", [(3, 211), (1024,), (1,)])
def test_training_linear_matches_nn_linear_forward_and_gradients(in_features, out_features, shape):
    torch.manual_seed(0)
    plain, swapped = _twin(in_features, out_features)
    x = torch.randn(*shape, in_features)
    up = torch.randn(*shape, out_features)  # the gradient arriving from above
    x_plain, x_swapped = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_plain, y_swapped = plain(x_plain), swapped(x_swapped)
    (y_plain * up).sum().backward()
    (y_swapped * up).sum().backward()
    assert isinstance(swapped, OneDNNTrainLinear) and isinstance(swapped, torch.nn.Linear)
    torch.testing.assert_close(y_swapped, y_plain, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(x_swapped.grad, x_plain.grad, rtol=1e-5, atol=1e-4)
    # a sum over up to 1,024 rows of products ~|100|: float32 rounding ~1e-4 relative
    torch.testing.assert_close(swapped.weight.grad, plain.weight.grad, rtol=1e-4, atol=1e-3)


def test_training_linear_repacks_after_each_optimizer_step():
    torch.manual_seed(0)
    plain, swapped = _twin(64, 32)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.5)
    opt_swapped = torch.optim.SGD(swapped.parameters(), lr=0.5)
    x = torch.randn(8, 64)
    for _ in range(3):  # a stale packed weight would answer with the first step's weights
        for layer, opt in ((plain, opt_plain), (swapped, opt_swapped)):
            opt.zero_grad()
            layer(x).square().sum().backward()
            opt.step()
        torch.testing.assert_close(swapped(x), plain(x), rtol=1e-4, atol=1e-4)
    assert not torch.equal(swapped.weight, _twin(64, 32)[0].weight)


def test_training_linears_keep_parameters_and_step_aside_for_autocast():
    model = torch.nn.Sequential(torch.nn.Linear(16, 8, bias=False), torch.nn.Linear(8, 4))
    names = [n for n, _ in model.named_parameters()]
    assert use_onednn_training_linears(model) == 1  # the one with a bias keeps nn.Linear
    assert [n for n, _ in model.named_parameters()] == names
    assert type(model[1]) is torch.nn.Linear
    x = torch.randn(2, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # nn.Linear's path: bf16 out
        assert model[0](x).dtype == torch.bfloat16
    assert model[0](x).dtype == torch.float32
