"""Stage `hidden`, one job: a tokenized shard's features extracted by the job's own engine or
by the one a keeper shares (hidden.shared).

Its own module because it stands above both: hidden.extract is the shard code and the engine
spec, hidden.shared builds on it, and only the job chooses between them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from specbuild.engines.keepers import sharing_allowed
from specbuild.hidden.extract import EngineSpec, ExtractStats, extract_with, read_shard_inputs
from specbuild.hidden.shared import extract_shared

__all__ = ["extract_shard"]


def extract_shard(
    *,
    tokens: str | os.PathLike,
    meta: str | os.PathLike,
    fingerprint: str | os.PathLike,
    out: str | os.PathLike,
    backend: str = "hf",
    layer_ids: list[int] | None = None,
    storage: str = "bf16",
    dtype: str = "float32",
    batch_tokens: int = 2048,
    device: str = "auto",
    backend_options: Mapping[str, Any] | None = None,
    threads: int | None = None,
    share_idle_s: float = 0.0,
) -> ExtractStats:
    """Extract, verify and publish `out` for the tokenized shard `tokens` (see hidden.extract).

    `share_idle_s` > 0: the engine is the one a keeper holds for every job that opens the
    same (hidden.shared), kept for that many idle seconds; 0 opens one for this shard alone.
    The shard's bytes are the same either way.
    """
    if threads:
        torch.set_num_threads(threads)  # the job's Snakemake `threads:`, not every core
    inputs = read_shard_inputs(
        tokens=tokens,
        meta=meta,
        fingerprint=fingerprint,
        out=out,
        layer_ids=layer_ids,
        storage=storage,
    )
    spec = EngineSpec(
        backend=backend,
        folder=str(Path(fingerprint).parent.resolve()),
        layer_ids=inputs.layer_ids,
        dtype=dtype,
        device=device,
        options=dict(backend_options or {}),
    )
    if sharing_allowed(share_idle_s):
        return extract_shared(
            spec,
            tokens=tokens,
            meta=meta,
            fingerprint=fingerprint,
            out=out,
            layer_ids=layer_ids,
            storage=storage,
            batch_tokens=batch_tokens,
            threads=threads,
            idle_s=share_idle_s,
            target_fingerprint=inputs.target.fingerprint,
        )
    engine = spec.open()
    try:
        return extract_with(engine, inputs, out=out, batch_tokens=batch_tokens)
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()
