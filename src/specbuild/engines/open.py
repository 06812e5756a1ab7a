"""The one way a job gets an engine: `open_engine(spec, runtime)` returns the job's own, or
the one a keeper holds for every job that opens the same spec (`runtime.idle_s` > 0, outside
SLURM jobs).

    ServerSpec  an SGLang server: the job's own SGLangServer, or the kept one's Endpoint
                (engines.kept_server); both have base_url, api_key, start_s and get_json
    ModelSpec   a feature engine: the job's own FeatureBackend, or KeptModel, which has the
                keeper run each batch (engines.kept_model)

Either way the engine is released when the block ends: the job's own stopped, a kept one's
lease dropped. Whether a job shares changes no output byte.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from specbuild.engines.kept_model import KeptModel
from specbuild.engines.kept_server import Endpoint, kept_server
from specbuild.engines.model import FeatureBackend, ModelSpec
from specbuild.engines.runtime import Runtime
from specbuild.engines.server import ServerSpec, SGLangServer

__all__ = ["open_engine"]


@contextmanager
def open_engine(
    spec: ServerSpec | ModelSpec, runtime: Runtime, *, name: str, exclusive: bool = False
) -> Iterator[Endpoint | SGLangServer | FeatureBackend | KeptModel]:
    """The engine of `spec` for the job `name`, held until the block ends. `exclusive` (a
    server's measurement): no other job sends the kept server requests meanwhile."""
    if isinstance(spec, ServerSpec):
        if runtime.shared:
            with kept_server(spec, name=name, idle_s=runtime.idle_s, exclusive=exclusive) as ep:
                yield ep
        else:
            with SGLangServer(spec, name=name) as server:
                yield server
        return
    engine = KeptModel(spec, runtime, name=name) if runtime.shared else spec.load(runtime)
    try:
        yield engine
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()
