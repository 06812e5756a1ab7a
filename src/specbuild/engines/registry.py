"""The one table of what specbuild loads by name: a config key's choices, each a
"module:attribute" path imported only when chosen, so a CPU-only install never imports server
or GPU code it does not use.

The paths are strings, not imports: the engine room names the stages' adapters here without
importing a stage (tests/unit/engines/test_engine_imports.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import Any

__all__ = ["TABLE", "choices", "lazy_class", "lazy_load"]

# config key -> {name: "module:attribute"}; the key leads each error about its names
TABLE: Mapping[str, Mapping[str, str]] = {
    # generation backends (stages generate, synthesize): constructed with their own kwargs
    "generate.backend": {
        "hf": "specbuild.backends.hf:HFBackend",
        "sglang": "specbuild.backends.sglang:SGLangBackend",
        "openai": "specbuild.backends.openai:OpenAIBackend",
    },
    # feature backends (stages hidden, align): `from_folder(folder, *, layer_ids, dtype,
    # device, **options)`, options being engine settings (server flags for sglang; none for hf)
    "hidden.backend": {
        "hf": "specbuild.hidden.hf:HFFeatureBackend",
        "sglang": "specbuild.hidden.sglang:SGLangFeatureBackend",
    },
    # the bench's runtimes (results/bench/{engine}/): context managers yielding a bench engine
    "bench.engines": {
        "hf": "specbuild.bench.hf:open_hf",
        "sglang": "specbuild.bench.served:open_sglang",
        "openai": "specbuild.bench.served:open_openai",
    },
    # what a kept model runs for a job besides a batch (engines.kept_model): a handler
    # `(engine, spec, request, tag) -> answer`
    "kept_model.request": {
        "shard": "specbuild.hidden.core:run_kept_shard",
    },
}


def choices(key: str) -> list[str]:
    """The names `key` accepts, sorted."""
    return sorted(TABLE[key])


def lazy_load(path: str, *, what: str) -> Any:
    """The attribute a "module:attribute" `path` names; `what` leads the error when its module
    is not installed here."""
    module_name, attr = path.split(":")
    try:
        module = import_module(module_name)
    except ModuleNotFoundError as err:
        raise RuntimeError(f"{what} is not available here ({err}); install it") from err
    return getattr(module, attr)


def lazy_class(key: str, name: str) -> Any:
    """What TABLE[key][name] names (a class, or an opener for the bench); an unknown name is
    refused with `key` and the choices."""
    table = TABLE[key]
    if name not in table:
        raise ValueError(f"{key} {name!r}: choose one of {sorted(table)}")
    return lazy_load(table[name], what=f"{key} {name!r}")
