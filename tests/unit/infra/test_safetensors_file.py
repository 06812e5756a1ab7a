"""Reproducible safetensors files (specbuild.infra.safetensors_file): the same tensors and
metadata give the same bytes, the metadata keys sorted in the header, and the file reads back
as written."""

from __future__ import annotations

import json

import torch
from safetensors import safe_open

from specbuild.infra.safetensors_file import save_tensors


def test_the_same_tensors_and_metadata_give_the_same_bytes_with_sorted_keys(tmp_path):
    meta = {f"key{i}": f'välue {i}\n"quoted"' for i in (5, 3, 9, 1, 7, 2)}
    tensors = {"b": torch.arange(6, dtype=torch.int64), "a": torch.ones(2, 3)}
    written = set()
    for i in range(4):
        save_tensors(tensors, tmp_path / f"{i}.safetensors", metadata=meta)
        written.add((tmp_path / f"{i}.safetensors").read_bytes())
    (raw,) = written
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    assert list(header["__metadata__"]) == sorted(meta)
    with safe_open(str(tmp_path / "0.safetensors"), framework="pt") as f:
        assert f.metadata() == meta
        assert torch.equal(f.get_tensor("b"), tensors["b"])
        assert torch.equal(f.get_tensor("a"), tensors["a"])
