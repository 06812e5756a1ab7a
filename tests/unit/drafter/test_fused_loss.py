"""The fused lm_head + soft cross-entropy (drafter/fused_loss.py) against the plain expression
autograd differentiates: the loss and both gradients, in float64 (exact up to summation
order), in bf16 as autocast rounds, for chunks that split the rows unevenly, for no rows at
all, and inside the training objective with its real drafter and teacher."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.synthetic import SyntheticSpec, make_workspace
from specbuild.drafter import fused_loss as fused_loss_module
from specbuild.drafter.build import build_drafter, build_objective, loss_kind
from specbuild.drafter.data import ShardSet
from specbuild.drafter.fused_loss import linear_soft_cross_entropy
from specbuild.drafter.objective import TTTObjective
from specbuild.drafter.train import TrainConfig
from specbuild.eagle.target_info import read_target_info


def _inputs(n: int, dtype: torch.dtype, *, hard: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    H, Vd, M = 16, 40, 7
    x = torch.randn(n, H, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(Vd, H, generator=g) * 0.3).to(dtype).requires_grad_()
    t_logits = torch.randn(M, Vd, generator=g) * 2
    if hard:  # a hard-label teacher (temperature 0): one-hot rows
        targets = torch.nn.functional.one_hot(t_logits.argmax(-1), Vd).float()
    else:
        targets = t_logits.softmax(-1)
    rows = torch.randint(0, M, (n,), generator=g)  # rows repeat, as the TTT steps' shifts do
    return x, w, targets, rows


def _plain(x, w, targets, rows, dtype):
    logits = (x.to(dtype) @ w.to(dtype).T).float()
    return -(targets[rows] * logits.log_softmax(-1)).sum()


@pytest.mark.parametrize("chunk", [1, 3, 64])
@pytest.mark.parametrize("hard", [False, True])
def test_loss_and_gradients_equal_the_plain_expression_in_float64(chunk, hard):
    x, w, targets, rows = _inputs(10, torch.float64, hard=hard)
    ref = -(targets[rows].double() * (x @ w.T).log_softmax(-1)).sum()
    ref.backward(torch.tensor(0.75, dtype=torch.float64))
    ref_x, ref_w = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    loss = linear_soft_cross_entropy(
        x, w, targets.double(), rows, compute_dtype=torch.float64, chunk_rows=chunk
    )
    loss.backward(torch.tensor(0.75, dtype=torch.float32))
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert torch.allclose(x.grad, ref_x, rtol=1e-9, atol=1e-12)
    assert torch.allclose(w.grad, ref_w, rtol=1e-9, atol=1e-12)
    assert x.grad.dtype == w.grad.dtype == torch.float64


def test_bf16_rounds_as_the_plain_expression_under_autocast_does():
    x, w, targets, rows = _inputs(33, torch.bfloat16, seed=1)
    ref = _plain(x, w, targets, rows, torch.bfloat16)
    ref.backward()
    ref_x, ref_w = x.grad.float(), w.grad.float()
    x.grad = w.grad = None
    loss = linear_soft_cross_entropy(
        x, w, targets, rows, compute_dtype=torch.bfloat16, chunk_rows=8
    )
    loss.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-4)
    assert x.grad.dtype == w.grad.dtype == torch.bfloat16
    # the plain path rounds one whole-batch weight gradient to bf16; the fused one sums chunks
    # in float32 first: the two differ by bf16 rounding only
    assert torch.allclose(x.grad.float(), ref_x, rtol=2e-2, atol=1e-3)
    assert torch.allclose(w.grad.float(), ref_w, rtol=2e-2, atol=1e-2)


def test_no_rows_is_a_zero_loss_with_zero_gradients():
    x, w, targets, _ = _inputs(0, torch.float32)
    loss = linear_soft_cross_entropy(
        x, w, targets, torch.zeros(0, dtype=torch.int64), compute_dtype=torch.float32
    )
    loss.backward()
    assert loss.item() == 0.0 and x.grad.shape == (0, 16) and not w.grad.any()


def test_targets_with_a_gradient_are_refused():
    x, w, targets, rows = _inputs(4, torch.float32)
    with pytest.raises(ValueError, match="targets take no gradient"):
        linear_soft_cross_entropy(x, w, targets.requires_grad_(), rows, compute_dtype=torch.float32)


@pytest.fixture(scope="module")
def objective_and_data(tmp_path_factory):
    ws = make_workspace(tmp_path_factory.mktemp("ws"), SyntheticSpec(samples=8, seq_len=24))
    info = read_target_info(ws["target_fingerprint"])
    model, teacher = build_drafter(
        TrainConfig(), Path(ws["target_fingerprint"]).parent, ws["vocab"], info.vocab_size
    )
    objective = TTTObjective(model, teacher, steps=3, decay=0.8, amp=False)
    return objective, ShardSet(ws["shards"], hidden_size=64)


def test_the_training_objective_fused_equals_its_plain_loss_and_gradients(objective_and_data):
    objective, data = objective_and_data
    batch = data.batch(data.refs[:4], 24)
    grads = {}
    for fused in (False, True):
        objective.zero_grad()
        objective.fused_loss = fused
        loss = objective(batch)
        loss.backward()
        trained = {n: p.grad.clone() for n, p in objective.named_parameters() if p.grad is not None}
        grads[fused] = (loss.item(), trained)
    (plain_loss, plain), (fused_loss, fused) = grads[False], grads[True]
    assert fused_loss == pytest.approx(plain_loss, rel=1e-5)
    assert plain.keys() == fused.keys() and "drafter.lm_head.weight" in fused
    for name, grad in plain.items():
        assert torch.allclose(fused[name], grad, rtol=1e-4, atol=1e-6), name


def test_an_acceptance_weighted_loss_is_computed_the_plain_way_even_when_fused_is_asked(
    objective_and_data,
):
    objective, data = objective_and_data
    batch = data.batch(data.refs[:4], 24)
    losses = []
    for fused in (False, True):
        objective.fused_loss, objective.acceptance_weight = fused, 0.5
        losses.append(objective(batch).item())
    objective.fused_loss, objective.acceptance_weight = False, 0.0
    assert losses[0] == losses[1]
    assert losses[0] != objective(batch).item()  # the acceptance term changes the loss


@pytest.mark.gpu
def test_the_compiled_cuda_kernel_equals_the_plain_expression():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x, w, targets, rows = _inputs(5000, torch.bfloat16, seed=2)
    x, w = x.detach().cuda().requires_grad_(), w.detach().cuda().requires_grad_()
    targets, rows = targets.cuda(), rows.cuda()
    ref = _plain(x, w, targets, rows, torch.bfloat16)
    ref.backward()
    ref_x, ref_w = x.grad.float(), w.grad.float()
    x.grad = w.grad = None
    for _ in range(2):  # the second call runs the compiled graph without compiling
        x.grad = w.grad = None
        loss = linear_soft_cross_entropy(
            x, w, targets, rows, compute_dtype=torch.bfloat16, chunk_rows=2048
        )
        loss.backward()
    assert fused_loss_module._compiled[0] is not fused_loss_module._soft_cross_entropy
    assert loss.item() == pytest.approx(ref.item(), rel=1e-4)
    # The fused path sums grad_w over row chunks in fp32, the reference in one bf16 matmul:
    # they differ by bf16 rounding of the reference (0.5 on a max of 115.5 seen on an H200),
    # so the gradients are compared at their own scale, not element by element.
    for got, want in ((x.grad.float(), ref_x), (w.grad.float(), ref_w)):
        assert (got - want).abs().max() <= 1e-2 * want.abs().max()


def test_train_loss_picks_the_objectives_loss_and_a_typo_names_the_key():
    cpu = torch.device("cpu")
    for loss, fused in (("reference", False), ("fused", True), ("auto", False)):
        cfg = TrainConfig.from_params({"loss": loss, "device": "cpu"})
        objective = build_objective(
            cfg, None, None, amp=False, attention="reference", loss=loss_kind(cfg, cpu)
        )
        assert objective.fused_loss is fused, loss
    # auto is the fused loss where a GPU trains
    assert loss_kind(TrainConfig.from_params({"loss": "auto"}), torch.device("cuda")) == "fused"
    assert TrainConfig().loss == "auto"
    with pytest.raises(ValueError, match="loss 'fast': choose auto, reference or fused"):
        TrainConfig.from_params({"loss": "fast"})
