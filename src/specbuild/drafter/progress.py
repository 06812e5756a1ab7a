"""What a training run reports: its plan (`log_plan`), then as it goes progress lines, eval
lines and TensorBoard curves.

A progress line closes a speed window (`throughput.Window`): the tokens and FLOPs of the steps
since the last line, summed over the ranks, over the wall time of those steps. The loop opens
the next window only after its eval and checkpoint, so their time is in no window; on CUDA a
window closes after the device has finished its queued work. The curves: rank 0's
(`curves.Curves`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch

from specbuild.drafter import fused_attention
from specbuild.drafter.config import TrainConfig
from specbuild.drafter.curves import Curves
from specbuild.drafter.flops import device_name, peak_tflops
from specbuild.drafter.launch import Ranks
from specbuild.drafter.throughput import Throughput, Window, format_mfu

__all__ = ["Progress", "RunPlan", "log_plan"]

log = logging.getLogger("specbuild")


@dataclass(frozen=True)
class RunPlan:
    """What a run is about to do, as its first line says."""

    trainable: int  # parameters
    train_samples: int
    eval_samples: int
    held_out: bool  # the eval samples are `train.eval_set`'s (else the `eval_fraction` split)
    skipped: int  # samples too short or without a predicted response token
    steps: int
    kinds: str  # the attention, loss and precision resolved for the device


def log_plan(plan: RunPlan, *, cfg: TrainConfig, ranks: Ranks) -> None:
    """The line before the first step: the drafter's size, the data, the steps and where they
    run."""
    log.info(
        "drafter %.1fM trainable params; %d train / %d eval samples%s (%d skipped); %d steps "
        "of <= %d tokens x %d rank(s) on %s; %s",
        plan.trainable / 1e6,
        plan.train_samples,
        plan.eval_samples,
        f" of eval set {cfg.eval_set!r}" if plan.held_out else "",
        plan.skipped,
        plan.steps,
        cfg.token_budget,
        ranks.world,
        ranks.device,
        plan.kinds,
    )


class Progress:
    """The progress reporting of one run of `total` steps, resumed after `start_step`."""

    def __init__(
        self,
        ranks: Ranks,
        tensorboard_dir: str | os.PathLike | None,
        *,
        start_step: int,
        total: int,
    ) -> None:
        self.ranks, self.total = ranks, total
        self.curves = Curves(tensorboard_dir if ranks.rank == 0 else None, start_step=start_step)
        name = device_name(ranks.device)
        self.speed = Throughput(name, ranks.world, peak_tflops(name))
        self.tokens, self.flops, self.first, self.losses = 0, 0, start_step + 1, []
        self.restart()

    def restart(self) -> None:
        """Open the next window's clock (after a line, its eval and checkpoint)."""
        self.clock = time.perf_counter()
        self.graphs = fused_attention.compiled_graphs()  # torch.compile graphs at the start

    def add(self, tokens: int, flops: int, loss: torch.Tensor) -> None:
        """Count one step of this rank into the open window."""
        self.tokens += tokens
        self.flops += flops
        self.losses.append(loss.detach())  # no .item() here: the host runs on to the next batch

    def line(self, step: int, epoch: int, lr: float) -> int:
        """Close the window at `step`: log its loss, lr and speed, draw them; the tokens of
        the window on all ranks."""
        if self.ranks.device.type == "cuda":  # the window's queued work belongs to its time
            torch.cuda.synchronize(self.ranks.device)
        tokens, flops = self.ranks.sum([self.tokens, self.flops])
        elapsed = time.perf_counter() - self.clock
        compiled = fused_attention.compiled_graphs() - self.graphs
        self.speed.windows.append(Window(epoch, self.first, step, tokens, flops, elapsed, compiled))
        rates = self.speed.rates(self.speed.windows[-1:])
        progress = {
            "loss": sum(torch.stack(self.losses).tolist()) / len(self.losses),  # = the .item() sum
            "lr": lr,
            "tokens_per_s": rates["tokens_per_s"],
        }
        log.info(
            "step %d/%d epoch %d loss %.4f lr %.2e %.0f tokens/s %.2f TFLOP/s MFU %s",
            step,
            self.total,
            epoch,
            *progress.values(),
            rates["tflops_per_s"],
            format_mfu(rates["mfu"]),
        )
        if compiled:  # the first window compiles; a later one should not (see the bench)
            log.info(
                "%d torch.compile graph(s) compiled in steps %d-%d", compiled, self.first, step
            )
        self.curves.train(step, **progress)
        self.tokens, self.flops, self.first, self.losses = 0, 0, step + 1, []
        return tokens

    def tokens_per_s(self) -> float | None:
        """Training speed of this run so far (a timing: compare variants, not runs)."""
        return self.speed.rates()["tokens_per_s"] if self.speed.windows else None

    def eval(self, step: int, row: dict, *, best: bool) -> None:
        self.curves.eval(step, row)
        log.info(
            "eval step %d: acc %s accept_len %.3f%s",
            step,
            row["acc"],
            row["acceptance_length"],
            " (best)" if best else "",
        )

    def close(self) -> None:
        """Close the curves and log the speed of every step of the run."""
        self.curves.close()
        done = self.speed.rates()
        log.info(
            "trained %d tokens in %.1f s of steps: %.0f tokens/s, %.2f TFLOP/s, MFU %s on %s "
            "(%d rank(s))",
            done["tokens"],
            done["seconds"],
            done["tokens_per_s"],
            done["tflops_per_s"],
            format_mfu(done["mfu"]),
            self.speed.device,
            self.speed.world_size,
        )
