"""Training speed of stage train (`make bench-train`): one run's tokens/s, TFLOP/s and MFU.

    python -m benchmarks.train_speed OUT/spec.json                                    # 1 GPU
    torchrun --standalone --nproc_per_node 2 -m benchmarks.train_speed OUT/spec.json  # 2 GPUs

The spec (`benchmarks.synthetic` writes one) holds `train_drafter`'s arguments plus
`bench_out` (this module's JSON result) or `profile_out` (`train_profile.StepProfiler`'s
report). The result holds the trainer's speed windows (`drafter.throughput`): the first is
warm-up (CUDA context, allocator growth, kernel selection), and a window in which torch.compile
compiled a graph (the fused attention meeting a new padded length: a one-time cost of a run,
seconds against hours) measures the compiler; the `steady` figures leave both out, `all_steps`
keeps every window, and `benchmarks_row` is the BENCHMARKS.md row of the steady figures.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.train_profile import StepProfiler
from specbuild.drafter.observer import Observer, TrainRun
from specbuild.drafter.throughput import Throughput, Window, format_mfu
from specbuild.drafter.train import TrainConfig, TrainFiles, train_drafter
from specbuild.infra.io import write_json

__all__ = ["SpeedResult", "benchmarks_row", "speed_result", "steady"]

log = logging.getLogger("specbuild")


def steady(speed: Throughput) -> list[Window]:
    """Every window but the first (warm-up) and those that compiled a graph; the first
    compile-free one where that leaves none, or the only one there is."""
    later = speed.windows[1:]
    return [w for w in later if not w.compiled] or later[:1] or speed.windows


def speed_result(speed: Throughput, **context: object) -> dict:
    """The bench's JSON: steady and all-step rates, every window, and `context`."""
    return {
        "device": speed.device,
        "world_size": speed.world_size,
        "peak_tflops_per_device": speed.peak_tflops,
        "steady": speed.rates(steady(speed)),
        "all_steps": speed.rates(),
        "windows": [asdict(w) for w in speed.windows],
        **context,
    }


def _tflops(t: float) -> str:
    return f"{t:,.1f}" if t >= 10 else f"{t:.3g}"  # a CPU's 0.0125 stays readable


def benchmarks_row(result: dict) -> str:
    """One Markdown table row for BENCHMARKS.md from a bench result (steady rates)."""
    s, d = result["steady"], result["drafter"]
    shape = (
        f"H {d['hidden_size']}, Vd {d['draft_vocab_size']:,}, {result['ttt_steps']} TTT, "
        f"L <= {result['max_length']:,}, {result['token_budget']:,} tok/rank"
    )
    return (
        f"| {shape} | {result['device']} x{result['world_size']} | {s['steps']} steps, "
        f"{s['tokens']:,} tokens, {s['seconds']:.1f} s | {s['tokens_per_s']:,.0f} tokens/s | "
        f"{_tflops(s['tflops_per_s'])} TFLOP/s | MFU {format_mfu(s['mfu'])} |"
    )


class SpeedResult(Observer):
    """Writes `out` (`speed_result`, with the run's shapes) at the end of the run, rank 0."""

    def __init__(self, out: str | os.PathLike) -> None:
        self.out = Path(out)

    def on_end(self, run: TrainRun) -> None:
        if run.ranks.rank != 0:
            return
        cfg = run.config
        result = speed_result(
            run.speed,
            drafter=run.objective.drafter.config.to_dict(),
            ttt_steps=cfg.ttt_steps,
            max_length=cfg.max_length,
            token_budget=cfg.token_budget,
            torch=torch.__version__,
            attention=run.attention,
            loss=run.loss,
        )
        write_json(self.out, result)
        log.info("bench -> %s; BENCHMARKS.md row (steady, first window left out):", self.out)
        log.info("%s", benchmarks_row(result))


def main(argv: list[str] | None = None) -> None:
    """Train the spec's job under its observer (each torchrun worker runs this too)."""
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    bench_out, profile_out = spec.pop("bench_out", None), spec.pop("profile_out", None)
    if (bench_out is None) == (profile_out is None):
        raise SystemExit(f"{argv[0]}: give bench_out or profile_out, not both or neither")
    observer = SpeedResult(bench_out) if bench_out else StepProfiler(profile_out)
    spec["config"] = TrainConfig.from_params(spec["config"])
    spec["files"] = TrainFiles(**spec["files"])
    train_drafter(**spec, observer=observer)


if __name__ == "__main__":
    main()
