"""Stage `hidden`, one job: a tokenized shard's features extracted by the job's own engine or by
the one a keeper holds for every job that opens the same (engines.kept_model).

The entry reads and checks the shard's inputs (all before any model loads), resolves its layer
ids once, and opens the engine (engines.open.open_engine); the core (hidden.core) writes the
shard, in this process or in the keeper's. A kept engine writes a part file beside the output
that the job renames into place, so only a job still running publishes a shard, and a killed
job leaves nothing that looks finished. The shard's bytes are the same either way.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specbuild.engines.kept_model import KeptModel
from specbuild.engines.model import ModelSpec
from specbuild.engines.open import open_engine
from specbuild.engines.runtime import Runtime
from specbuild.hidden.core import (
    ExtractRequest,
    ExtractStats,
    ShardFiles,
    extract_with,
    read_shard_inputs,
    resolve_request,
)

__all__ = ["ExtractSettings", "extract_kept", "extract_shard"]


@dataclass(frozen=True, kw_only=True)
class ExtractSettings:
    """A hidden job's settings (the rule's params): the feature backend and how the shard is
    written. Runtime settings, which change no output, travel apart (engines.runtime). Each
    default is the schema's (`hidden`); tests/unit/config/test_schema.py keeps them equal."""

    backend: str = "hf"  # hidden.backend: hf or sglang
    layer_ids: list[int] = field(default_factory=list)  # as configured; []: EAGLE-3's default
    storage: str = "bf16"  # hidden.storage: bf16, fp8 or fp8-g<N>
    dtype: str = "float32"  # hf's compute dtype
    batch_tokens: int = 2048
    device: str = "auto"
    backend_options: Mapping[str, Any] = field(default_factory=dict)  # sglang: flags, env
    # the job's Snakemake `threads:` (hidden.threads capped at --cores), so no default; None:
    # torch's threads as they are
    threads: int | None


def extract_shard(
    files: ShardFiles, settings: ExtractSettings, runtime: Runtime | None = None
) -> ExtractStats:
    """Extract, verify and publish `files.out` for the tokenized shard `files.tokens`
    (hidden.core). `runtime.idle_s` > 0: the engine is the one a keeper holds for every job
    that opens the same, kept for that many idle seconds; 0 opens one for this shard alone."""
    runtime = runtime or Runtime()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    request = resolve_request(
        files,
        layer_ids=settings.layer_ids,
        storage=settings.storage,
        batch_tokens=settings.batch_tokens,
        threads=settings.threads,
    )
    inputs = read_shard_inputs(request)
    spec = ModelSpec(
        backend=settings.backend,
        folder=str(Path(files.fingerprint).parent.resolve()),
        layer_ids=request.layer_ids,
        dtype=settings.dtype,
        device=settings.device,
        options=dict(settings.backend_options),
        target_fingerprint=inputs.target.fingerprint,
    )
    with open_engine(spec, runtime, name="hidden") as engine:
        if isinstance(engine, KeptModel):
            return extract_kept(engine, request)
        return extract_with(engine, inputs, out=files.out, batch_tokens=request.batch_tokens)


def extract_kept(engine: KeptModel, request: ExtractRequest) -> ExtractStats:
    """Have the kept engine write the shard to a part file of this job's, then publish it."""
    out = Path(request.files.out)
    part = out.parent / f".{out.name}.{engine.tag}.part"
    shard = dataclasses.replace(request, files=request.files.resolved(out=part))
    ask = {"run": "shard", "shard": shard.as_json(), "out": str(part.resolve())}
    try:
        answer = engine.ask(
            {**ask, "threads": request.threads}, what=str(request.files.tokens), item="the shard"
        )
        stats = ExtractStats(**answer)
        os.replace(part, out)
    finally:
        part.unlink(missing_ok=True)
        # the keeper's temp file of the part, where it died writing it (io.atomic_path)
        for tmp in part.parent.glob(f".{part.name}.*.tmp"):
            tmp.unlink(missing_ok=True)
    return dataclasses.replace(stats, file_bytes=os.path.getsize(out))
