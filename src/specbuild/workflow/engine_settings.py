"""The engines' settings as jobs receive them: one SGLang `ServerOptions` built from config,
and the generation backend's constructor kwargs (the feature backend's: workflow.features).

Each bundle is built from the fields its consumer takes, never by deleting keys from another,
so a field added to one cannot leak into the params of a job that does not read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from specbuild.config import sglang_server_args
from specbuild.engines.server import ServerOptions
from specbuild.workflow.paths import target_dir

__all__ = [
    "server_sharing",
    "generate_backend_args",
    "sglang_env",
    "server_options_params",
    "sglang_server_options",
]


def sglang_env(config: Mapping) -> dict[str, str]:
    """sglang.env with every value a string, as a process environment takes it."""
    return {k: str(v) for k, v in config["sglang"]["env"].items()}


def sglang_server_options(config: Mapping) -> ServerOptions:
    """How every SGLang server specbuild starts is launched (config `sglang.*`)."""
    sg = config["sglang"]
    return ServerOptions(
        launcher=tuple(sg["launcher"]),
        server_args=sglang_server_args(config),
        env=sglang_env(config),
        host=sg["host"],
        startup_timeout_s=sg["startup_timeout_s"],
        request_timeout_s=sg["request_timeout_s"],
        draft_attention_backend=sg["draft_attention_backend"],
    )


def server_options_params(options: ServerOptions) -> dict:
    """`options` as one plain-builtin param; jobs rebuild it whole: ServerOptions(**param)."""
    return {**dataclasses.asdict(options), "launcher": list(options.launcher)}


def generate_backend_args(config: Mapping) -> dict:
    """Constructor kwargs of the configured generation backend, as plain builtins. Only the
    *name* of the API key's environment variable goes into params (they are stored in
    Snakemake metadata)."""
    gen, sg = config["generate"], config["sglang"]
    if gen["backend"] == "hf":
        return {
            "target_dir": target_dir(config),
            "dtype": gen["dtype"],
            "device": gen["device"],
            "batch_size": gen["batch_size"],
        }
    if gen["backend"] == "openai":  # the config check makes sure the endpoint is set
        return {
            "base_url": sg["endpoint"],
            "model": sg["served_model"],
            "api_key_env": sg["api_key_env"],
            "max_concurrency": sg["max_concurrency"],
            "request_timeout_s": sg["request_timeout_s"],
        }
    # SGLangBackend's own fields: generation serves no drafter (no draft_attention_backend)
    server = sglang_server_options(config)
    return {
        "target_dir": target_dir(config),
        "launcher": list(server.launcher),
        "server_args": dict(server.server_args),
        "env": dict(server.env),
        "host": server.host,
        "startup_timeout_s": server.startup_timeout_s,
        "max_concurrency": sg["max_concurrency"],
        "request_timeout_s": server.request_timeout_s,
    }


def server_sharing(config: Mapping, engine: str | None = None) -> str:
    """sglang.share_idle_s as a resource of a job starting SGLang servers ("" for any other
    engine): a generate/synthesize job (its engine: generate.backend), a bench job (its
    `engine` wildcard) or a tuning point (`engine` "sglang"). Whether jobs share a server
    changes no output, so it must not rerun one."""
    if (engine or config["generate"]["backend"]) != "sglang":
        return ""
    return str(config["sglang"]["share_idle_s"])
