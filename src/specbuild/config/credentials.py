"""Secrets stay out of configs: a credential under `sglang.env` or `sglang.server_args` would
reach every job's params, Snakemake's metadata and logs (its "Params have changed" reason
prints them) and results/serve.sh.

Contract: `credential_faults` returns one 'dotted.key: what' line for each value under the
free-form server keys (`sglang.env`, `sglang.server_args`, and each tuning point's) whose name
says it is a credential (HF_TOKEN, OPENAI_API_KEY, api_key, a password) or whose value looks
like one (hf_..., sk-..., a GitHub or Slack token, an AWS key id, a JWT), each word of
`sglang.launcher` that is a credential flag or looks like one, and each endpoint URL holding a
user, a password, a token or a credential-named query parameter (`sglang.endpoint`,
`bench.openai.endpoint`). A line names the key,
never the value, and says where a key goes instead: the environment, named by
`sglang.api_key_env` (an endpoint's key) or `sglang.serve_api_key_env` (the key `make serve`'s
server requires). Servers specbuild starts inherit the environment (HF_TOKEN included) and get
a fresh API key of their own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from specbuild.config.schema import mapping

__all__ = ["credential_faults", "is_credential_name", "looks_like_credential"]

# words of a name that make it a credential wherever they stand (split at _, - and .):
# AWS_SECRET_ACCESS_KEY, ssl_keyfile_password, DB_PASS
_SECRET_WORDS = {
    "secret",
    "password",
    "passwd",
    "pass",
    "pwd",
    "credential",
    "credentials",
    "apikey",
}
# ...or that name one unless a word saying what about it follows: HF_TOKEN, api_key,
# OPENAI_API_KEY_2, HF_TOKEN_RO, private_key; not SGLang's speculative_token_map (nor
# max_total_tokens or tokenizer_path, other words)
_KEY_WORDS = {"token", "key", "keys"}
_ABOUT_WORDS = {"map", "id", "ids", "len", "length", "size", "num", "count", "type", "path"}
_ABOUT_WORDS |= {"file", "dir", "mode", "limit", "budget"}
# token formats with a recognisable prefix and enough random characters to be one
_CREDENTIAL = re.compile(
    r"(?<![A-Za-z0-9])("
    r"hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|sk-[A-Za-z0-9_-]{20,}"  # OpenAI and others
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|AKIA[0-9A-Z]{16}"  # an AWS access key id
    r"|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"  # a JWT
    r")"
)
_INSTEAD = (
    "a config travels, and this value would reach params, Snakemake's metadata and logs and "
    "results/serve.sh. Export it in the environment instead (every server specbuild starts "
    "inherits it, HF_TOKEN included); an endpoint's API key: name its variable in "
    "sglang.api_key_env; the key `make serve`'s server requires: sglang.serve_api_key_env"
)


def is_credential_name(name: str) -> bool:
    """Whether a variable or flag name says its value is a credential."""
    words = [w for w in re.split(r"[_\-.]+", name.lower()) if w]
    if _SECRET_WORDS & set(words):
        return True
    return any(
        w in _KEY_WORDS and (i + 1 == len(words) or words[i + 1] not in _ABOUT_WORDS)
        for i, w in enumerate(words)
    )


def looks_like_credential(value: Any) -> bool:
    """Whether a value holds a token of a known credential format."""
    return isinstance(value, str) and bool(_CREDENTIAL.search(value))


def _values(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every scalar under `value`."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _values(f"{key}.{k}", v)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _values(f"{key}[{i}]", v)
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


def credential_faults(config: Mapping) -> list[str]:
    """One line per credential-looking name or value under the free-form server keys, and per
    endpoint URL that holds one."""
    faults = _endpoint_faults(config)
    launcher = mapping(config.get("sglang")).get("launcher")
    for i, word in enumerate(launcher if isinstance(launcher, list) else []):
        flag = isinstance(word, str) and word.startswith("-") and is_credential_name(word)
        if flag or looks_like_credential(word):
            faults.append(f"sglang.launcher[{i}]: a credential on the command line; {_INSTEAD}")
    for prefix, section in _free_form(config):
        for name, value in section.items():
            key = f"{prefix}.{name}"
            if is_credential_name(str(name)):
                faults.append(f"{key}: the name says it is a credential; {_INSTEAD}")
                continue
            for where, scalar in _values(key, value):
                if looks_like_credential(scalar):
                    faults.append(f"{where}: the value looks like a credential; {_INSTEAD}")
    return faults
