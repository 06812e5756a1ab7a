"""Secrets stay out of configs (specbuild.config.credentials): a credential's name or value
under sglang.env / sglang.server_args is a config fault naming the key, never the value, and
pointing to the environment and api_key_env; a server bound beyond loopback needs
sglang.serve_api_key_env."""

from __future__ import annotations

import pytest
from config_cases import default_config, faults, passes

from specbuild.config.credentials import is_credential_name, looks_like_credential

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
