"""Training speed: tokens/s, achieved TFLOP/s and model FLOPs utilisation (MFU).

    MFU = FLOPs the steps needed (`flops.step_flops`, summed over ranks)
          / (seconds of steps x ranks x the device's dense bf16 peak (`flops.peak_tflops`))

Seconds are wall time of optimizer steps, eval and checkpoints excluded, measured in windows
that close at the trainer's progress lines (every `log_interval` steps and at each epoch's end);
on CUDA a window closes only after the device has finished its queued work. The first window is
warm-up (CUDA context, allocator growth, kernel selection), and a later window in which
torch.compile compiled a graph (the fused attention meeting a new padded length: a one-time
cost of the run, seconds against hours) measures the compiler: `steady` leaves both out, and
the bench (`make bench-train`) reports the steady figures beside the all-step ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["Throughput", "Window", "benchmarks_row", "format_mfu"]


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

    def steady(self) -> list[Window]:
        """Every window but the first (warm-up) and those that compiled a graph; the first
        compile-free one where that leaves none, or the only one there is."""
        later = self.windows[1:]
        return [w for w in later if not w.compiled] or later[:1] or self.windows

    def result(self, **context: object) -> dict:
        """The bench's JSON: steady and all-step rates, every window, and `context`."""
        return {
            "device": self.device,
            "world_size": self.world_size,
            "peak_tflops_per_device": self.peak_tflops,
            "steady": self.rates(self.steady()),
            "all_steps": self.rates(),
            "windows": [asdict(w) for w in self.windows],
            **context,
        }


def _tflops(t: float) -> str:
    return f"{t:,.1f}" if t >= 10 else f"{t:.3g}"  # a CPU's 0.0125 stays readable


def format_mfu(mfu: float | None) -> str:
    return "n/a" if mfu is None else f"{100 * mfu:.1f}%"


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
