"""A safetensors header read without its data (specbuild.infra.safetensors_header): a sound file
has no fault, and each way a file built elsewhere can be broken or hostile is one line that
says what, found by arithmetic on the header (a 2^62-byte claim allocates nothing)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from specbuild.infra.safetensors_header import header_faults


def _raw(path, header: dict, data: bytes = b"") -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.fixture
def sound(tmp_path):
    path = tmp_path / "model.safetensors"
    tensors = {"fc.weight": np.ones((4, 6), np.float32), "d2t": np.zeros(3, np.int64)}
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def test_a_file_the_library_wrote_has_no_fault(sound):
    assert header_faults(sound) == []


def test_a_truncated_copy_names_the_bytes_missing(sound):
    data = sound.read_bytes()
    sound.write_bytes(data[:-10])
    (fault,) = header_faults(sound)
    assert fault.startswith("its tensors declare 120 bytes of data, the file holds 110")
    assert "truncated" in fault


def test_a_header_claiming_2_to_the_62_bytes_is_refused_by_arithmetic(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 2**62) + b"{}")
    assert header_faults(path) == [
        f"its header claims {2**62:,} bytes, the file holds 2 after the length field: "
        "truncated, or not a safetensors file"
    ]


def test_offsets_beyond_the_file_and_extents_unlike_their_shape_are_named(tmp_path):
    path = tmp_path / "model.safetensors"
    huge = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 2**62]}}
    _raw(path, huge, b"\0" * 8)
    assert header_faults(path) == [
        f"tensor 'w': shape [2] of F32 is 8 bytes, its data_offsets span {2**62}"
    ]
    _raw(path, {"w": {"dtype": "F32", "shape": [2**31, 2**31], "data_offsets": [0, 2**64]}})
    assert header_faults(path)[0].startswith(f"its tensors declare {2**64:,} bytes of data")
    _raw(path, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)
    assert header_faults(path)[0].startswith(
        "its tensors declare 16 bytes of data, the file holds 8"
    )


def test_overlaps_gaps_unknown_dtypes_and_garbage_are_faults(tmp_path):
    path = tmp_path / "model.safetensors"
    two = {
        "a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]},
        "b": {"dtype": "F16", "shape": [2], "data_offsets": [2, 6]},
    }
    _raw(path, two, b"\0" * 6)
    assert "overlaps the one before" in header_faults(path)[0]
    _raw(path, {"a": {"dtype": "F16", "shape": [1], "data_offsets": [2, 4]}}, b"\0" * 4)
    assert "leaves a gap at byte 0" in header_faults(path)[0]
    _raw(path, {"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}, b"\0")
    assert header_faults(path) == ["tensor 'a': unknown dtype 'Q4'"]
    path.write_bytes(struct.pack("<Q", 3) + b"\xff\xfe[")
    assert header_faults(path) == [
        "its header is not JSON: not a safetensors file, or a corrupt one"
    ]
    path.write_bytes(b"\1\2")
    assert header_faults(path) == ["2 bytes: shorter than a safetensors header's length field"]
