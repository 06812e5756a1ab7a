"""In-process feature engines: what a hidden or align job computes its features with.

A `ModelSpec` says what loads one (the stage's backend name, the target folder, the layers
to capture, dtype, device and the backend's own options) and, with the target's fingerprint,
is the key jobs share a kept one by (engines.kept_model). `load` builds it through the
registry's `hidden.backend` table, whose classes are the hidden stage's adapters over a
transformers model (engines.transformers) or SGLang's model runner (engines.runner).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from specbuild.engines.keepers import keeper_key
from specbuild.engines.registry import lazy_class
from specbuild.engines.runtime import Runtime

__all__ = ["KEEPER_KIND", "FeatureBackend", "Features", "ModelSpec"]

log = logging.getLogger("specbuild")

# the keepers' kind of a kept feature engine (engines.kept_model)
KEEPER_KIND = "features"


@dataclass(frozen=True)
class Features:
    """One batch's states, packed in batch order on the backend's device.

    Sample j of the batch owns rows sum(lengths[:j]) .. sum(lengths[:j+1]) of both tensors.
    aux [T, 3H] is the three layer outputs `layer_ids` (HF hidden_states[id + 1]) concatenated
    low|mid|high; last [T, H] is the final post-norm state (HF hidden_states[-1]).
    """

    aux: Tensor
    last: Tensor
    lengths: tuple[int, ...]

    def split(self) -> list[tuple[Tensor, Tensor]]:
        """Per sample (aux [n, 3H], last [n, H]), views of the packed tensors."""
        return list(
            zip(
                self.aux.split(list(self.lengths)), self.last.split(list(self.lengths)), strict=True
            )
        )


@runtime_checkable
class FeatureBackend(Protocol):
    """Runs the target over a batch of token-id lists (any lengths; padding or packing is the
    backend's business) and returns its packed `Features` on `device`, computed in `dtype`
    (recorded in the shard). A backend may also have `close()`, called when the job is done.
    """

    name: str
    device: torch.device
    dtype: str
    eagle_layer_ids: list[int]  # eagle_config ids under which SGLang captures the same layers

    def extract(self, batch: list[list[int]]) -> Features: ...


@dataclass(frozen=True)
class ModelSpec:
    """Everything a feature engine is loaded from: one engine serves every job that names the
    same (and runs on the same GPUs)."""

    backend: str  # hidden.backend: hf or sglang
    folder: str  # the target's HF folder, absolute
    layer_ids: list[int]  # resolved against the target
    dtype: str
    device: str
    options: dict[str, Any]  # the backend's own (sglang: server_args, env)
    target_fingerprint: str = ""  # the weights the folder holds: part of the key

    def key(self, runtime: Runtime) -> str:
        """The keeper folder a kept engine of this spec lives in: everything the loaded model
        depends on, its memory share included (the keepers add the GPUs)."""
        return keeper_key(KEEPER_KIND, self.loaded_as(runtime))

    def loaded_as(self, runtime: Runtime) -> dict[str, Any]:
        """This spec as plain values, with the runtime's memory share in its options: what a
        keeper loads it from."""
        fields = dataclasses.asdict(self)
        fields["options"] = runtime.with_memory(self.options)
        return fields

    def load(self, runtime: Runtime) -> FeatureBackend:
        """Load the engine in this process."""
        start = time.perf_counter()
        cls = lazy_class("hidden.backend", self.backend)
        engine = cls.from_folder(
            self.folder,
            layer_ids=self.layer_ids,
            dtype=self.dtype,
            device=self.device,
            **runtime.with_memory(self.options),
        )
        log.info(
            "loaded feature backend %s (device %s, compute dtype %s) from %s in %.1f s",
            self.backend,
            self.device,
            self.dtype,
            self.folder,
            time.perf_counter() - start,
        )
        return engine
