"""Training curves as TensorBoard event files, beside metrics.jsonl (rank 0 only).

    tensorboard --logdir results/train    # every variant's curves, side by side

Written through torch's own SummaryWriter: `train/loss`, `train/lr`, `train/tokens_per_s` at
every progress line, `eval/acceptance_length` and `eval/acc_<k>` (per TTT step) at every
evaluation, all against the optimizer step. A run that resumes purges events past its
checkpoint's step, so a killed run's last minutes are not drawn twice; a fresh run starts an
empty folder, so curves of other inputs or code never mix with this run's.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from typing import Any

__all__ = ["Curves"]

log = logging.getLogger("specbuild")


class Curves:
    """Event-file writer of one training run; a no-op where `log_dir` is None."""

    def __init__(self, log_dir: str | os.PathLike | None, *, start_step: int) -> None:
        self.writer = None
        if log_dir is None:
            return
        if start_step == 0:
            shutil.rmtree(log_dir, ignore_errors=True)
        from torch.utils.tensorboard import SummaryWriter

        # events of the checkpoint's own step were written before it was saved: keep them
        self.writer = SummaryWriter(str(log_dir), purge_step=start_step + 1 if start_step else None)

    def train(self, step: int, *, loss: float, lr: float, tokens_per_s: float) -> None:
        if self.writer is not None:
            self.writer.add_scalar("train/loss", loss, step)
            self.writer.add_scalar("train/lr", lr, step)
            self.writer.add_scalar("train/tokens_per_s", tokens_per_s, step)

    def eval(self, step: int, row: Mapping[str, Any]) -> None:
        if self.writer is not None:
            self.writer.add_scalar("eval/acceptance_length", row["acceptance_length"], step)
            for k, acc in enumerate(row["acc"], 1):
                self.writer.add_scalar(f"eval/acc_{k}", acc, step)
            self.writer.flush()  # an eval is the point a user looks at: make it visible now

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
