"""`make serve`: the command that serves the built drafter with SGLang, written as a script.

    results/serve.sh  <-  results/drafter/base/ + the serving bench's summaries (when built)

The chain is the one the serving bench measured fastest single-stream (the latency a
speculative drafter is for); without serving-bench results it is the first configured chain,
or EAGLE-3's usual 3-1-4. The script says which and why. It binds the configured host
(loopback unless configured otherwise) on `port`, with the same `sglang.server_args` and
`sglang.env` every bench server got, so what is served is what was measured.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specbuild.backends.server import build_server_args, resolve_launcher
from specbuild.bench.server import spec_server_args
from specbuild.io import atomic_open, read_json

__all__ = ["DEFAULT_CHAIN", "pick_chain", "serve_command", "write_serve_script"]

DEFAULT_CHAIN = "3-1-4"  # EAGLE-3's usual chain: 3 draft steps, top-1, 4 tokens verified


def pick_chain(chains: Sequence[str], summaries: Sequence[str | os.PathLike]) -> tuple[str, str]:
    """(chain, why): the fastest measured chain of `chains`, else the first, else 3-1-4."""
    measured = {}
    for path in summaries:
        s = read_json(path)
        if s.get("config") in chains and s.get("single_stream_tokens_per_s"):
            measured[s["config"]] = float(s["single_stream_tokens_per_s"])
    if measured:
        best = max(measured, key=measured.get)
        others = ", ".join(f"{c} {v:.1f}" for c, v in sorted(measured.items()) if c != best)
        return best, (
            f"fastest single stream in the serving bench: {measured[best]:.1f} tok/s"
            + (f" (others: {others})" if others else "")
        )
    if chains:
        return chains[0], "first configured chain (no serving-bench results to compare)"
    return DEFAULT_CHAIN, "EAGLE-3's usual chain (no chains configured)"


def serve_command(
    *,
    fingerprint: str | os.PathLike,
    drafter_config: str | os.PathLike,
    chain: str,
    launcher: Sequence[str],
    server_args: Mapping[str, Any],
    host: str,
    port: int,
) -> list[str]:
    """argv of an SGLang server for the target (the folder of its `fingerprint.json`) with the
    drafter (the folder of its `config.json`) at `chain`."""
    drafter_dir = str(Path(drafter_config).parent)
    flags = {**server_args, **spec_server_args(chain, drafter_dir)}
    return [
        *resolve_launcher(launcher),
        "--model-path",
        str(Path(fingerprint).parent),
        "--host",
        host,
        "--port",
        str(port),
        *build_server_args(flags),
    ]


def write_serve_script(
    out: str | os.PathLike,
    *,
    command: Sequence[str],
    env: Mapping[str, str],
    why: str,
) -> None:
    """A bash script that runs `command` under `env` (atomically written)."""
    lines = [
        "#!/usr/bin/env bash",
        "# Serve the drafter built by specbuild with SGLang (written by `make serve`).",
        f"# chain: {why}",
        "set -euo pipefail",
        *(f"export {k}={shlex.quote(str(v))}" for k, v in env.items()),
        "exec " + " ".join(shlex.quote(c) for c in command),
    ]
    with atomic_open(Path(out)) as fh:
        fh.write("\n".join(lines) + "\n")
