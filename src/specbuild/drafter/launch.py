"""The processes of one training run: one, or `train.nproc` torchrun workers joined by DDP.

`train_drafter` called with nproc > 1 outside torchrun writes its arguments to a JSON spec
beside the state folder and runs `python -m torch.distributed.run -m specbuild.drafter.train
spec.json`, so every worker takes the same path as a single process; under torchrun (WORLD_SIZE
set) each worker joins the process group here (NCCL on CUDA, gloo on CPU) and takes its GPU.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from specbuild.drafter.config import TrainConfig
from specbuild.engines.keepers import release_idle
from specbuild.infra.devices import wants_cuda

__all__ = ["Ranks", "data_parallel", "launch_torchrun", "needs_launch", "setup_ranks"]

log = logging.getLogger("specbuild")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run; the collectives every rank calls at the same point."""

    rank: int
    world: int
    device: torch.device

    def sum(self, values: list[int]) -> list[int]:
        """Each value summed over the ranks."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def min(self, flag: torch.Tensor) -> torch.Tensor:
        """`flag` (an int32 scalar tensor) as its minimum over the ranks, left on the device."""
        if self.world > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return flag

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def needs_launch(cfg: TrainConfig) -> bool:
    """nproc > 1 asked for, and this process is not one of torchrun's workers yet."""
    return cfg.nproc > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1


def setup_ranks(cfg: TrainConfig) -> Ranks:
    """Join the process group (under torchrun) and pick this rank's device."""
    cuda = wants_cuda(cfg.device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    if cuda:
        if rank == 0:  # a shared generation server left idle on these GPUs: the memory is ours
            release_idle()
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return Ranks(rank, world, torch.device("cuda", local))
    return Ranks(rank, world, torch.device("cpu"))


def data_parallel(module: nn.Module, ranks: Ranks) -> nn.Module:
    """What each step calls: `module` itself on one rank, else `module` under DDP."""
    if ranks.world > 1:
        # gradients live in DDP's all-reduce buckets: no copy in and out of them each step
        return nn.parallel.DistributedDataParallel(module, gradient_as_bucket_view=True)
    return module


def launch_torchrun(spec: dict, nproc: int, *, observer: object | None = None) -> dict:
    """Run the job of `spec` (train_drafter's arguments, files and config as dicts) as `nproc`
    torchrun workers; wait for them and return the best eval row they wrote. An `observer`
    is refused: the workers could not get it (an object, not a JSON value)."""
    if observer is not None:
        raise ValueError(
            f"train.nproc {nproc} with an observer: start the {nproc} processes with "
            "torchrun, each calling train_drafter with its observer (benchmarks.train_speed)"
        )
    state_dir = Path(spec["files"]["state_dir"])
    spec_path = state_dir.parent / f".{state_dir.name}.launch.json"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps(spec, indent=2, default=str))  # paths as strings
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "specbuild.drafter.train",
        str(spec_path),
    ]
    log.info("launching %s", " ".join(cmd))
    subprocess.run(cmd, check=True)
    rows = [json.loads(line) for line in open(spec["files"]["metrics_out"], encoding="utf-8")]
    return max(rows, key=lambda r: r["acceptance_length"])
