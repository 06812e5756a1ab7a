"""The target stage's GGUF conversion: parsed once, the same bytes as parsing it three times."""

from __future__ import annotations

import os

import gguf
import pytest

from specbuild.eagle.target_info import read_target_info
from specbuild.target import _gguf_parsed_once, resolve_gguf

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


def test_a_remote_code_folder_without_the_key_stops_with_one_message_naming_it(
    tmp_path, kimi_layout_source
):
    from specbuild.target import RemoteCodeError, materialize_target

    out = tmp_path / "target"
    with pytest.raises(RemoteCodeError) as err:
        materialize_target(source=str(kimi_layout_source), name="k", out_dir=out)
    msg = str(err.value)
    assert "target.trust_remote_code: true" in msg and "\n" not in msg
    assert "tokenization_kimi_layout.py" in msg and "auto_map" in msg
    assert not (out / "fingerprint.json").exists()


def test_a_kimi_layout_folder_is_linked_with_its_code_and_tokenizer_files(
    kimi_layout_source, kimi_layout_target
):
    info = read_target_info(kimi_layout_target / "fingerprint.json")
    assert (info.trust_remote_code, info.weights_hash) == (True, "full")
    # the text model's shapes, from text_config, not the wrapper's config
    assert (info.hidden_size, info.vocab_size, info.num_hidden_layers) == (576, 49152, 30)
    for name in ("tokenization_kimi_layout.py", "configuration_kimi_layout.py", "tiktoken.model"):
        assert (kimi_layout_target / name).is_file(), name
    for shard in kimi_layout_source.glob("*.safetensors"):
        assert os.path.samefile(kimi_layout_target / shard.name, shard)  # linked, not copied


def test_a_folder_on_another_file_system_is_symlinked_never_copied(
    tmp_path, kimi_layout_source, monkeypatch
):
    from specbuild.target import materialize_target

    def cross_device(src, dst, **kwargs):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    out = tmp_path / "target"
    materialize_target(
        source=str(kimi_layout_source), name="k", out_dir=out, trust_remote_code=True
    )
    shards = sorted(out.glob("*.safetensors"))
    assert shards and all(s.is_symlink() for s in shards)
    assert all(s.resolve() == (kimi_layout_source / s.name).resolve() for s in shards)


def test_weights_above_the_threshold_get_a_sampled_hash_that_sees_headers_and_samples(
    tmp_path, monkeypatch
):
    import torch
    from safetensors.torch import save_file

    from specbuild import target

    path = tmp_path / "model.safetensors"
    # 4 MiB of data: 16 samples of 1 MiB overlap, and every byte sits in some sample
    save_file({"w": torch.zeros(1 << 20)}, str(path))
    full, how = target._weights_digest([path])
    assert how == "full"
    monkeypatch.setattr(target, "FULL_HASH_MAX_BYTES", 1000)
    sampled, how = target._weights_digest([path])
    assert how == "sampled" and sampled != full
    assert target._weights_digest([path]) == (sampled, "sampled")  # deterministic
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    assert target._weights_digest([path])[0] != sampled
    save_file({"v": torch.zeros(1 << 20)}, str(path))  # same bytes of data, another name
    assert target._weights_digest([path])[0] not in (sampled, full)


def test_a_hub_id_is_downloaded_to_the_hub_cache_once_and_linked(
    tmp_path, kimi_layout_source, monkeypatch
):
    """The hub's snapshot folder is symlinks into its blob store (no network here: a local one
    of that shape); the target folder links the blobs themselves."""
    import huggingface_hub

    from specbuild.target import HF_PATTERNS, materialize_target

    blobs, snap = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in kimi_layout_source.iterdir():
        blob = blobs / f"blob-{f.name}"
        os.link(f, blob)
        (snap / f.name).symlink_to(blob)
    calls = []

    def snapshot_download(repo_id, *, allow_patterns):
        calls.append((repo_id, allow_patterns))
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    out = tmp_path / "target"
    info = materialize_target(
        source="moonshot/kimi-layout", name="k", out_dir=out, trust_remote_code=True
    )
    # configs and code first (the remote-code check), then the weights
    assert (
        calls
        == [
            ("moonshot/kimi-layout", ["*.json", "*.py"]),
            ("moonshot/kimi-layout", list(HF_PATTERNS)),
        ]
        and "*.py" in HF_PATTERNS
    )
    assert info.source == "moonshot/kimi-layout"
    for f in snap.iterdir():
        assert os.path.samefile(out / f.name, blobs / f"blob-{f.name}"), f.name


def test_a_hub_id_needing_its_own_code_stops_before_its_weights_are_fetched(
    tmp_path, kimi_layout_source, monkeypatch
):
    import huggingface_hub

    from specbuild.target import RemoteCodeError, materialize_target

    calls = []

    def snapshot_download(repo_id, *, allow_patterns):
        calls.append(allow_patterns)
        return str(kimi_layout_source)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    with pytest.raises(RemoteCodeError, match="target.trust_remote_code: true"):
        materialize_target(source="moonshot/kimi-layout", name="k", out_dir=tmp_path / "t")
    assert calls == [["*.json", "*.py"]]  # never the safetensors


def _tiny_source(folder, tokenizer_dir):
    """A 2-layer random Llama with SmolLM2's tokenizer: an HF folder the test may rewrite."""
    from random_llama import write_random_llama

    return write_random_llama(
        folder,
        tokenizer_dir,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


def test_a_linked_weight_file_rewritten_in_place_stops_the_next_stage(tmp_path, target_dir):
    from specbuild.eagle.target_info import TargetChangedError
    from specbuild.target import materialize_target

    src = _tiny_source(tmp_path / "src", target_dir)
    out = tmp_path / "target"
    materialize_target(source=str(src), name="tiny", out_dir=out)
    read_target_info(out / "fingerprint.json")  # as fingerprinted: no complaint
    weights = src / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # the same inode, other bytes: what the link now serves
    weights.write_bytes(bytes(data) + b"\0")
    with pytest.raises(TargetChangedError) as err:
        read_target_info(out / "fingerprint.json")
    assert "model.safetensors" in str(err.value) and "--forcerun target" in str(err.value)


def test_remote_code_is_part_of_the_fingerprint(tmp_path, target_dir):
    from specbuild.target import materialize_target

    src = _tiny_source(tmp_path / "src", target_dir)
    plain = materialize_target(source=str(src), name="tiny", out_dir=tmp_path / "a")
    assert plain.code_sha256 == ""
    (src / "modeling_tiny.py").write_text("X = 1\n")
    one = materialize_target(source=str(src), name="tiny", out_dir=tmp_path / "b")
    (src / "modeling_tiny.py").write_text("X = 2\n")
    two = materialize_target(source=str(src), name="tiny", out_dir=tmp_path / "c")
    assert one.weights_sha256 == two.weights_sha256 == plain.weights_sha256
    assert len({plain.fingerprint, one.fingerprint, two.fingerprint}) == 3


def test_a_new_source_leaves_none_of_the_old_sources_files(tmp_path, target_dir):
    from specbuild.target import materialize_target

    first = _tiny_source(tmp_path / "first", target_dir)
    (first / "extra_notes.txt").write_text("from the first source\n")
    second = _tiny_source(tmp_path / "second", target_dir)
    out = tmp_path / "target"
    materialize_target(source=str(first), name="tiny", out_dir=out)
    assert (out / "extra_notes.txt").exists()
    materialize_target(source=str(second), name="tiny", out_dir=out)
    assert not (out / "extra_notes.txt").exists()
    read_target_info(out / "fingerprint.json")  # every file left is one fingerprinted


def test_a_rebuild_deletes_only_files_the_stage_builds_never_through_a_link(tmp_path, target_dir):
    from specbuild.target import materialize_target

    first = _tiny_source(tmp_path / "first", target_dir)
    (first / "extra_notes.txt").write_text("from the first source\n")
    out = tmp_path / "target"
    materialize_target(source=str(first), name="tiny", out_dir=out)
    big = tmp_path / "big"
    big.mkdir()
    (big / "shard.safetensors").write_bytes(b"kept")
    (out / "hidden").symlink_to(big, target_is_directory=True)
    (out / "report.html").write_text("<html>")
    (out / "serve.sh").write_text("#!/bin/sh\n")
    (out / "keep").mkdir()
    (out / "keep" / "config.json").write_text("{}")
    materialize_target(
        source=str(_tiny_source(tmp_path / "second", target_dir)), name="tiny", out_dir=out
    )
    assert not (out / "extra_notes.txt").exists()  # the earlier source's file
    assert (out / "hidden").is_symlink() and (big / "shard.safetensors").read_bytes() == b"kept"
    assert (out / "report.html").exists() and (out / "serve.sh").exists()
    assert (out / "keep" / "config.json").exists()


@pytest.mark.parametrize("name", ["..", ".", "", "a/b"])
def test_a_name_that_leaves_its_folder_deletes_nothing(tmp_path, name):
    from specbuild.target import materialize_target

    results = tmp_path / "results"
    (results / "target").mkdir(parents=True)
    (results / "report.html").write_text("<html>")
    with pytest.raises(ValueError, match="not a folder name"):
        materialize_target(
            source="gguf:/nowhere.gguf", name=name, out_dir=results / "target" / name
        )
    assert sorted(p.name for p in results.iterdir()) == ["report.html", "target"]


def test_a_target_folder_that_is_a_link_is_refused_before_anything_is_deleted(tmp_path):
    from specbuild.target import materialize_target

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("{}")
    out = tmp_path / "results" / "target" / "tiny"
    out.parent.mkdir(parents=True)
    out.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ValueError, match="is a symlink .*never works through a link"):
        materialize_target(source="gguf:/nowhere.gguf", name="tiny", out_dir=out)
    assert [p.name for p in elsewhere.iterdir()] == ["config.json"]
