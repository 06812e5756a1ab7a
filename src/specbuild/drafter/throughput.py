"""Training speed: tokens/s, achieved TFLOP/s and model FLOPs utilisation (MFU).

    MFU = FLOPs the steps needed (`flops.step_flops`, summed over ranks)
          / (seconds of steps x ranks x the device's dense bf16 peak (`flops.peak_tflops`))

Seconds are wall time of optimizer steps, eval and checkpoints excluded, measured in windows
that close at the trainer's progress lines (every `log_interval` steps and at each epoch's end);
on CUDA a window closes only after the device has finished its queued work (`progress.py`).
The trainer logs each window's rates and the whole run's; the bench (`make bench-train`,
`benchmarks/train_speed.py`) also reports them without the warm-up window and the windows that
compiled a graph (`Window.compiled`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Throughput", "Window", "format_mfu"]


@dataclass(frozen=True)
class Window:
    epoch: int
    first_step: int  # optimizer steps first_step .. last_step (1-based, inclusive)
    last_step: int
    tokens: int  # all ranks
    flops: int  # all ranks
    seconds: float
    compiled: int = 0  # torch.compile graphs compiled in the window (rank 0): 0 once warm


@dataclass
class Throughput:
    device: str  # "NVIDIA H200", "cpu"
    world_size: int
    peak_tflops: float | None  # per device; None: MFU is n/a (CPU, an unknown accelerator)
    windows: list[Window] = field(default_factory=list)

    def rates(self, windows: list[Window] | None = None) -> dict:
        """Totals and rates over `windows` (all by default)."""
        ws = self.windows if windows is None else windows
        tokens, flops = sum(w.tokens for w in ws), sum(w.flops for w in ws)
        seconds = sum(w.seconds for w in ws)
        tflops = flops / max(seconds, 1e-9) / 1e12
        mfu = None
        if self.peak_tflops:
            mfu = tflops / (self.world_size * self.peak_tflops)
        return {
            "steps": sum(w.last_step - w.first_step + 1 for w in ws),
            "tokens": tokens,
            "flops": flops,
            "seconds": seconds,
            "tokens_per_s": tokens / max(seconds, 1e-9),
            "tflops_per_s": tflops,
            "mfu": mfu,
            "compiled": sum(w.compiled for w in ws),
        }


def format_mfu(mfu: float | None) -> str:
    return "n/a" if mfu is None else f"{100 * mfu:.1f}%"
