"""Hooks into a training run for code outside the product: the benchmarks' speed result and
step profile (`benchmarks/train_speed.py`, `benchmarks/train_profile.py`), a test's kill.

`train_drafter(observer=...)` calls, in every rank's process:

    on_start(run)   before the first step this process takes (a resumed run: state.step + 1)
    on_step(run)    after each step, its progress line, eval and checkpoint; `run.state.step`
                    is the step just taken, and an exception raised here stops the run where a
                    kill would, with the checkpoints written so far
    on_end(run)     after the last step and the speed summary, before the outputs are written

An observer reads the run; what it changes there, training sees.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbuild.drafter.config import TrainConfig
from specbuild.drafter.launch import Ranks
from specbuild.drafter.objective import TTTObjective
from specbuild.drafter.state import TrainState
from specbuild.drafter.throughput import Throughput

__all__ = ["Observer", "TrainRun"]


@dataclass(frozen=True)
class TrainRun:
    """One process's run, as its observer sees it; `state` and `speed` change as it goes."""

    config: TrainConfig
    ranks: Ranks
    objective: TTTObjective  # `objective.drafter` is the model being trained
    state: TrainState
    total_steps: int  # the whole run's, steps before a resume included
    speed: Throughput  # the progress windows closed so far
    attention: str  # train.attention and train.loss, resolved for this device
    loss: str


class Observer:
    """Does nothing at each hook: subclass it and override the hooks you need."""

    def on_start(self, run: TrainRun) -> None:
        pass

    def on_step(self, run: TrainRun) -> None:
        pass

    def on_end(self, run: TrainRun) -> None:
        pass
