"""The target stage's GGUF conversion: parsed once, the same bytes as parsing it three times."""

from __future__ import annotations

import os

import gguf
import pytest

from specbuild.target import _gguf_parsed_once, read_target_info, resolve_gguf

# SmolLM2-135M-Instruct.Q4_1.gguf dequantized to float32 by transformers 5.24.0 parsing the
# file once per use (before the cache): what the cached conversion must still write.
SMOLLM2_F32_WEIGHTS_SHA256 = "11d5b668dc68c6b6734fefd596ad685c106784aee5225c03ac95c3c72393e073"


@pytest.fixture
def converted(target_dir):
    """The test target's fingerprint, where this machine converted it from the GGUF."""
    if os.environ.get("SPECBUILD_TEST_TARGET"):
        pytest.skip("a target given from outside was not converted from the GGUF here")
    return read_target_info(target_dir / "fingerprint.json")


def test_gguf_parsed_once_shares_one_reader_and_restores_gguf(converted):
    path = resolve_gguf(converted.source)
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with _gguf_parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first  # one parse, whichever form the path takes
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
        assert "llama.block_count" in first.fields
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)


def test_cached_conversion_writes_the_same_weights(converted):
    assert converted.weights_sha256 == SMOLLM2_F32_WEIGHTS_SHA256
