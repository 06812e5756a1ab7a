"""The SGLang flags specbuild sets itself (specbuild.infra.server_flags): one list, which the
chain's flags and the server commands keep to, and the prefix rule SGLang's argparse applies."""

from __future__ import annotations

import argparse
import json

import pytest

from specbuild.eagle.chain import BLOCK_ALGORITHMS, Chain
from specbuild.infra.server_flags import (
    LAUNCH_FLAGS,
    RESERVED_FLAGS,
    SPECULATIVE_FLAGS,
    cli_flag,
    flag_like_value,
    reserved_flag,
)


def test_every_flag_a_chain_sets_is_a_speculative_flag_reserved(tmp_path):
    chain = Chain.parse("3-1-4")
    folders = {"eagle3": tmp_path / "none"}
    for architecture in BLOCK_ALGORITHMS:
        folders[architecture] = tmp_path / architecture
        folders[architecture].mkdir()
        (folders[architecture] / "config.json").write_text(
            json.dumps({"architectures": [architecture]})
        )
    flags = set(chain.ngram_args())
    for folder in folders.values():
        flags |= set(chain.server_args(str(folder), draft_attention_backend="triton"))
    assert flags == set(SPECULATIVE_FLAGS)
    assert set(LAUNCH_FLAGS) | set(SPECULATIVE_FLAGS) < set(RESERVED_FLAGS)


@pytest.mark.parametrize(
    ("key", "flag"),
    [
        ("host", "host"),
        ("hos", "host"),
        ("--h", "host"),
        ("po=1", "port"),
        ("api-k", "api_key"),
        ("trust_remote", "trust_remote_code"),
        ("speculative-draft-model", "speculative_draft_model_path"),
        ("attention_backend", None),
        ("hostname", None),
        ("ports", None),
        ("", None),
    ],
)
def test_a_key_is_reserved_when_argparse_would_read_it_as_a_flag_specbuild_sets(key, flag):
    assert reserved_flag(key) == flag


def test_the_prefix_rule_is_argparses():
    parser = argparse.ArgumentParser()
    for flag in RESERVED_FLAGS:
        parser.add_argument(cli_flag(flag))
    parser.add_argument("--attention-backend")
    for key in ("hos", "po", "conf", "trust-remote", "speculative-num-s"):
        parsed = vars(parser.parse_args([cli_flag(key), "x"]))
        assert [k for k, v in parsed.items() if v == "x"] == [reserved_flag(key)]


@pytest.mark.parametrize(
    ("value", "flag_like"),
    [("--host", True), ("-x", True), ([1, "--host"], True), ("-1", False), (-1, False)],
)
def test_a_value_starting_with_a_dash_reads_as_a_flag_unless_it_is_a_number(value, flag_like):
    assert flag_like_value(value) is flag_like
