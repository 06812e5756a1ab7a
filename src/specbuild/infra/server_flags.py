"""The SGLang server flags specbuild sets itself: the one list the config check
(specbuild.config.checks) and the command builders (specbuild.engines.server, specbuild.serve,
specbuild.eagle.chain) share.

Why a list and a prefix rule: SGLang parses its command line with argparse, which takes any
unique prefix of a long flag (`--hos` is `--host`) and keeps the last value given. A key of
`sglang.server_args` rendered after specbuild's own `--host 127.0.0.1` would rebind a loopback
server to every interface; one under `trust_remote_code` would run a target's code that
target.trust_remote_code did not allow. So a server_args key that is, or abbreviates, one of
these flags (with `_` and `-` read alike) is a config fault naming the key that sets it instead,
and a value that begins with `-` (argparse would read it as the next flag) is one too.

Contract: RESERVED_FLAGS maps each flag's key spelling to the config that sets it;
LAUNCH_FLAGS are those every server command carries; `reserved_flag(key)` is the flag a
server_args key sets or abbreviates (None: none of them); `cli_flag` spells a key as a flag;
`flag_like_value(value)` says whether a value would be read as a flag.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LAUNCH_FLAGS",
    "RESERVED_FLAGS",
    "SPECULATIVE_FLAGS",
    "cli_flag",
    "flag_like_value",
    "reserved_flag",
]

# Every server command carries these (engines.server.SGLangServer.command, serve.serve_command);
# `config` is the owner-only file holding the server's API key.
LAUNCH_FLAGS = {
    "model_path": "target.name and target.source (the served folder is the target's)",
    "host": "sglang.host",
    "port": "sglang.serve_port (make serve; every other server takes a free port)",
    "api_key": "sglang.serve_api_key_env (make serve; every other server gets a fresh key)",
    "config": "each flag under sglang.server_args (specbuild's own --config file holds the "
    "server's API key)",
}
# A server that serves a drafter gets these from its chain (eagle.chain.Chain.server_args).
SPECULATIVE_FLAGS = {
    "speculative_algorithm": "bench.chains or sglang.tuning.chain (speculation is the chain's)",
    "speculative_draft_model_path": "bench.variants or bench.drafters (the drafter served)",
    "speculative_num_steps": "bench.chains or sglang.tuning.chain",
    "speculative_eagle_topk": "bench.chains or sglang.tuning.chain",
    "speculative_num_draft_tokens": "bench.chains or sglang.tuning.chain",
    # a block drafter's (DFlash, DSpark) block, from the same chain
    "speculative_dflash_block_size": "bench.chains or sglang.tuning.chain",
    "speculative_dspark_block_size": "bench.chains or sglang.tuning.chain",
    # n-gram speculation's lookup (bench.ngram), from the same chain
    "speculative_ngram_max_bfs_breadth": "bench.chains (with bench.ngram)",
    "speculative_ngram_min_bfs_breadth": "bench.chains (with bench.ngram)",
    "speculative_draft_attention_backend": "sglang.draft_attention_backend",
}
RESERVED_FLAGS = {
    **LAUNCH_FLAGS,
    **SPECULATIVE_FLAGS,
    # from target.trust_remote_code alone (config.views.sglang_server_args)
    "trust_remote_code": "target.trust_remote_code (every tokenizer, config and model load "
    "reads it; SGLang jobs get the flag from it)",
}


def cli_flag(key: str) -> str:
    """`key` of a flags mapping as SGLang's command line spells it: attention_backend ->
    --attention-backend."""
    return "--" + key.replace("_", "-")


def reserved_flag(key: str, reserved: dict[str, str] = RESERVED_FLAGS) -> str | None:
    """The key of `reserved` whose flag `key` is or abbreviates (`hos`, `--trust-remote`),
    else None."""
    given = key.split("=", 1)[0].lstrip("-").replace("_", "-")
    if not given:
        return None
    return next((r for r in reserved if r.replace("_", "-").startswith(given)), None)


def flag_like_value(value: Any) -> bool:
    """Whether argparse would read `value` (or an item of a list value) as a flag: a string
    starting with `-` that is no number."""
    if isinstance(value, list | tuple):
        return any(flag_like_value(v) for v in value)
    if not isinstance(value, str) or not value.startswith("-"):
        return False
    try:
        float(value)
    except ValueError:
        return True
    return False
