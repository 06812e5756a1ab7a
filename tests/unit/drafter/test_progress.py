"""Progress lines: a line closes a speed window over the steps since the last one."""

from __future__ import annotations

import logging

import pytest
import torch

from specbuild.drafter.launch import Ranks
from specbuild.drafter.progress import Progress


def test_a_line_closes_the_window_of_the_steps_since_the_last_one(caplog):
    progress = Progress(Ranks(0, 1, torch.device("cpu")), None, start_step=4, total=10)
    assert progress.tokens_per_s() is None  # no window closed yet
    progress.add(30, 1_000, torch.tensor(2.0))
    progress.add(50, 3_000, torch.tensor(4.0))
    with caplog.at_level(logging.INFO, logger="specbuild"):
        assert progress.line(6, 1, lr=1e-3) == 80
    (window,) = progress.speed.windows
    assert (window.first_step, window.last_step, window.tokens, window.flops) == (5, 6, 80, 4_000)
    assert "step 6/10 epoch 1 loss 3.0000 lr 1.00e-03" in caplog.text  # the steps' mean loss
    assert "MFU n/a" in caplog.text  # a CPU has no peak
    progress.add(20, 500, torch.tensor(1.0))
    progress.line(7, 1, lr=1e-3)
    assert progress.speed.windows[-1].first_step == 7 and progress.speed.windows[-1].tokens == 20
    assert progress.tokens_per_s() == pytest.approx(100 / progress.speed.rates()["seconds"])
