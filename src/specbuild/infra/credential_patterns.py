"""What a credential looks like, by its name and by its value: the one definition that the
config's credential check (specbuild.config.credentials), the schema's fault lines
(specbuild.config.schema, which never show a value under a secret's key) and the servers' log
masking (specbuild.engines.server) share. Imports nothing outside infra, so each layer can use
it.

A secret is known by its shape as well as by its name: `DATABASE_URL:
postgres://user:password@host/db` or `NGC_AUTH: nvapi-...` carry no word that says so.

Contract: `is_credential_name` says whether a variable, flag or key name marks its value a
credential; `names_a_secret` whether any part of a dotted key does; `looks_like_credential`
whether a value holds a token of a known format (hf_, sk-, nvapi-, ghp_, xox*-, AKIA...,
a JWT, `Bearer ...`) or a URL with a password; `looks_like_random_key` whether it holds a run
of letters and digits as long and mixed as a key (what an environment variable's value may
be where its name says nothing); `holds_a_key_not_a_name` whether a value meant to *name* an
environment variable (`*api_key_env`) is a key pasted in its place.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from specbuild.infra.shell import is_env_name

__all__ = [
    "holds_a_key_not_a_name",
    "is_credential_name",
    "looks_like_credential",
    "looks_like_random_key",
    "names_a_secret",
]

# words of a name that make it a credential wherever they stand (split at _, - and .):
# AWS_SECRET_ACCESS_KEY, ssl_keyfile_password, DB_PASS, AUTHORIZATION (an HTTP header's value)
_SECRET_WORDS = {
    "secret",
    "password",
    "passwd",
    "pass",
    "pwd",
    "credential",
    "credentials",
    "apikey",
    "authorization",
    "bearer",
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
    r"|(?:sk|rk)_live_[A-Za-z0-9]{20,}"  # Stripe
    r"|nvapi-[A-Za-z0-9_-]{20,}"  # NVIDIA (NGC, build.nvidia.com)
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|xox[abeprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # an AWS access key id (long-lived, temporary)
    r"|AIza[0-9A-Za-z_-]{35}"  # Google API
    r"|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,}"  # package registries
    r"|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"  # a JWT
    r")"
    # an Authorization header's value, whatever the token's format
    r"|(?i:\bbearer)\s+[A-Za-z0-9._~+/=-]{8,}"
    # a URL whose user info holds a password: postgres://user:password@host/db
    r"|\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:[^\s/?#@]+@"
)
# Schema keys that name a record's JSON field (datasets.<name>.id_key, bench.sets.<name>.key):
# "key" there is a field's name, and a fault may show what was given.
_FIELD_KEYS = {"key", "id_key", "prompt_key"}


def is_credential_name(name: str) -> bool:
    """Whether a variable or flag name says its value is a credential."""
    words = [w for w in re.split(r"[_\-.]+", name.lower()) if w]
    if _SECRET_WORDS & set(words):
        return True
    return any(
        w in _KEY_WORDS and (i + 1 == len(words) or words[i + 1] not in _ABOUT_WORDS)
        for i, w in enumerate(words)
    )


def names_a_secret(path: Iterable[Any]) -> bool:
    """Whether a key's path (its parts, as jsonschema gives them) passes through a name that
    marks a credential: `sglang.api_key_env`, `sglang.env.HF_TOKEN`."""
    return any(
        isinstance(part, str) and part not in _FIELD_KEYS and is_credential_name(part)
        for part in path
    )


def looks_like_credential(value: Any) -> bool:
    """Whether a value holds a token of a known credential format or a URL with a password."""
    return isinstance(value, str) and bool(_CREDENTIAL.search(value))


def looks_like_random_key(value: Any) -> bool:
    """Whether a value holds a run of letters and digits as long and mixed as a key (a
    base64 or hex secret): paths, model ids and words pass, a 40-digit hex hash does not."""
    return isinstance(value, str) and any(
        _random_word(run) for run in re.split(r"[^A-Za-z0-9]+", value)
    )


def _random_word(word: str) -> bool:
    """A run of letters and digits too long and too mixed to be a word of a name: 16 or more
    characters mixing letters and digits, in both cases or 24 long (hex keys are one case)."""
    letters, digits = any(c.isalpha() for c in word), any(c.isdigit() for c in word)
    mixed_case = word != word.lower() and word != word.upper()
    return len(word) >= 16 and letters and digits and (mixed_case or len(word) >= 24)


def holds_a_key_not_a_name(value: Any) -> bool:
    """Whether a value given where an environment variable's *name* belongs is a key itself:
    a known token format, a non-name as long and mixed as a key, or a name one of whose
    `_`-separated words is such a random run. Names as people write them pass:
    OPENAI_API_KEY, MY_ENDPOINT_KEY_2, my_key."""
    if not isinstance(value, str):
        return False
    if looks_like_credential(value):
        return True
    if not is_env_name(value):  # the schema's pattern refuses it; say why when it is a key
        return len(value) >= 16 and _random_word(re.sub(r"[^A-Za-z0-9]", "", value))
    return any(_random_word(word) for word in value.split("_"))
