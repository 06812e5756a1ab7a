"""Secrets stay out of configs (specbuild.config.credentials): a credential's name or value
under sglang.env / sglang.server_args, or a key pasted where an `*api_key_env` names its
variable, is a config fault naming the key, never the value, and pointing to the environment
and api_key_env; no schema fault shows a value under a key whose name marks a secret; a server
bound beyond loopback needs sglang.serve_api_key_env."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from config_cases import SCHEMA, default_config, faults, passes

from specbuild.config import ConfigError, check_config
from specbuild.config.credentials import KEY_NAME_KEYS
from specbuild.config.schema import HIDDEN
from specbuild.infra.credential_patterns import (
    is_credential_name,
    looks_like_credential,
    looks_like_random_key,
)

REPO = Path(__file__).resolve().parents[3]
DEFAULT = (REPO / "config" / "config.yaml").read_text(encoding="utf-8")
HF = "hf_" + "aB3" * 12
SK = "sk-proj-" + "x9Y" * 10


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "OPENAI_API_KEY",
        "api_key",
        "admin-api-key",
        "OPENAI_API_KEY_2",  # masked in the servers' logs as secrets: the check agrees
        "HF_TOKEN_RO",
        "API_KEY_PROD",
        "DB_PASS",
        "AUTHORIZATION",
        "PROXY_AUTHORIZATION",
    ],
)
def test_credential_names_are_recognised(name):
    assert is_credential_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "max_total_tokens",
        "tokenizer_path",
        "skip_tokenizer_init",
        "speculative_token_map",
        "ssl_keyfile",
        "NCCL_IB_HCA",
    ],
)
def test_server_flags_about_tokens_are_not_credentials(name):
    assert not is_credential_name(name)


def test_credential_values_are_recognised_inside_longer_strings():
    assert looks_like_credential(HF) and looks_like_credential(f"Bearer {SK}")
    assert not looks_like_credential("sk-short") and not looks_like_credential("hf_transfer")


def test_a_token_in_sglang_env_is_refused_naming_the_key_not_the_value():
    cfg = default_config()
    cfg["sglang"] = {"env": {"HF_TOKEN": HF, "NCCL_DEBUG": "INFO"}}
    (fault,) = faults(cfg)
    assert fault.startswith("sglang.env.HF_TOKEN: the name says it is a credential")
    assert "sglang.api_key_env" in fault and "Export it in the environment" in fault
    assert HF not in fault


def test_an_api_key_in_server_args_is_refused_at_parse_time():
    cfg = default_config()
    cfg["sglang"] = {"server_args": {"api_key": "hunter2hunter2", "attention_backend": "fa3"}}
    (fault,) = faults(cfg)
    assert fault.startswith("sglang.server_args.api_key: the name says it is a credential")
    assert "hunter2" not in fault


def test_a_token_looking_value_under_an_innocent_name_is_refused():
    cfg = default_config()
    cfg["sglang"] = {
        "server_args": {"extra_headers": ["x", f"Authorization: Bearer {SK}"]},
        "tuning": {"points": {"p": {"env": {"WANDB_MODE": HF}}}},
    }
    assert [f.split(":")[0] for f in faults(cfg)] == [
        "sglang.server_args.extra_headers[1]",
        "sglang.tuning.points.p.env.WANDB_MODE",
    ]


def test_a_server_beyond_loopback_needs_an_api_key_variable():
    cfg = default_config()
    cfg["sglang"] = {"host": "0.0.0.0"}
    (fault,) = faults(cfg)
    assert fault.startswith("sglang.serve_api_key_env: sglang.host '0.0.0.0' is not loopback")
    cfg["sglang"] = {"host": "0.0.0.0", "serve_api_key_env": "SERVE_KEY"}
    assert passes(cfg)["sglang"]["serve_api_key_env"] == "SERVE_KEY"
    cfg = default_config()
    cfg["sglang"] = {"host": "::1"}
    passes(cfg)


def test_an_endpoint_url_holding_a_password_or_token_is_refused():
    cfg = default_config()
    cfg["generate"]["backend"] = "openai"
    cfg["sglang"] = {"endpoint": "https://me:s3cret-pass@llm.example.com/v1"}
    (fault,) = faults(cfg)
    assert fault.startswith("sglang.endpoint: the URL holds a credential")
    assert "s3cret" not in fault
    cfg["sglang"] = {"endpoint": f"https://llm.example.com/v1?key={SK}"}
    assert faults(cfg)[0].startswith("sglang.endpoint: the URL holds a credential")
    cfg["sglang"] = {"endpoint": "https://0123456789abcdef0123@llm.example.com/v1"}
    assert faults(cfg)[0].startswith("sglang.endpoint: the URL holds a credential")
    cfg["sglang"] = {"endpoint": "http://llm.example.com/v1?api-key=0123456789abcdef"}
    assert faults(cfg)[0].startswith("sglang.endpoint: the URL holds a credential")
    cfg["sglang"] = {"endpoint": "http://127.0.0.1:30000/v1?model=m"}
    passes(cfg)


def test_a_credential_on_the_launcher_command_line_is_refused_naming_its_place():
    cfg = default_config()
    cfg["sglang"] = {"launcher": ["python", "-m", "sglang.launch_server", "--api-key", "x"]}
    (fault,) = faults(cfg)
    assert fault.startswith("sglang.launcher[3]: a credential on the command line")
    cfg["sglang"] = {"launcher": ["env", f"HF_TOKEN={HF}", "python", "-m", "sglang.launch_server"]}
    (fault,) = faults(cfg)
    assert fault.startswith("sglang.launcher[1]: a credential") and HF not in fault
    cfg["sglang"] = {"launcher": ["python", "-m", "sglang.launch_server"]}
    passes(cfg)


def _refused(tmp_path: Path, text: str) -> str:
    """The whole message `check_config` refuses a config file's text with, loaded as Snakemake
    loads it (PyYAML's types)."""
    path = tmp_path / "my.yaml"
    path.write_text(text, encoding="utf-8")
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    with pytest.raises(ConfigError) as err:
        check_config(config, schema=SCHEMA, source=str(path), workdir=REPO)
    return str(err.value)


PASTED = [
    "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",  # matches the name pattern: was accepted
    "skAbCdEfGh0123456789XyZ",  # a bare alphanumeric key, no known prefix
    "3f9a1c0e7b2d4f6a8c0e1b3d5f7a9c2e",  # 32 hex: no name either
    "sk-proj-AbCdEf0123456789SECRETVALUE",  # no name: the schema's fault used to show it
]


def _with(key: str, value: Any) -> str:
    """The text of config/config.yaml with `key` (dotted) set to `value`."""
    config = yaml.safe_load(DEFAULT)
    *sections, name = key.split(".")
    section = config
    for part in sections:
        section = section.setdefault(part, {})
    section[name] = value
    return yaml.safe_dump(config, sort_keys=False)


def test_the_key_name_keys_are_every_api_key_env_of_the_schema():
    schema = yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))

    def walk(node: dict, path: str):
        for name, sub in node.get("properties", {}).items():
            key = f"{path}.{name}" if path else name
            if name.endswith("api_key_env"):
                yield key
            yield from walk(sub, key)

    assert sorted(walk(schema, "")) == sorted(KEY_NAME_KEYS)


@pytest.mark.parametrize("secret", PASTED, ids=["hf", "alnum", "hex", "sk-proj"])
@pytest.mark.parametrize("key", KEY_NAME_KEYS)
def test_a_key_pasted_where_its_variable_is_named_is_refused_never_shown(tmp_path, key, secret):
    message = _refused(tmp_path, _with(key, secret))
    name = key.rsplit(".", 1)[1]
    (line,) = [line for line in message.splitlines() if line.startswith(f"  {key}:")]
    assert line == (
        f"  {key}: holds what looks like a key itself; name the environment variable that holds "
        f"it (export MY_KEY=...; {name}: MY_KEY): a config travels, and this value would reach "
        "params, Snakemake's metadata and logs"
    )
    assert secret not in message
    assert secret[:12] not in message  # not even shortened


@pytest.mark.parametrize(
    "name", ["OPENAI_API_KEY", "MY_ENDPOINT_KEY", "SGLANG_KEY", "my_key", "AZURE_OPENAI_API_KEY_2"]
)
@pytest.mark.parametrize("key", KEY_NAME_KEYS)
def test_a_variable_name_is_accepted_in_every_key_name_key(key, name):
    config = yaml.safe_load(_with(key, name))
    if key == "sglang.serve_api_key_env":
        config["sglang"]["host"] = "0.0.0.0"
    *sections, last = key.split(".")
    section = passes(config)
    for part in sections:
        section = section[part]
    assert section[last] == name


@pytest.mark.parametrize(
    ("key", "value", "fault"),
    [
        (
            "sglang.api_key_env",
            "hunter2-password!",
            "must match '^[A-Za-z_][A-Za-z0-9_]*$' " + HIDDEN,
        ),
        (
            "bench.openai.api_key_env",
            987654321987,
            "expected a string or null, got integer " + HIDDEN,
        ),
        (
            "sglang.serve_api_key_env",
            ["s3cr3t-in-a-list"],
            "expected a string or null, got list " + HIDDEN,
        ),
    ],
)
def test_a_schema_fault_under_a_secrets_key_never_shows_the_value(tmp_path, key, value, fault):
    message = _refused(tmp_path, _with(key, value))
    assert f"\n  {key}: {fault}" in message
    assert str(value).strip("[]'") not in message


def test_a_credential_named_env_value_of_the_wrong_type_gets_the_credential_line(tmp_path):
    """The schema's type fault on that key would show the value; the credential line, which
    says where the key goes, replaces it."""
    message = _refused(tmp_path, _with("sglang.env", {"HF_TOKEN": [123456789]}))
    (line,) = [line for line in message.splitlines() if line.startswith("  sglang.env.")]
    assert line.startswith("  sglang.env.HF_TOKEN: the name says it is a credential; ")
    assert "123456789" not in message


def test_an_authorization_header_is_refused_by_its_name_and_by_its_value(tmp_path):
    bearer = "Bearer s3cr3tTokenValue42"
    env = {"AUTHORIZATION": bearer, "EXTRA_HEADER": bearer, "NCCL_DEBUG": "INFO"}
    message = _refused(tmp_path, _with("sglang.env", env))
    assert "  sglang.env.AUTHORIZATION: the name says it is a credential; " in message
    assert "  sglang.env.EXTRA_HEADER: the value looks like a credential (" in message
    assert "NCCL_DEBUG" not in message and "s3cr3t" not in message


def test_a_key_naming_a_records_field_is_no_secret_and_its_fault_shows_the_value(tmp_path):
    message = _refused(tmp_path, _with("datasets.gsm8k.id_key", 12345))
    assert "\n  datasets.gsm8k.id_key: expected a string or null, got integer 12345" in message
    assert HIDDEN not in message


DB_URL = "postgres://user:pa55word@db.internal:5432/app"
NVAPI = "nvapi-" + "Rt5" * 20
RANDOM = "Zx8" * 11  # 33 characters mixing cases and digits, no known prefix


@pytest.mark.parametrize(
    "value",
    [
        DB_URL,
        "mongodb+srv://admin:s3cret@cluster0.example.net",
        NVAPI,
        "glpat-" + "a1B" * 8,
        "xoxe-" + "1-" * 8,
        "ASIA" + "Q" * 16,
        "AIza" + "b2C" * 11 + "dd",
    ],
)
def test_a_credential_is_known_by_its_shape(value):
    assert looks_like_credential(value)


@pytest.mark.parametrize(
    "value",
    [
        "http://localhost:30000/v1",
        "https://user@host/",  # a user, no password: not by shape (an endpoint's own check)
        "meta-llama/Llama-3.1-8B-Instruct",
        "/usr/local/cuda-12.4/lib64",
        "expandable_segments:True",
        "0,1,2,3",
        "mlx5_0:1,mlx5_1:1",
    ],
)
def test_ordinary_env_values_do_not_look_like_secrets(value):
    assert not looks_like_credential(value) and not looks_like_random_key(value)


def test_a_secret_under_a_name_the_check_does_not_know_is_refused_by_its_shape(tmp_path):
    config = yaml.safe_load(DEFAULT)
    config["sglang"] = {
        "env": {"DATABASE_URL": DB_URL, "NGC_AUTH": NVAPI, "SESSION": RANDOM, "NCCL_DEBUG": "INFO"},
        "server_args": {"served_model_name": NVAPI},
        "tuning": {"points": {"p": {"env": {"X_DSN": DB_URL}}}},
    }
    config["bench"]["openai"] = {"served_model": DB_URL}
    message = _refused(tmp_path, yaml.safe_dump(config, sort_keys=False))
    refused = [line.split(": ", 1)[0].strip() for line in message.splitlines()[1:]]
    assert refused == [
        "sglang.env.DATABASE_URL",
        "sglang.env.NGC_AUTH",
        "sglang.env.SESSION",
        "sglang.server_args.served_model_name",
        "sglang.tuning.points.p.env.X_DSN",
        "bench.openai.served_model",
    ]
    assert "the value looks like a credential (a token's format, a password in a URL" in message
    assert "Export it in the environment instead" in message
    for secret in (DB_URL, NVAPI, RANDOM, "pa55word"):
        assert secret not in message
