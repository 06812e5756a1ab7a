"""Stage align: training features vs the serving engine's, on a fixed sample of rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specbuild.align import (
    AlignmentError,
    AlignSettings,
    alignment_faults,
    check_alignment,
    compare_alignment,
    compare_layer,
    pick_samples,
    plan_alignment,
)
from specbuild.hidden.shards import write_shard

LAYER_IDS = [1, 14, 26]


def test_pick_samples_is_fixed_by_the_seed_and_bounded_by_the_rows():
    a = pick_samples([3, 5], 4, seed=0)
    assert a == pick_samples([3, 5], 4, seed=0) and len(set(a)) == 4
    assert all(i < (3, 5)[s] for s, i in a)
    assert len(pick_samples([2], 10, seed=1)) == 2


def test_identical_features_align_perfectly():
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    la = compare_layer("low", 1, x, x.clone())
    assert la.cosine_min == pytest.approx(1.0) and la.max_abs_diff == 0.0
    assert la.norm_ratio == pytest.approx(1.0) and la.cosine_p1 == pytest.approx(1.0)
    assert la.other_layer_cosine is None  # no other layer given


def test_one_flipped_token_lowers_the_minimum_not_the_mean_or_the_tail():
    # 300 tokens, one of them computed differently (an MoE router flipping on a near-tie)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 16, generator=g)
    y = x.clone()
    y[7] = torch.randn(16, generator=g)
    la = compare_layer("last", None, x, y, other=torch.randn(300, 16, generator=g))
    assert la.cosine_min < 0.8 and la.cosine_mean > 0.99 and la.cosine_p1 == pytest.approx(1.0)
    assert abs(la.other_layer_cosine) < 0.2


def test_faults_name_each_layer_and_threshold_it_breaks():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=g)
    layers = [
        compare_layer("low", 1, x, x),
        compare_layer("mid", 14, x, 1.5 * x),  # same direction, 50% larger norm
        compare_layer("high", 26, x, torch.randn(16, 8, generator=g)),  # unrelated
    ]
    faults = alignment_faults(layers, min_cosine=0.99, max_abs_diff=None, norm_ratio_tolerance=0.05)
    assert [la.status for la in layers] == ["ok", "FAIL", "FAIL"]
    assert faults[0].startswith("layer mid (layer-output id 14): norm ratio 1.5000")
    assert faults[1].startswith("layer high (layer-output id 26): mean cosine")


def _tiny_shard(lengths, hidden, *, first_token, backend="hf", layer_ids=LAYER_IDS):
    """An in-memory shard (tensors, metadata) of rows of `lengths` tokens, each token's
    features filled with its token id, so a picked row is known by its values."""
    n = sum(lengths)
    ids = torch.arange(first_token, first_token + n, dtype=torch.int32)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    value = ids.float()[:, None]
    tensors = {
        "input_ids": ids,
        "offsets": offsets,
        "aux": value.expand(n, 3 * hidden).to(torch.bfloat16),
        "last": value.expand(n, hidden).to(torch.bfloat16),
    }
    return tensors, {"layer_ids": json.dumps(layer_ids), "backend": backend}


def test_the_plan_takes_the_picked_rows_token_ids_and_features_from_their_shards():
    shards = [_tiny_shard([2, 3], 4, first_token=0), _tiny_shard([1], 4, first_token=100)]
    plan = plan_alignment(shards, samples=2, seed=0)
    assert plan.picks == pick_samples([2, 1], 2, seed=0)
    spans = {(0, 0): [0, 1], (0, 1): [2, 3, 4], (1, 0): [100]}
    assert plan.batch == [spans[p] for p in plan.picks]
    tokens = [t for row in plan.batch for t in row]
    assert plan.train_aux.shape == (len(tokens), 12) and plan.train_aux.dtype == torch.float32
    assert plan.train_last[:, 0].tolist() == [float(t) for t in tokens]
    assert plan.layer_ids == LAYER_IDS and plan.shard_backends == ["hf"] and plan.hidden == 4


def test_the_plan_refuses_shards_of_different_layer_ids():
    shards = [_tiny_shard([2], 4, first_token=0), _tiny_shard([2], 4, first_token=9)]
    shards[1][1]["layer_ids"] = json.dumps([2, 14, 26])
    with pytest.raises(AlignmentError, match="shards disagree on layer_ids"):
        plan_alignment(shards, samples=1, seed=0)


def test_served_features_equal_to_the_plans_align_on_every_layer():
    plan = plan_alignment([_tiny_shard([3, 2], 4, first_token=1)], samples=2, seed=0)
    layers = compare_alignment(plan, plan.train_aux.clone(), plan.train_last.clone())
    assert [(la.layer, la.layer_id) for la in layers] == [
        ("low", 1),
        ("mid", 14),
        ("high", 26),
        ("last", None),
    ]
    assert all(la.max_abs_diff == 0.0 and la.tokens == 5 for la in layers)


@pytest.fixture(scope="module")
def hf_shard(tmp_path_factory, target_model) -> Path:
    """A real hf shard of three short samples (the layout stage hidden writes)."""
    from specbuild.hidden.hf import HFFeatureBackend

    samples = [[1, 9690, 2683, 2], [1, 4194, 314, 253, 1345, 2], [1, 504, 2]]
    feats = HFFeatureBackend(target_model, LAYER_IDS).extract(samples)
    flat = [t for s in samples for t in s]
    offsets = [0]
    for s in samples:
        offsets.append(offsets[-1] + len(s))
    tensors = {
        "input_ids": torch.tensor(flat, dtype=torch.int32),
        "loss_mask": torch.ones(len(flat), dtype=torch.uint8),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
        "aux": feats.aux.to(torch.bfloat16),
        "last": feats.last.to(torch.bfloat16),
    }
    meta = {
        "layer_ids": json.dumps(LAYER_IDS),
        "backend": "hf",
        "target_fingerprint": "t",
        "tokenizer_fingerprint": "k",
        "dtype": "bf16",
        "specbuild_version": "0",
    }
    path = tmp_path_factory.mktemp("hidden") / "00000.safetensors"
    write_shard(path, tensors, meta)
    return path


def _check(tmp_path, shard, target_dir, **kw):
    return check_alignment(
        shards=[shard],
        target_dir=target_dir,
        report=tmp_path / "report.json",
        settings=AlignSettings(samples=2, **kw),
    )


def test_hf_shards_served_by_hf_are_green(tmp_path, hf_shard, target_dir):
    layers = _check(tmp_path, hf_shard, target_dir, backend="hf", device="cpu")
    assert [la.layer for la in layers] == ["low", "mid", "high", "last"]
    assert all(la.status == "ok" and la.cosine_mean > 0.999 for la in layers)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] and report["layer_ids"] == LAYER_IDS and len(report["rows"]) == 2
    assert [layer["layer"] for layer in report["layers"]] == ["low", "mid", "high", "last"]
    # the control: each layer against the serving engine's next captured one scores far below
    # the threshold, so a layer-id mix-up would stop the build
    assert all(la.other_layer_cosine < 0.99 for la in layers), [
        la.other_layer_cosine for la in layers
    ]
    assert all(la.cosine_p1 > 0.999 for la in layers)


def test_a_shard_whose_final_state_is_off_stops_the_build_naming_it(tmp_path, hf_shard, target_dir):
    from specbuild.hidden.shards import read_shard

    tensors, meta = read_shard(hf_shard)
    tensors["last"] = (tensors["last"].float() * 1.2).to(torch.bfloat16)
    bad = tmp_path / "bad.safetensors"
    write_shard(bad, tensors, meta)
    with pytest.raises(AlignmentError, match=r"layer last \(final post-norm state\): norm ratio"):
        _check(tmp_path, bad, target_dir, backend="hf", device="cpu")


def test_shards_against_a_serving_engine_capturing_other_layers_stop_the_build(
    tmp_path, hf_shard, target_dir, target_model, fake_runner, monkeypatch
):
    # The story's failure: training features from other layers than the served drafter sees
    # (an engine shifting layer ids differently). The sglang backend's runner is faked on CPU
    # (SGLang's runner needs a GPU) and captures ids + 1.
    def runner(folder, *, layer_ids, **options):
        return fake_runner(target_model, [i + 1 for i in layer_ids])

    monkeypatch.setattr("specbuild.hidden.sglang.SGLangRunner", runner)
    with pytest.raises(AlignmentError) as err:
        _check(tmp_path, hf_shard, target_dir, backend="sglang")
    msg = str(err.value)
    assert "layer low (layer-output id 1)" in msg and "layer high" in msg
    assert "layer last" not in msg  # the final state does not depend on the capture
    assert "hidden.backend: sglang" in msg
