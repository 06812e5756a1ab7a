"""Golden files: the bytes other tools read, compared whole against checked-in copies.

A hidden-state shard's safetensors header (every tensor's dtype, shape and data offsets, and
the string metadata) and an exported drafter's config.json are contracts with the trainer and
with SGLang (docs/DESIGN.md, "Names other tools rely on"); a change to either shows here as a
diff of the golden file, made on purpose with `SPECBUILD_WRITE_GOLDEN=1 pytest
tests/unit/test_golden.py` and reviewed, never as a silent drift.

Both are made by the real writers (`hidden.shards.write_shard` through the stage's shard
writer, `export_for_sglang` over a drafter saved as training saves it) on the tiny seeded
workspace of benchmarks/synthetic.py.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.synthetic import SyntheticSpec, make_workspace
from specbuild.drafter.build import build_drafter
from specbuild.drafter.config import TrainConfig
from specbuild.drafter.state import drafter_meta, save_drafter
from specbuild.export import export_for_sglang

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
WRITE = os.environ.get("SPECBUILD_WRITE_GOLDEN") == "1"
SPEC = SyntheticSpec(samples=4, seq_len=8, shards=1)


def _compare(name: str, got: dict) -> None:
    path = GOLDEN / name
    text = json.dumps(got, indent=2, sort_keys=True) + "\n"
    if WRITE:
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (SPECBUILD_WRITE_GOLDEN=1 rewrites it)"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict:
    return make_workspace(tmp_path_factory.mktemp("golden"), SPEC)


def _header(path: str) -> dict:
    """The safetensors header as written: 8 bytes of length, then JSON."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def test_a_hidden_shard_header_and_metadata_match_the_golden_file(workspace):
    header = _header(workspace["shards"][0])
    meta = header.pop("__metadata__")
    checksums = json.loads(meta.pop("checksums"))
    # The digests hash tensor bytes made by float math (randn, matmul, bf16 rounding) that may
    # round differently on another CPU: their algorithm and which tensors they cover are the
    # contract, not their values.
    got = {
        "tensors": header,
        "tensor_order": sorted(header, key=lambda k: header[k]["data_offsets"][0]),
        "metadata": meta,
        "checksums": {
            "algorithm": checksums["algorithm"],
            "keys": sorted(checksums["tensors"]),
            "has_layout_digest": bool(checksums.get("layout")),
        },
    }
    _compare("hidden_shard_header.json", got)


def test_an_exported_config_json_matches_the_golden_file(workspace, tmp_path):
    target = Path(workspace["target_fingerprint"]).parent
    cfg = TrainConfig()
    model, _ = build_drafter(cfg, target, workspace["vocab"], vocab_size=SPEC.vocab_size)
    layers = SimpleNamespace(
        layer_ids=workspace["layer_ids"], eagle_layer_ids=workspace["layer_ids"]
    )
    meta = drafter_meta(model, layers, "synthetic", target)
    save_drafter(tmp_path / "best.safetensors", model.export_state(), meta)
    export_for_sglang(
        checkpoint=tmp_path / "best.safetensors", out_dir=tmp_path / "drafter", dtype="bfloat16"
    )
    # Nothing in it varies (no path, time or version): compared whole.
    _compare("drafter_config.json", json.loads((tmp_path / "drafter" / "config.json").read_text()))
