"""The workflow's config: checked once at parse time, one short error listing every fault by
its dotted key; then read through a few shared views.

    schema.py      load config.schema.yaml, read scalars as its types, fill its defaults,
                   one line per schema fault; ConfigError
    files.py       config files as plain data (no YTE, no Python tags, bounded size), before
                   Snakemake loads them; the same bounds on a loaded config
    moved.py       keys of earlier releases, each naming its successor
    credentials.py secrets in the config, named by key and never shown (what a credential's
                   name and value look like: specbuild.infra.credential_patterns)
    checks.py      what the schema cannot say: faults across keys and on disk
    views.py       train_variants, train_datasets, bench_drafter_names, sglang_server_args
    schema_doc.py  docs/configuration.md, rendered from the schema

Contract: `check_config` fills the schema's defaults in place, exactly as
`snakemake.utils.validate` did (so params, and what reruns, are unchanged), and raises
`ConfigError` once with every fault. This package reads no stage module: a chain's name is
specbuild.eagle.chain's, a drafter folder's fit specbuild.eagle.drafter_fit's.
"""

from __future__ import annotations

import os
from pathlib import Path

from specbuild.config.checks import rule_faults
from specbuild.config.credentials import credential_faults
from specbuild.config.files import value_faults
from specbuild.config.moved import is_moved, moved_faults
from specbuild.config.schema import (
    ConfigError,
    coerce_scalars,
    fault_key,
    load_schema,
    schema_faults,
)
from specbuild.config.views import (
    bench_drafter_names,
    sglang_server_args,
    train_datasets,
    train_variants,
)

__all__ = [
    "ConfigError",
    "bench_drafter_names",
    "check_config",
    "sglang_server_args",
    "train_datasets",
    "train_variants",
]


def check_config(
    config: dict,
    *,
    schema: str | os.PathLike,
    source: str,
    workdir: str | os.PathLike = ".",
) -> None:
    """Coerce scalars, fill defaults, and raise `ConfigError` listing every fault.

    `source` names the config in the message (its file, plus any --config overrides);
    relative paths in the config are checked against `workdir`.
    """
    loaded = load_schema(schema)
    # before anything walks it: a Python object or an alias bomb is refused in milliseconds
    shape = value_faults(config)
    if shape:
        raise ConfigError(source, shape, schema)
    coerce_scalars(config, loaded)
    moved = moved_faults(config)
    faults = [f for f in schema_faults(config, loaded) if not is_moved(f, moved)] + moved
    # a secret's own line replaces the schema's on its key: it says where the key goes instead
    secrets = credential_faults(config)
    secret_keys = {fault_key(f) for f in secrets}
    faults = [f for f in faults if fault_key(f) not in secret_keys] + secrets
    faulty = {fault_key(f) for f in faults}  # one fault per key is enough
    faults += [f for f in rule_faults(config, Path(workdir)) if fault_key(f) not in faulty]
    if faults:
        raise ConfigError(source, faults, schema)
