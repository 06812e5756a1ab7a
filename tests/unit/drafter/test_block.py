"""Block drafters (DFlash, DSpark): the training forward is the served forward, and they learn.

The served draft (`BlockDrafter.block_rows`, what the PyTorch bench engine and SGLang's worker
run: a context cache grown position by position, then one block) must give the very rows the
training forward gives the same block among many others; otherwise a drafter trains on one
computation and serves another.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks.synthetic import SyntheticSpec, make_workspace, train_outputs
from specbuild.drafter.block import BlockConfig, BlockDrafter, chunked_cross_entropy
from specbuild.drafter.block_objective import pick_blocks
from specbuild.drafter.train import TrainConfig, TrainFiles, train_drafter
from specbuild.infra.io import read_jsonl


def tiny(family: str, **kw) -> BlockDrafter:
    torch.manual_seed(0)
    cfg = BlockConfig(
        family=family,
        drafts=3,
        num_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=50,
        mask_token_id=7,
        markov_rank=4 if family == "dspark" else 0,
        **kw,
    )
    model = BlockDrafter(cfg)
    with torch.no_grad():
        for p in model.parameters():  # norms and heads too: nothing left at its neutral init
            p.normal_(0, 0.3)
    return model.eval()


@pytest.mark.parametrize("family", ["dflash", "dspark"])
def test_training_block_rows_equal_the_served_block(family):
    model = tiny(family)
    L, S = 12, model.config.block_len
    aux = torch.randn(1, L, 3 * 32)
    ids = torch.randint(0, 50, (1, L))
    anchors = torch.tensor([[2, 5, 9]])
    block_ids = torch.full((1, 3, S), 7)
    block_ids[0, :, 0] = ids[0, anchors[0]]
    block_pos = anchors[:, :, None] + 1 + torch.arange(S)
    with torch.no_grad():
        trained = model(aux, block_ids, block_pos, anchors)  # shape: [1,3,S,H]
        for n, s in enumerate(anchors[0].tolist()):
            context = model.new_context()
            model.extend_context(context, aux[:, : s - 1])  # grown in two pieces, as served
            model.extend_context(context, aux[:, s - 1 : s + 1])
            served = model.block_rows(context, int(ids[0, s]))
            torch.testing.assert_close(served, trained[0, n], rtol=1e-5, atol=1e-5)


def test_a_block_sees_the_context_up_to_its_anchor_and_no_further():
    model = tiny("dflash")
    aux = torch.randn(1, 10, 96)
    later = aux.clone()
    later[:, 5:] = torch.randn(1, 5, 96)  # changes only what lies after anchor index 4
    args = (torch.full((1, 1, 4), 7), torch.arange(5, 9)[None, None], torch.tensor([[4]]))
    with torch.no_grad():
        torch.testing.assert_close(model(aux, *args), model(later, *args))
        earlier = aux.clone()
        earlier[:, 4] += 1.0
        assert not torch.allclose(model(aux, *args), model(earlier, *args))


def test_anchors_are_drawn_among_the_counted_indices_only():
    valid = torch.zeros(3, 20, dtype=torch.bool)
    valid[0, 5:15] = True
    valid[1, 2:4] = True
    blocks = pick_blocks(valid, 4, torch.Generator().manual_seed(0))
    assert blocks.anchors.shape == (3, 4)
    assert blocks.keep.sum(1).tolist() == [4, 2, 0]
    for b in range(3):
        picked = blocks.anchors[b][blocks.keep[b]]
        assert bool(valid[b, picked].all()) and len(set(picked.tolist())) == len(picked)


def test_chunked_cross_entropy_matches_the_whole_and_its_gradient():
    torch.manual_seed(0)
    rows = torch.randn(37, 16, requires_grad=True)
    head, labels = torch.randn(50, 16), torch.randint(0, 50, (37,))
    bias = torch.nn.Embedding(50, 50)
    prev = torch.randint(0, 50, (37,))
    got = chunked_cross_entropy(rows, head, labels, bias=bias, prev=prev, chunk=8)
    want = torch.nn.functional.cross_entropy(rows @ head.t() + bias(prev), labels, reduction="none")
    torch.testing.assert_close(got, want)
    (g1,) = torch.autograd.grad(got.sum(), rows)
    (g2,) = torch.autograd.grad(want.sum(), rows)
    torch.testing.assert_close(g1, g2)


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("ws"), SyntheticSpec(samples=16, seq_len=24))


@pytest.mark.parametrize("family", ["dflash", "dspark"])
def test_block_drafters_train_and_their_acceptance_rises(ws, tmp_path, family):
    cfg = TrainConfig(
        epochs=6,
        token_budget=96,
        max_length=24,
        eval_fraction=0,
        lr=3e-3,
        log_interval=100,
        family=family,
        block_drafts=3,
        block_layers=1,
        mask_token_id=5,
        markov_rank=8,
    )
    files = TrainFiles(
        shards=ws["shards"],
        vocab=ws["vocab"],
        target_fingerprint=ws["target_fingerprint"],
        **train_outputs(tmp_path),
    )
    best = train_drafter(files=files, config=cfg, threads=1)
    rows = [r["acceptance_length"] for r in read_jsonl(tmp_path / "metrics.jsonl")]
    assert rows[-1] > rows[0] and best["acceptance_length"] > 1.15
    assert len(best["acc"]) == 3


def test_target_last_layer_starts_each_draft_layer_from_the_targets_last_ones(target_dir):
    from safetensors import safe_open

    from specbuild.drafter.block_build import init_block_from_target
    from specbuild.infra.io import read_json

    model = BlockDrafter(
        BlockConfig.from_target(
            read_json(target_dir / "config.json"),
            family="dflash",
            drafts=3,
            num_layers=2,
            mask_token_id=16,
        )
    )
    lines = init_block_from_target(model, target_dir)
    assert len(lines) == 2 * 9 and lines[0].startswith("layers.0.input_layernorm.weight <- ")
    with safe_open(str(target_dir / "model.safetensors"), framework="pt") as f:
        for i, target_layer in enumerate((28, 29)):  # SmolLM2's 30 layers: the last two
            want = f.get_tensor(f"model.layers.{target_layer}.mlp.down_proj.weight")
            assert torch.equal(model.layers[i].mlp.down_proj.weight, want.float())
    # the per-head norms SmolLM2 lacks keep their start
    assert torch.equal(model.layers[1].self_attn.q_norm.weight, torch.ones(64))
    too_deep = BlockDrafter(dataclasses.replace(model.config, num_layers=31))
    with pytest.raises(ValueError, match="31 draft layers, the target has 30"):
        init_block_from_target(too_deep, target_dir)


def test_the_mask_token_is_one_the_targets_vocabulary_already_holds(target_dir, ws):
    from specbuild.drafter.block_build import mask_token

    # SmolLM2 has no mask token and ids 0-16 are its special tokens: the last free one
    assert mask_token(target_dir, 49152) == ("<empty_output>", 16)
    assert mask_token(target_dir, 49152, 5) == ("<file_sep>", 5)
    target = ws["target_fingerprint"].rsplit("/", 1)[0]  # a synthetic target: no tokenizer
    assert mask_token(target, 256, 5) == ("", 5)
    with pytest.raises(ValueError, match="set train.mask_token_id"):
        mask_token(target, 256)
