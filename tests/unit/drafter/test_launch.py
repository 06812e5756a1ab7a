"""Which process launches torchrun, and the collectives of a single process."""

from __future__ import annotations

import torch

from specbuild.drafter.config import TrainConfig
from specbuild.drafter.launch import Ranks, needs_launch, setup_ranks


def test_only_a_process_outside_torchrun_launches_the_workers(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert needs_launch(TrainConfig(nproc=2)) and not needs_launch(TrainConfig(nproc=1))
    monkeypatch.setenv("WORLD_SIZE", "2")  # a worker: it trains
    assert not needs_launch(TrainConfig(nproc=2))


def test_a_single_process_is_rank_0_of_1_and_its_collectives_are_its_own_values(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ranks = setup_ranks(TrainConfig(device="cpu"))
    assert ranks == Ranks(0, 1, torch.device("cpu"))
    assert ranks.sum([3, 4]) == [3, 4]
    assert ranks.min(torch.tensor(1, dtype=torch.int32)).item() == 1
    assert ranks.min(torch.tensor(0, dtype=torch.int32)).item() == 0
    ranks.barrier()  # no process group: nothing to wait for
