"""Speed accounting of stage train: the analytic FLOP count, MFU, the bench JSON and the profile.

The FLOP count is checked against torch's own FlopCounterMode on a real forward + backward of
the tiny drafter (reference attention): the matrix products agree exactly once two known
differences are accounted for: the training-time-test extra keys, which the reference computes
elementwise and FlopCounterMode does not count (0.6% of the step at these shapes, under 0.01%
at 8B shapes), and the masked upper half of each step's T x T scores, which the reference
computes and FlopCounterMode counts but which is no model work (flops.py counts causal pairs).
No timings are asserted: only counts, sums and files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.synthetic import PRESETS, SyntheticSpec, main, make_workspace, train_outputs
from benchmarks.train_profile import GROUPS, StepProfiler
from benchmarks.train_speed import SpeedResult, benchmarks_row, speed_result, steady
from specbuild.drafter.build import build_drafter
from specbuild.drafter.config import DrafterConfig
from specbuild.drafter.data import ShardSet
from specbuild.drafter.flops import StepWork, peak_tflops, step_flops
from specbuild.drafter.model import Eagle3Drafter
from specbuild.drafter.objective import TTTObjective
from specbuild.drafter.throughput import Throughput, Window
from specbuild.drafter.train import TrainConfig, train_drafter
from specbuild.target import read_target_info

H, V = 64, 256  # the tiny preset's hidden size and target vocabulary


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("ws"), SyntheticSpec(samples=16, seq_len=24))


def _objective(ws, steps: int) -> tuple[TTTObjective, ShardSet]:
    info = read_target_info(ws["target_fingerprint"])
    target = Path(ws["target_fingerprint"]).parent
    model, teacher = build_drafter(TrainConfig(), target, ws["vocab"], info.vocab_size)
    objective = TTTObjective(model, teacher, steps=steps, decay=0.8, amp=False)
    return objective, ShardSet(ws["shards"], hidden_size=H)


@pytest.mark.parametrize("steps", [1, 3, 7])
def test_step_flops_equal_torch_flop_counter_but_for_extra_keys_and_masked_scores(ws, steps):
    objective, data = _objective(ws, steps)
    batch = data.batch(data.refs[:3], 24)
    with FlopCounterMode(display=False) as counter:
        objective(batch).backward()
    parts = step_flops(objective.drafter.config, objective.work)
    B, L = objective.work.batch, objective.work.length
    assert B == 3 and len(objective.work.loss_rows) == steps
    assert objective.work.full_vocab_rows > 0  # a sample's first sight runs the full vocab
    # the reference's masked upper half: T (T - 1) / 2 pairs a head, scores and values, x3
    q = objective.drafter.config.num_attention_heads * objective.drafter.config.head_dim
    masked = sum(3 * 2 * B * q * (L - i) * (L - i - 1) for i in range(steps))
    ours = sum(parts.values()) - parts["attention_extra_keys"]
    assert ours + masked == counter.get_total_flops()
    assert (parts["attention_extra_keys"] > 0) == (steps > 1)
    assert sum(parts.values()) + masked == pytest.approx(counter.get_total_flops(), rel=0.01)
    objective(batch)  # the same samples again: their full-vocab argmax is memoized
    assert objective.work.full_vocab_rows == 0


def test_dense_parts_follow_six_times_parameters_times_rows():
    """The textbook count (2 per weight per row forward, 4 backward), from parameter counts."""
    cfg = DrafterConfig(
        hidden_size=H,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=V,
        draft_vocab_size=128,
        target_hidden_size=H,
    )
    model = Eagle3Drafter(cfg)
    layer = model.midlayer
    dense = sum(
        m.weight.numel()
        for m in [*layer.self_attn.children(), layer.mlp.gate_proj, layer.mlp.up_proj]
        + [layer.mlp.down_proj]
    )
    B, L, N = 2, 10, 5
    parts = step_flops(cfg, StepWork(B, L, (N,), teacher_rows=N, full_vocab_rows=3))
    assert parts["projections"] + parts["mlp"] == 6 * dense * B * L
    assert parts["fc"] == 4 * model.fc.weight.numel() * B * L  # fc's input is data: no dgrad
    assert parts["lm_head"] == 6 * model.lm_head.weight.numel() * N
    assert parts["teacher_draft"] == 2 * model.lm_head.weight.numel() * N  # no backward
    assert parts["teacher_full_vocab"] == 2 * H * V * 3
    pairs = L * (L + 1) // 2  # causal (query, key) pairs a head: the masked half is not work
    assert parts["attention"] == 3 * 2 * 2 * B * 4 * 16 * pairs
    assert parts["attention_extra_keys"] == 0


def test_the_peak_comes_from_the_device_name_and_a_cpu_has_none():
    assert peak_tflops("NVIDIA H200") == 989.5
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.5
    assert peak_tflops("NVIDIA H100 PCIe") == 756.5
    assert peak_tflops("NVIDIA H200 NVL") == 835.5
    assert peak_tflops("cpu") is None


def test_steady_leaves_out_windows_that_compiled_a_graph():
    """A new padded length compiles the fused attention mid-run (one-time seconds): the steady
    rate measures the training, the all-step rate keeps every window."""
    speed = Throughput("NVIDIA H200", 1, 989.5)
    speed.windows += [
        Window(0, 1, 5, tokens=1_000, flops=10**15, seconds=10.0, compiled=1),
        Window(0, 6, 10, tokens=4_000, flops=10**15, seconds=2.0),
        Window(0, 11, 15, tokens=4_000, flops=10**15, seconds=8.0, compiled=1),
        Window(1, 16, 20, tokens=4_000, flops=10**15, seconds=2.0),
    ]
    rates = speed.rates(steady(speed))
    assert rates["steps"] == 10 and rates["tokens_per_s"] == 2_000 and rates["compiled"] == 0
    assert speed.rates()["compiled"] == 2 and speed.rates()["tokens"] == 13_000
    only_compiling = Throughput("NVIDIA H200", 1, 989.5)
    only_compiling.windows += speed.windows[:1] + speed.windows[2:3]
    assert steady(only_compiling) == [speed.windows[2]]  # nothing better to report


def test_mfu_divides_by_every_ranks_peak_and_leaves_the_warmup_window_out():
    speed = Throughput("NVIDIA H200", 2, 989.5)
    speed.windows += [
        Window(0, 1, 5, tokens=1_000, flops=10**15, seconds=10.0),  # warm-up: slow
        Window(0, 6, 10, tokens=4_000, flops=1_979 * 10**12, seconds=2.0),
    ]
    rates = speed.rates(steady(speed))
    assert rates["tokens_per_s"] == 2_000 and rates["steps"] == 5
    assert rates["tflops_per_s"] == pytest.approx(989.5)
    assert rates["mfu"] == pytest.approx(0.5)  # 989.5 TFLOP/s over 2 x 989.5
    assert speed.rates()["tokens"] == 5_000
    result = speed_result(
        speed,
        drafter={"hidden_size": 4096, "draft_vocab_size": 32000},
        ttt_steps=7,
        max_length=2048,
        token_budget=8192,
    )
    row = benchmarks_row(result)
    assert "NVIDIA H200 x2" in row and "2,000 tokens/s" in row and "MFU 50.0%" in row
    assert Throughput("cpu", 1, None).rates([Window(0, 1, 1, 10, 10, 1.0)])["mfu"] is None


def _train(ws, out: Path, **kw):
    cfg = dict(epochs=2, token_budget=96, max_length=24, eval_fraction=0, ttt_steps=3)
    cfg |= kw.pop("config", {})
    return train_drafter(
        shards=ws["shards"],
        vocab=ws["vocab"],
        target_fingerprint=ws["target_fingerprint"],
        **train_outputs(out),
        config=TrainConfig(**cfg, log_interval=100),
        threads=1,
        **kw,
    )


def test_the_bench_json_counts_the_full_vocab_pass_in_the_first_epoch_only(ws, tmp_path):
    _train(ws, tmp_path, observer=SpeedResult(tmp_path / "result.json"))
    result = json.loads((tmp_path / "result.json").read_text())
    first, second = result["windows"]  # one progress window per epoch of 4 steps
    assert (first["epoch"], second["epoch"]) == (0, 1) and first["tokens"] == second["tokens"]
    rows = 16 * 16  # 16 samples x 16 loss rows (the last two thirds of 24 tokens, shifted)
    assert first["flops"] - second["flops"] == 2 * H * V * rows
    assert result["steady"]["flops"] == second["flops"]  # the first window is warm-up
    assert result["all_steps"]["steps"] == 8 and result["world_size"] == 1
    assert result["device"] == "cpu" and result["steady"]["mfu"] is None


def test_profile_groups_cover_the_wall_time_of_the_profiled_steps(ws, tmp_path):
    out = tmp_path / "profile.json"
    _train(ws, tmp_path, observer=StepProfiler(out), config={"epochs": 1, "token_budget": 48})
    report = json.loads(out.read_text())
    assert report["steps"] == [4, 6] and report["device"] == "cpu"
    groups = report["groups"]
    assert set(groups) == set(GROUPS)
    assert sum(g["share"] for g in groups.values()) == pytest.approx(1.0, abs=0.01)
    for g in ("attention (TTT steps)", "lm_head + teacher/loss", "fc + MLP + projections"):
        assert groups[g]["share"] > 0.01, g
    assert groups["optimizer step"]["s"] > 0
    # every backward op found the forward op that made its node
    assert report["labels"].get("backward (unmatched)", 0.0) < 0.02 * report["wall_s"]
    assert (tmp_path / "profile.txt").read_text().startswith("profile of steps 4-6 on cpu")
    assert (tmp_path / "profile.trace.json.gz").stat().st_size > 0


def test_spec_only_reuses_the_workspace_and_refuses_one_that_is_not_there(tmp_path, capsys):
    with pytest.raises(SystemExit, match="holds no tiny workspace"):
        main([str(tmp_path), "--spec-only"])
    main([str(tmp_path)])
    shard = Path(json.loads((tmp_path / "spec.json").read_text())["shards"][0])
    mtime = shard.stat().st_mtime_ns
    main([str(tmp_path), "--spec-only", "--profile", "--nproc", "2"])
    spec = json.loads((tmp_path / "spec.json").read_text())
    assert shard.stat().st_mtime_ns == mtime  # not written again
    assert spec["profile_out"].endswith("profile.json") and "bench_out" not in spec
    assert spec["config"]["nproc"] == 2 and len(spec["shards"]) == PRESETS["tiny"].shards
    with pytest.raises(SystemExit, match="holds no llama8b workspace .missing .*00002"):
        main([str(tmp_path), "--spec-only", "--preset", "llama8b"])


@pytest.mark.gpu
def test_cuda_runs_count_flops_against_the_devices_peak_and_profile_kernel_time(ws, tmp_path):
    import torch

    cuda = {"device": "cuda"}
    _train(ws, tmp_path / "bench", observer=SpeedResult(tmp_path / "result.json"), config=cuda)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["device"] == torch.cuda.get_device_name() and result["steady"]["flops"] > 0
    assert (result["steady"]["mfu"] is None) == (peak_tflops(result["device"]) is None)
    out = tmp_path / "profile.json"
    _train(
        ws,
        tmp_path / "prof",
        observer=StepProfiler(out),
        config=cuda | {"epochs": 1, "token_budget": 48},
    )
    report = json.loads(out.read_text())
    assert report["basis"] == "device kernel time"
    groups = report["groups"]
    assert sum(g["share"] for g in groups.values()) == pytest.approx(1.0, abs=0.01)
    for g in ("attention (TTT steps)", "lm_head + teacher/loss", "fc + MLP + projections"):
        assert groups[g]["s"] > 0, g
    assert report["labels"].get("backward (unmatched)", 0.0) < 0.02 * report["wall_s"]
