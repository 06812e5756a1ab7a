"""What a job asks the scheduler for: its priority, GPUs, cores and conda environment."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
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
    "engine_host_mb",
    "generate_gpus",
    "hidden_gpus",
    "hidden_mem_mb",
    "sglang_gpus",
    "stage_engine",
    "stage_mem_mb",
    "target_weights",
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


# Host memory (MB) of an engine-bound job, before its engine's own: its Python, its inputs and
# one batch of outputs (SmolLM2 on the CPU fits in these).
JOB_FLOOR_MB = {
    "generate": 4000,
    "synthesize": 4000,
    "hidden": 6000,
    "align": 6000,
    "bench": 8000,
    "tuning": 8000,
}
# ...and of a hidden job that hands its shard to the run's kept engine: torch and a request.
HIDDEN_CLIENT_MB = 1000
# An engine's own host memory (benchmarks/host_memory.py; BENCHMARKS.md, "Host memory of
# engine-bound jobs"). SGLang keeps the weights on the GPUs: at tp 1 its processes' anonymous
# memory did not grow with the target's (256 MB to 17 GB of weights): 1.2-1.6 GB for the model
# runner in a job, 3.1-3.4 GB for a server, 9.2 GB once for a server's cold start (28
# processes compiling kernels). Each rank past the first is a process of its own: projected at
# SGLANG_RANK_MB each, not measured.
SGLANG_RUNNER_MB = 4000
SGLANG_SERVER_MB = 10000
SGLANG_RANK_MB = 2000
# transformers holds the weights twice while it loads: mapped from disk, and in the compute
# dtype (SmolLM2, 513 MB float32: 1.4 GB at float32, 1.1 GB at bfloat16, with 0.3 GB of torch)
HF_BASE_MB = 1000
HF_MARGIN = 1.25


def target_weights(config: Mapping) -> tuple[int, int] | None:
    """(safetensors bytes, bytes a parameter) of the target: the materialized folder's, else a
    local source folder's; None where neither is on disk yet (a hub id, a GGUF to convert)."""
    from specbuild.workflow.paths import target_dir

    folder = Path(target_dir(config))
    if not (folder / "fingerprint.json").is_file():
        folder = Path(config["target"]["source"])
        if not folder.is_dir():
            return None
    nbytes = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    if not nbytes:
        return None
    try:
        model = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        model = {}
    model = model.get("text_config", model)
    return nbytes, _dtype_bytes(model.get("torch_dtype") or model.get("dtype") or "float32")


def _dtype_bytes(name: str) -> int:
    from specbuild.infra.dtypes import DTYPES

    return DTYPES[name].itemsize if name in DTYPES else 4


def engine_host_mb(config: Mapping, kind: str, dtype: str = "float32") -> int:
    """Host memory of one engine of `kind` for the config's target: an SGLang "server" or
    "runner" (weights on the GPUs, a process per rank), or "hf", transformers computing in
    `dtype` (the weights mapped, and again in `dtype`); 0 for none (an openai endpoint)."""
    ranks = tp_size(config["sglang"]["server_args"])
    if kind in ("server", "runner"):
        first = SGLANG_SERVER_MB if kind == "server" else SGLANG_RUNNER_MB
        return first + SGLANG_RANK_MB * (ranks - 1)
    weights = target_weights(config) if kind == "hf" else None
    if weights is None:
        return 0
    nbytes, stored = weights
    held = nbytes + nbytes // stored * _dtype_bytes(dtype)
    return int(HF_MARGIN * (HF_BASE_MB + held / 2**20))


def stage_engine(config: Mapping, stage: str, engine: str | None = None) -> tuple[str, str]:
    """(engine kind, compute dtype) a job of `stage` holds (bench and tuning: `engine`)."""
    if stage in ("bench", "tuning"):
        backend = engine or "sglang"
        if backend == "hf":
            return "hf", config["bench"]["hf"]["dtype"]
        return ("server" if backend == "sglang" else "", "")
    section = "generate" if stage == "synthesize" else stage
    backend = config[section]["backend"]
    if backend == "sglang":
        return ("server" if section == "generate" else "runner"), ""
    return ("hf", config[section]["dtype"]) if backend == "hf" else ("", "")


def stage_mem_mb(config: Mapping, stage: str, engine: str | None = None) -> int:
    """mem_mb of a job of `stage` that holds its engine: JOB_FLOOR_MB, or the engine's own
    (engine_host_mb) where that is more. --set-resources <rule>:mem_mb=N overrides it."""
    kind, dtype = stage_engine(config, stage, engine)
    return max(JOB_FLOOR_MB[stage], engine_host_mb(config, kind, dtype) if kind else 0)


def hidden_mem_mb(config: Mapping, workflow: Any) -> Callable[..., int]:
    """mem_mb of a hidden job: HIDDEN_CLIENT_MB where the job will share the run's engine
    (hidden.share_idle_s on a local executor: the keeper holds the model, one process for the
    whole stage, outside Snakemake's count), else the stage's (stage_mem_mb). A callable,
    since the executor is known only once the run starts; a dry run, whose executor stands in
    for the one a real run would have, shows the stage's."""
    idle_s = float(config["hidden"]["share_idle_s"])
    own = stage_mem_mb(config, "hidden")

    def mem_mb(wildcards: Any) -> int:
        plugin = workflow.executor_plugin
        settings = plugin.common_settings if plugin is not None else None
        local = settings is not None and settings.local_exec and not settings.dryrun_exec
        return HIDDEN_CLIENT_MB if local and sharing_allowed(idle_s) else own

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
