"""Secrets stay out of configs: a credential anywhere in a config (`sglang.env` and
`sglang.server_args` above all) would reach every job's params, Snakemake's metadata and logs
(its "Params have changed" reason prints them) and results/serve.sh.

Contract: `credential_faults` returns one 'dotted.key: what' line for each value under the
free-form server keys (`sglang.env`, `sglang.server_args`, and each tuning point's) whose name
says it is a credential (HF_TOKEN, OPENAI_API_KEY, api_key, a password, AUTHORIZATION) or
whose value looks like one whatever its name (hf_..., sk-..., nvapi-..., a GitHub or Slack
token, an AWS key id, a JWT, `Bearer ...`, a URL with a password such as DATABASE_URL's
postgres://user:password@host/db; under an env name also a long random run of letters and
digits), each word of `sglang.launcher` that is a credential flag or looks like one, each
endpoint URL holding a user, a password, a token or a credential-named query parameter
(`sglang.endpoint`, `bench.openai.endpoint`), each key meant to name an environment variable
(KEY_NAME_KEYS) that holds a key itself, and any other value or name of the config that
looks like a credential. A line names the key, never the value, and
says where a key goes instead: the environment, named by `sglang.api_key_env` (an endpoint's
key) or `sglang.serve_api_key_env` (the key `make serve`'s server requires). Servers specbuild
starts inherit the environment (HF_TOKEN included) and get a fresh API key of their own.
What a credential's name and value look like is specbuild.infra.credential_patterns's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from specbuild.config.schema import fault_key, mapping
from specbuild.infra.credential_patterns import (
    holds_a_key_not_a_name,
    is_credential_name,
    looks_like_credential,
    looks_like_random_key,
)

__all__ = ["KEY_NAME_KEYS", "credential_faults"]

# The keys that name the environment variable holding a key: where a key itself gets pasted.
KEY_NAME_KEYS = ("sglang.api_key_env", "sglang.serve_api_key_env", "bench.openai.api_key_env")

_INSTEAD = (
    "a config travels, and this value would reach params, Snakemake's metadata and logs and "
    "results/serve.sh. Export it in the environment instead (every server specbuild starts "
    "inherits it, HF_TOKEN included); an endpoint's API key: name its variable in "
    "sglang.api_key_env; the key `make serve`'s server requires: sglang.serve_api_key_env"
)


def _values(key: str, value: Any, *, names: bool = False) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every scalar under `value` (`key` "": the config itself); with
    `names`, (the mapping's key + ".<name>", name) for each name of a mapping too."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            sub = f"{key}.{k}" if key else str(k)
            if names:
                yield f"{key or '(top level)'}.<name>", k
            yield from _values(sub, v, names=names)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _values(f"{key}[{i}]", v, names=names)
    else:
        yield key, value


def _free_form(config: Mapping) -> Iterator[tuple[str, Mapping]]:
    """The server keys whose names and values the schema leaves free."""
    sglang = mapping(config.get("sglang"))
    yield "sglang.env", mapping(sglang.get("env"))
    yield "sglang.server_args", mapping(sglang.get("server_args"))
    points = mapping(mapping(sglang.get("tuning")).get("points"))
    for name, point in points.items():
        for part in ("env", "server_args"):
            yield f"sglang.tuning.points.{name}.{part}", mapping(mapping(point).get(part))


def _endpoint_faults(config: Mapping) -> list[str]:
    """An endpoint URL holding a password (https://user:pass@host) or a token."""
    endpoints = {
        "sglang.endpoint": mapping(config.get("sglang")).get("endpoint"),
        "bench.openai.endpoint": mapping(mapping(config.get("bench")).get("openai")).get(
            "endpoint"
        ),
    }
    faults = []
    for key, url in endpoints.items():
        if not isinstance(url, str):
            continue
        try:
            parts = urlsplit(url)
            user = parts.username or parts.password  # https://user:pass@host, https://token@host
            asked = [name for name, _ in parse_qsl(parts.query, keep_blank_values=True)]
        except ValueError:
            user, asked = None, []  # not a URL the backend can use either; its request says so
        if user or looks_like_credential(url) or any(map(is_credential_name, asked)):
            faults.append(f"{key}: the URL holds a credential; {_INSTEAD}")
    return faults


def _key_name_faults(config: Mapping) -> list[str]:
    """A key pasted where the name of its environment variable belongs: it would travel as a
    param into Snakemake's metadata and logs, and the error for an unset variable shows it."""
    faults = []
    for key in KEY_NAME_KEYS:
        *sections, name = key.split(".")
        section = config
        for part in sections:
            section = mapping(section.get(part))
        if holds_a_key_not_a_name(section.get(name)):
            faults.append(
                f"{key}: holds what looks like a key itself; name the environment variable that "
                f"holds it (export MY_KEY=...; {name}: MY_KEY): a config travels, and this value "
                "would reach params, Snakemake's metadata and logs"
            )
    return faults


def credential_faults(config: Mapping) -> list[str]:
    """One line per credential-looking name or value under the free-form server keys, per
    endpoint URL that holds one, and per key-name key that holds a key."""
    faults = _endpoint_faults(config) + _key_name_faults(config)
    launcher = mapping(config.get("sglang")).get("launcher")
    for i, word in enumerate(launcher if isinstance(launcher, list) else []):
        flag = isinstance(word, str) and word.startswith("-") and is_credential_name(word)
        if flag or looks_like_credential(word):
            faults.append(f"sglang.launcher[{i}]: a credential on the command line; {_INSTEAD}")
    for prefix, section in _free_form(config):
        # an env value is a string a process reads: a random one is a key whatever its name
        env = prefix.endswith(".env")
        for name, value in section.items():
            key = f"{prefix}.{name}"
            if is_credential_name(str(name)):
                faults.append(f"{key}: the name says it is a credential; {_INSTEAD}")
                continue
            for where, scalar in _values(key, value):
                if looks_like_credential(scalar) or (env and looks_like_random_key(scalar)):
                    faults.append(f"{where}: the value {_SHAPE}; {_INSTEAD}")
    return faults + _anywhere_faults(config, {fault_key(f) for f in faults})


# what a value is refused for when its name says nothing
_SHAPE = "looks like a credential (a token's format, a password in a URL, or a long random string)"


def _anywhere_faults(config: Mapping, named: set[str]) -> list[str]:
    """A value or a name anywhere else in the config that looks like a credential (every value
    reaches some job's params); keys `named` already have their fault."""
    faults = []
    for key, scalar in _values("", config, names=True):
        parent = key.removesuffix(".<name>")
        if key in named or parent in named or not looks_like_credential(scalar):
            continue
        what = "a name in it" if key.endswith(".<name>") else "the value"
        faults.append(f"{parent}: {what} {_SHAPE}; {_INSTEAD}")
        named.add(key)
    return faults
