"""The training-speed bench (benchmarks/train_speed.py, train_profile.py, synthetic.py): the
steady windows, the bench JSON, the profile and the workspace spec. No timings are asserted:
only counts, sums and files. The FLOP count: tests/unit/drafter/test_flops.py; MFU:
tests/unit/drafter/test_throughput.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.synthetic import PRESETS, main, train_outputs
from benchmarks.train_profile import GROUPS, StepProfiler
from benchmarks.train_speed import SpeedResult, steady
from specbuild.drafter.flops import peak_tflops
from specbuild.drafter.throughput import Throughput, Window
from specbuild.drafter.train import TrainConfig, TrainFiles, train_drafter

H, V = 64, 256  # the tiny preset's hidden size and target vocabulary


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


def _train(ws, out: Path, **kw):
    cfg = dict(epochs=2, token_budget=96, max_length=24, eval_fraction=0, ttt_steps=3)
    cfg |= kw.pop("config", {})
    return train_drafter(
        files=TrainFiles(
            shards=ws["shards"],
            vocab=ws["vocab"],
            target_fingerprint=ws["target_fingerprint"],
            **train_outputs(out),
        ),
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
    shard = Path(json.loads((tmp_path / "spec.json").read_text())["files"]["shards"][0])
    mtime = shard.stat().st_mtime_ns
    main([str(tmp_path), "--spec-only", "--profile", "--nproc", "2"])
    spec = json.loads((tmp_path / "spec.json").read_text())
    assert shard.stat().st_mtime_ns == mtime  # not written again
    assert spec["profile_out"].endswith("profile.json") and "bench_out" not in spec
    assert spec["config"]["nproc"] == 2 and len(spec["files"]["shards"]) == PRESETS["tiny"].shards
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
