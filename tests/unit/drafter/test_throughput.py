"""Training speed's rates: tokens/s, TFLOP/s and MFU over the trainer's windows, and the
bench's row of them. No timings are measured: the windows are written by hand."""

from __future__ import annotations

import pytest

from benchmarks.train_speed import benchmarks_row, speed_result, steady
from specbuild.drafter.throughput import Throughput, Window


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
