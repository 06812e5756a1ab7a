"""The fused training-time-test attention computes what the reference does, values and gradients.

`fused_attention.fused_ttt_attention` (FlexAttention over the keys laid out in segments) must
equal `model.ttt_attention` (materialised scores) in its output and in the gradients of q and
of every step's keys and values: otherwise a CUDA run trains another drafter than a CPU one.
On CPU, eager flex attention evaluates the mask function over every score, so the block mask
(what the compiled CUDA kernel reads instead) is checked separately, block for block, against
`create_block_mask` of the same function. The GPU-marked tests run the compiled kernel in bf16
and count its graphs.

Tolerances. Both paths compute in float32 (the reference rounds its softmax through float32
whatever the input dtype; eager flex works in float32); only the order of the sums differs.
Outputs are convex combinations of N(0,1) values, gradients (|g| < ~6 here) sums over O(T)
terms: measured max differences 7e-7 (outputs) and 1.6e-6 (gradients) over CASES, asserted
at 1e-5 and 2e-5 (plus 1e-5 relative). One wrong mask entry moves them by ~1e-2 or more.
In bf16 on CUDA each path rounds to bf16 at different points (the reference its q k^T scores
and probabilities, the kernel its probabilities): each is compared with a float64 evaluation
of the reference, and the fused error must be no worse than the reference's own (x2, plus one
bf16 ulp of the largest value as slack).
"""

from __future__ import annotations

import pytest
import torch

from specbuild.drafter import fused_attention
from specbuild.drafter.build import attention_kind
from specbuild.drafter.config import DrafterConfig, TrainConfig
from specbuild.drafter.fused_attention import BLOCK, block_mask, fused_ttt_attention, padded
from specbuild.drafter.model import Eagle3Drafter, _expand_kv, ttt_attention

flex = pytest.importorskip("torch.nn.attention.flex_attention")


@pytest.fixture
def cpu_backward(monkeypatch):
    """Eager flex attention's backward is plain autograd over the dense math, device-agnostic;
    torch refuses it on CPU only to steer users to a GPU. Lifted here for tiny shapes."""
    monkeypatch.setattr(flex, "_validate_device", lambda *a, **k: None)


def _inputs(B, nh, nkv, hd, T, step, dtype=torch.float32, device="cpu", seed=0):
    """q [B,nh,T,hd] and step+1 keys/values [B,nkv,T+step-j,hd] (longer than T, as `unroll`
    passes them: the earlier steps ran over more positions)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device, dtype).requires_grad_()

    q = rand(B, nh, T, hd)
    keys = [rand(B, nkv, T + step - j, hd) for j in range(step + 1)]
    values = [rand(B, nkv, T + step - j, hd) for j in range(step + 1)]
    return q, keys, values


def _reference(q, keys, values):
    nh = q.shape[1]
    return ttt_attention(q, [_expand_kv(k, nh) for k in keys], [_expand_kv(v, nh) for v in values])


def _grads(out, q, keys, values, seed=1):
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out)
    return torch.autograd.grad(out, [q, *keys, *values], up)


# T: inside one block, exactly one, just past one (P 256), and 3 live blocks of a 4-block P
# (a padding block with no work); GQA groups 1, 2, 4; steps 0 .. 6; spare segments or none
CASES = [
    # B, nh, nkv, hd, T, step, segments
    (2, 4, 2, 16, 5, 0, 1),
    (2, 4, 4, 16, 128, 1, 2),
    (1, 8, 2, 32, 130, 2, 7),
    (2, 4, 1, 16, 300, 3, 4),
    (1, 4, 2, 16, 61, 6, 7),
]


@pytest.mark.parametrize("B,nh,nkv,hd,T,step,segments", CASES)
def test_fused_attention_equals_the_reference_in_values_and_gradients(
    cpu_backward, B, nh, nkv, hd, T, step, segments
):
    q, keys, values = _inputs(B, nh, nkv, hd, T, step)
    want = _reference(q, keys, values)
    got = fused_ttt_attention(q, keys, values, segments=segments, compiled=False)
    assert got.shape == want.shape == (B, nh, T, hd)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    grads = _grads(got, q, keys, values)
    for g, w in zip(grads, _grads(want, q, keys, values), strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)
    for g in grads[1:]:  # positions past T (the earlier steps' longer keys) get no gradient
        assert not g[:, :, T:].any()


def test_each_draft_key_reaches_only_its_own_position(cpu_backward):
    """A mask one position off would still look like attention: move one draft key and only
    the query at its position may change."""
    q, keys, values = _inputs(1, 2, 2, 16, 40, 2)
    before = fused_ttt_attention(q, keys, values, segments=3, compiled=False)
    with torch.no_grad():
        keys[2][:, :, 17] += 3.0
    after = fused_ttt_attention(q, keys, values, segments=3, compiled=False)
    changed = (after - before).abs().amax(dim=(0, 1, 3)) > 0
    assert changed.nonzero().flatten().tolist() == [17]


def _block_kinds(mask) -> torch.Tensor:
    """[q blocks, kv blocks]: 0 skipped, 1 partial (mask function applied), 2 full."""
    kinds = torch.zeros(mask.kv_num_blocks.shape[-1], mask.kv_indices.shape[-1], dtype=torch.int8)
    for r in range(kinds.shape[0]):
        kinds[r, mask.kv_indices[0, 0, r, : mask.kv_num_blocks[0, 0, r]]] += 1
        kinds[r, mask.full_kv_indices[0, 0, r, : mask.full_kv_num_blocks[0, 0, r]]] += 2
    return kinds


@pytest.mark.parametrize("T,step,segments", [(5, 0, 1), (128, 3, 7), (130, 2, 3), (300, 6, 7)])
def test_the_block_mask_is_the_mask_functions_own_block_for_block(T, step, segments):
    """What the compiled kernel reads instead of evaluating the mask everywhere: built from
    block arithmetic, it must equal create_block_mask of the mask function (restricted to the
    query blocks that hold a position < T; later ones are padding, given no blocks)."""
    P, live = padded(T), -(-T // BLOCK)
    ours = block_mask(live, P, step, segments, torch.device("cpu"))
    mask_mod = ours.mask_mod

    def rows(b, h, q_idx, kv_idx):
        return mask_mod(b, h, q_idx, kv_idx) & (q_idx < live * BLOCK)

    theirs = flex.create_block_mask(rows, 1, 1, P, segments * P, device="cpu", BLOCK_SIZE=BLOCK)
    assert ours.seq_lengths == (P, segments * P)
    assert torch.equal(_block_kinds(ours), _block_kinds(theirs))
    # the backward pass reads the transposed (per key block) lists: the same blocks
    for a, b in [("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")]:
        n_ours, n_theirs = getattr(ours, a), getattr(theirs, a)
        assert torch.equal(n_ours, n_theirs)
        for c in range(n_ours.shape[-1]):
            k = int(n_ours[0, 0, c])
            got = sorted(getattr(ours, b)[0, 0, c, :k].tolist())
            assert got == sorted(getattr(theirs, b)[0, 0, c, :k].tolist())


def test_padded_lengths_are_few_powers_of_two():
    assert [padded(t) for t in (1, 128, 129, 1000, 2047, 2048, 2049)] == [
        128, 128, 256, 1024, 2048, 2048, 4096,
    ]  # fmt: skip
    assert len({padded(t) for t in range(1, 2049)}) == 5  # graphs a max_length-2048 run needs


def _tiny_drafter() -> Eagle3Drafter:
    torch.manual_seed(0)
    cfg = DrafterConfig(
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA: the flex path leaves the keys unexpanded
        head_dim=8,
        vocab_size=50,
        draft_vocab_size=20,
        target_hidden_size=32,
    )
    return Eagle3Drafter(cfg)


def test_unroll_with_flex_attention_trains_the_same_drafter(cpu_backward):
    """The whole unroll (one segment per step, right-padded samples): the hidden states of
    every step and every parameter's gradient equal the reference's."""
    model = _tiny_drafter()
    B, L = 3, 21
    ids = torch.randint(0, 50, (B, L))
    aux = torch.randn(B, L, 96)
    pos = torch.arange(L).expand(B, L).clone()
    pos[1, 15:], pos[2, 9:] = 0, 0  # right padding, as `Batch` clamps its -1 positions
    runs = {}
    for attention in ("reference", "flex"):
        model.zero_grad()
        outs = model.unroll(ids, aux, pos, steps=4, attention=attention)
        g = torch.Generator().manual_seed(1)
        sum((h * torch.randn(h.shape, generator=g)).sum() for h in outs).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        runs[attention] = [h.detach() for h in outs], grads
    (ref_h, ref_g), (flex_h, flex_g) = runs["reference"], runs["flex"]
    assert len(flex_h) == 4
    for a, b in zip(ref_h, flex_h, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert ref_g.keys() == flex_g.keys() and "midlayer.self_attn.k_proj.weight" in ref_g
    for name in ref_g:
        torch.testing.assert_close(flex_g[name], ref_g[name], atol=2e-5, rtol=1e-5, msg=name)


def test_attention_choice_is_checked_up_front():
    with pytest.raises(ValueError, match="attention 'fast': choose auto, reference or flex"):
        TrainConfig.from_params({"attention": "fast"})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="attention flex needs CUDA"):
            TrainConfig.from_params({"attention": "flex"})
    ids = torch.zeros(1, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="attention 'x': choose reference or flex"):
        _tiny_drafter().unroll(ids, torch.zeros(1, 3, 96), ids, 1, attention="x")


def test_cpu_training_takes_the_reference_path():
    """`make run` on CPU: nothing compiled, the reference attention (auto or asked for)."""
    cpu = torch.device("cpu")
    assert attention_kind(TrainConfig(device="cpu"), cpu) == "reference"
    assert attention_kind(TrainConfig(device="cpu", attention="reference"), cpu) == "reference"


# ---- CUDA: the compiled kernel -------------------------------------------------------------


def _truth(q, keys, values):
    """The reference evaluated in float64 on the same (rounded) inputs."""
    d = [t.detach().double().requires_grad_() for t in (q, *keys, *values)]
    n = len(keys)
    return d, _reference(d[0], d[1 : 1 + n], d[1 + n :])


@pytest.mark.gpu
# each shape compiles its own kernels (~30 s): one small GQA case and the 8B bench's last step
@pytest.mark.parametrize("B,nh,nkv,hd,T,step,segments", [CASES[2], (4, 32, 8, 128, 2047, 6, 7)])
def test_compiled_cuda_kernel_in_bf16_is_as_close_to_exact_as_the_reference(
    B, nh, nkv, hd, T, step, segments
):
    q, keys, values = _inputs(B, nh, nkv, hd, T, step, torch.bfloat16, "cuda")
    d, exact = _truth(q, keys, values)
    up = torch.randn(exact.shape, generator=torch.Generator().manual_seed(1)).cuda()
    exact_g = torch.autograd.grad(exact, d, up.double())
    fused = fused_ttt_attention(q, keys, values, segments=segments)
    ref = _reference(q, keys, values)
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
        slack = 2**-8 * max(e.abs().max().item(), 1.0)  # one bf16 ulp at the largest value
        assert err_f <= 2 * err_r + slack, (err_f, err_r)


@pytest.mark.gpu
def test_the_compiled_kernel_compiles_once_per_padded_length_and_not_again():
    """Steps, batch sizes and lengths inside one P share a graph; a second pass over the same
    shapes compiles nothing (what the bench's steady windows rely on)."""
    shapes = [(4, 2047), (4, 1500), (3, 1900), (2, 2000), (5, 1100)]  # all P = 2048

    def run_all():
        for B, L in shapes:
            for step in range(3):
                q, keys, values = _inputs(B, 8, 2, 64, L - step, step, torch.bfloat16, "cuda")
                out = fused_ttt_attention(q, keys, values, segments=3)
                out.sum().backward()

    start = fused_attention.compiled_graphs()
    run_all()
    first = fused_attention.compiled_graphs() - start
    run_all()
    assert first <= 2  # the graph, and at most one more once the batch size varies
    assert fused_attention.compiled_graphs() - start == first
