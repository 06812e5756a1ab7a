"""What a job asks the scheduler for: its priority, GPUs, cores and conda environment."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from specbuild.engines.gpus import train_slots
from specbuild.engines.keepers import sharing_allowed
from specbuild.engines.server import tp_size

__all__ = [
    "PRIORITY",
    "align_gpus",
    "bench_gpus",
    "bench_threads",
    "device_gpus",
    "engine_env",
    "generate_gpus",
    "hidden_gpus",
    "hidden_mem_mb",
    "sglang_gpus",
    "train_gpus",
]

# Job order where cores are scarce: Snakemake starts the ready job of highest priority (then
# of largest input). On a 2-core `make run`, decoding is the longest chain: the reject checks
# (a JSON read each, gating the next stage) go first, then `synthesize` (every chat `generate`
# waits for the earlier shards' prompts: near-duplicates), `samples` and `generate`, then
# `tokenize` (seconds; it gates hidden), the bench (its baseline needs only the target and
# fills the gaps in decoding; run last it would hold a core while `train` waits for both),
# then hidden (largest input first: the longest shards, so the last ones end together) and
# the rest (0). Without it the baseline (the largest inputs) started first and the first
# self-written shard 185 s late (BENCHMARKS.md, "CPU pipeline").
# On one GPU the same order is what keeps one engine per stage: every data job, then the
# baseline bench and the tuning points on generation's kept server (its flags), then the
# hidden jobs on one kept runner, before any training (a variant's may be ready while
# another's hidden shards are not) releases it. A tuning point at hidden's priority ran
# between them and restarted the server the runner had released.
PRIORITY = {
    "rejects_check": 6,
    "synthesize": 5,
    "decode": 4,
    "tokenize": 3,
    "bench": 2,
    "tuning": 2,
    "hidden": 1,
}


def device_gpus(device: str) -> int:
    """GPUs a job asks the scheduler for: only `cuda` demands one; `auto` uses one if present."""
    return 1 if device == "cuda" else 0


def engine_env(engine: str) -> str:
    """The conda environment (--sdm conda) of a job running `engine`: SGLang pins its own
    torch and transformers, so its jobs get envs/sglang.yaml, every other job the default.
    A sglang bench job starts its servers with the job's Python: it needs SGLang's env too.
    """
    return "../envs/sglang.yaml" if engine == "sglang" else "../envs/specbuild.yaml"


def sglang_gpus(config: Mapping) -> int:
    """GPUs one SGLang server takes: its tensor-parallel size (`tp_size` or `tp`)."""
    return tp_size(config["sglang"]["server_args"])


def generate_gpus(config: Mapping) -> int:
    if config["generate"]["backend"] == "openai":
        return 0  # the endpoint's GPUs are not ours to schedule
    if config["generate"]["backend"] == "sglang":
        return sglang_gpus(config)
    return device_gpus(config["generate"]["device"])


def hidden_gpus(config: Mapping) -> int:
    if config["hidden"]["backend"] == "sglang":
        return sglang_gpus(config)  # the serving engine runs on GPUs whatever `device` says
    return device_gpus(config["hidden"]["device"])


# Host memory (MB) of a hidden job that opens its own engine: the target's weights (SmolLM2 on
# the CPU), one batch and one shard; raise it for large targets (--set-resources).
HIDDEN_ENGINE_MB = 6000
# ...and of one that hands its shard to the run's kept engine: torch and a request.
HIDDEN_CLIENT_MB = 1000


def hidden_mem_mb(config: Mapping, workflow: Any) -> Callable[..., int]:
    """mem_mb of a hidden job: HIDDEN_CLIENT_MB where the job will share the run's engine
    (hidden.share_idle_s on a local executor, outside a SLURM allocation: the keeper holds the
    model, one process for the whole stage, outside Snakemake's count), else HIDDEN_ENGINE_MB.
    A callable, since the executor is known only once the run starts; a dry run, whose
    executor stands in for the one a real run would have, shows HIDDEN_ENGINE_MB."""
    idle_s = float(config["hidden"]["share_idle_s"])

    def mem_mb(wildcards: Any) -> int:
        plugin = workflow.executor_plugin
        settings = plugin.common_settings if plugin is not None else None
        local = settings is not None and settings.local_exec and not settings.dryrun_exec
        return HIDDEN_CLIENT_MB if local and sharing_allowed(idle_s) else HIDDEN_ENGINE_MB

    return mem_mb


def align_gpus(config: Mapping) -> int:
    if config["align"]["backend"] == "sglang":
        return sglang_gpus(config)
    return device_gpus(config["align"]["device"])


def train_gpus(variants: Mapping[str, Mapping], variant: str) -> int:
    """GPU slots of a train job: a majority of a GPU's SPECBUILD_GPU_SLOTS slots per DDP
    process on CUDA (train.nproc of its variant), so no two trainings share a GPU."""
    train = variants[variant]
    return train["nproc"] * device_gpus(train["device"]) * train_slots()


def bench_gpus(config: Mapping, engine: str) -> int:
    if engine == "hf":
        return device_gpus(config["bench"]["hf"]["device"])
    return sglang_gpus(config) if engine == "sglang" else 0


def bench_threads(config: Mapping, engine: str) -> int:
    """Cores a job claims. hf with `exclusive`: every core of this machine (Snakemake caps it
    at --cores), so timings measure the engine and not contention; else its processes' torch
    threads. A served engine's job is a client: one core."""
    hf = config["bench"]["hf"]
    if engine != "hf":
        return 1
    cores = hf["workers"] * hf["threads"]
    return max(cores, os.cpu_count() or 1) if hf["exclusive"] else cores
