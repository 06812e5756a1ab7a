"""`make serve`: the command that serves the built drafter with SGLang, written as a script.

    results/serve.sh  <-  the first benched drafter (results/drafter/base/ unless
                          bench.variants says otherwise) + the sglang engine's rows of it

The chain is the one the sglang engine measured fastest single-stream (the latency a
speculative drafter is for: `bench.metrics` tokens/s over every set's requests); without
sglang bench rows it is the first configured chain, or EAGLE-3's usual 3-1-4. The script says
which and why. It binds the configured host (loopback unless configured otherwise) on `port`,
with the same `ServerOptions` (flags, env) every bench server got, so what is served is what
was measured.

A host other than loopback (0.0.0.0: every interface) serves other machines: the script then
requires an API key of its clients, read from the environment variable `api_key_env`
(sglang.serve_api_key_env) when it runs, and says so in a warning; the key itself is never
written anywhere.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from specbuild.bench.metrics import summarize
from specbuild.eagle.chain import Chain
from specbuild.engines.server import ServerOptions, build_server_args, resolve_launcher
from specbuild.infra.hosts import is_loopback
from specbuild.infra.io import atomic_open, read_jsonl
from specbuild.infra.server_flags import cli_flag
from specbuild.infra.shell import comment_line, export_line, is_env_name

__all__ = [
    "DEFAULT_CHAIN",
    "ExposedServerError",
    "exposure_warning",
    "pick_chain",
    "serve_command",
    "write_serve_script",
]

DEFAULT_CHAIN = "3-1-4"  # EAGLE-3's usual chain: 3 draft steps, top-1, 4 tokens verified
API_KEY_KEY = "sglang.serve_api_key_env"
# seconds serve.sh keeps the key's --config file: SGLang reads it while parsing its arguments
KEY_FILE_LIFE_S = 300

log = logging.getLogger("specbuild")


class ExposedServerError(SystemExit):
    """A server for other machines with no API key: the job ends with this one message."""


def exposure_warning(host: str, api_key_env: str | None) -> str:
    """'' for a loopback host; for another, the warning serve.sh and the job log carry.
    Raises `ExposedServerError` where such a host has no API key variable."""
    if is_loopback(host):
        return ""
    if not api_key_env:
        raise ExposedServerError(
            f"sglang.host {host!r} is not loopback: the server would answer other machines "
            f"with no API key. Set {API_KEY_KEY} to the name of an environment variable "
            "holding the key its clients must send, or bind 127.0.0.1"
        )
    return (
        f"sglang.host {host!r} is not loopback: this server answers other machines; clients "
        f"must send the API key in ${api_key_env} ({API_KEY_KEY})"
    )


def pick_chain(chains: Sequence[str], rows: Sequence[str | os.PathLike]) -> tuple[str, str]:
    """(chain, why): the fastest single-stream chain of `chains` in the bench row files `rows`,
    else the first chain, else 3-1-4."""
    measured = {}
    for path in rows:
        found = [r for r in read_jsonl(path) if r["phase"] == "bench" and r["chain"] in chains]
        tokens_per_s = summarize(found)["tokens_per_s"] if found else None
        if tokens_per_s:
            measured[found[0]["chain"]] = tokens_per_s
    if measured:
        best = max(measured, key=measured.get)
        others = ", ".join(f"{c} {v:.1f}" for c, v in sorted(measured.items()) if c != best)
        return best, (
            f"fastest single stream in the sglang bench: {measured[best]:.1f} tok/s"
            + (f" (others: {others})" if others else "")
        )
    if chains:
        return chains[0], "first configured chain (no sglang bench rows to compare)"
    return DEFAULT_CHAIN, "EAGLE-3's usual chain (no chains configured)"


def serve_command(
    *,
    fingerprint: str | os.PathLike,
    drafter_config: str | os.PathLike,
    chain: str,
    server: ServerOptions,
    port: int,
) -> list[str]:
    """argv of an SGLang server for the target (the folder of its `fingerprint.json`) with the
    drafter (the folder of its `config.json`) at `chain`: the configured flags first, then the
    chain's and specbuild's own, so the last value given (the one SGLang keeps) is never the
    config's (infra.server_flags)."""
    drafter_dir = str(Path(drafter_config).parent)
    chain_args = Chain.parse(chain).server_args(
        drafter_dir, draft_attention_backend=server.draft_attention_backend
    )
    own = {k: v for k, v in server.server_args.items() if k not in chain_args}
    return [
        *resolve_launcher(server.launcher),
        *build_server_args({**own, **chain_args}),
        cli_flag("model_path"),
        str(Path(fingerprint).parent),
        cli_flag("host"),
        server.host,
        cli_flag("port"),
        str(port),
    ]


def write_serve_script(
    out: str | os.PathLike,
    *,
    command: Sequence[str],
    env: Mapping[str, str],
    why: str,
    host: str = "127.0.0.1",
    api_key_env: str | None = None,
) -> None:
    """A bash script that runs `command` under `env` (atomically written); with `api_key_env`
    the server requires the key that variable holds when the script runs (never the key
    itself in the script). A host beyond loopback needs one (`exposure_warning`)."""
    warning = exposure_warning(host, api_key_env)
    if warning:
        log.warning("%s", warning)
    if api_key_env is not None and not is_env_name(api_key_env):
        raise ValueError(f"{API_KEY_KEY} {api_key_env!r} is no environment variable name")
    # every config value below reaches bash: names checked, words quoted, comments one line
    exec_line = "exec " + " ".join(shlex.quote(c) for c in command)
    lines = [
        "#!/usr/bin/env bash",
        "# Serve the drafter built by specbuild with SGLang (written by `make serve`).",
        comment_line(f"chain: {why}"),
        *([comment_line(f"WARNING: {warning}")] if warning else []),
        "set -euo pipefail",
        *(export_line(k, v) for k, v in env.items()),
    ]
    if api_key_env:
        # the key goes in an owner-only file SGLang reads through --config, never on the
        # command line every user of the host can read (ps); removed once the server has read it
        quoted = f"${{{api_key_env}//\\'/\\'\\'}}"  # YAML single quotes: ' doubled
        lines += [
            f': "${{{api_key_env}:?export {api_key_env}: the API key clients of this server '
            f'must send ({API_KEY_KEY})}}"',
            "keydir=$(mktemp -d)",
            f'(umask 077 && printf "api-key: \'%s\'\\n" "{quoted}" >"$keydir/key.yaml")',
            f'(sleep {KEY_FILE_LIFE_S} && rm -rf "$keydir") >/dev/null 2>&1 </dev/null &',
        ]
        exec_line += ' --config "$keydir/key.yaml"'
    lines.append(exec_line)
    with atomic_open(Path(out)) as fh:
        fh.write("\n".join(lines) + "\n")
